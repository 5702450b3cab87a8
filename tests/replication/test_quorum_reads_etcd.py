"""FELIX_QUORUM_READS on a real fleet: etcd, the control plane (store in etcd, placer
running) with a Quorum cache at replication_factor 3, three brokers joined through
etcd (real QUIC, mutual TLS between peers, real storage).

- with ``majority`` and ``lease_free_reads`` finalized, gets and counter_gets (on the
  leader, and forwarded from a follower) are served once a majority read round
  confirmed the leader;
- a leader cut off from both its replicas (the fault file's ``peer_blocked``) answers
  such a read ``leadership_lost`` (the catalogue's retry class), while a broker on
  ``lease``, or on ``majority`` before the feature is finalized, still serves it under
  its lease (which etcd keeps renewing: the cut is of replication alone);
- a replica holding a newer generation than the asking leader fails the round.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog
from felix_broker.chaos.faults import Faults, write_fault
from felix_broker.config import load_config
from felix_broker.fleet.features import LEASE_FREE_READS
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import RoutingSnapshot
from felix_broker.fleet.view import FleetView
from felix_broker.replication.core import Fence
from felix_broker.replication.driver import ReplicaDriver
from felix_broker.replication.reads import ReadRounds
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import TokenVerifier
from felix_transport import default_impl
from felix_wire.errors import ErrorCode
from felix_wire.messages import CacheOk, CacheValue, CounterValue, Error
from tests.controlplane.support import call
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import etcd_control_plane, eventually, replica_set_placed
from .cache_support import (
    CACHE,
    PLAIN,
    QUORUM_TIMEOUT_MS,
    SHARD,
    SPEC,
    Fleet,
    add,
    ask,
    counter,
    get,
    put,
    serving,
)
from .support import faults_file

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(180)


async def start_broker(tmp: Path, node_id: str, fleet: Fleet, quorum_reads: str) -> Broker:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": fleet.endpoint,
        "node_lease_ttl_ms": 3000,
        "publish_quorum_timeout_ms": QUORUM_TIMEOUT_MS,
        "test_faults_file": str(faults_file(tmp, node_id)),
    }
    config = dataclasses.replace(
        load_config(environ={"FELIX_QUORUM_READS": quorum_reads}, overrides=settings),
        catalog=StaticCatalog(streams=[PLAIN], caches=[SPEC]),
    )
    node = FleetNode(
        tls=PeerTls.issue(fleet.fleet_ca, node_id),
        view=FleetView(RoutingSnapshot(node_id=node_id)),
    )
    broker = Broker(config, verifier=TokenVerifier(fleet.issuer.jwks()), fleet=node)
    await broker.start()
    return broker


def rounds(broker: Broker) -> ReadRounds:
    replication = broker.cache_replication
    assert replication is not None and replication.reads is not None
    return replication.reads


@asynccontextmanager
async def running(
    tmp: Path, endpoint: str, *, quorum_reads: str, finalize: bool
) -> AsyncIterator[tuple[Fleet, str]]:
    """Control plane, three brokers on `quorum_reads`, lease_free_reads finalized (and
    seen by every broker) if `finalize`; yields the fleet and the cache shard's leader."""
    fleet = Fleet(tmp, endpoint)
    cache = {"name": CACHE, "consistency": "Quorum", "replication_factor": 3}
    async with AsyncExitStack() as stack:
        admin_url, secret = await stack.enter_async_context(
            etcd_control_plane(tmp, endpoint, {"name": "plain"}, cache)
        )
        for node in NODES:
            fleet.brokers[node] = await start_broker(tmp, node, fleet, quorum_reads)
            stack.push_async_callback(fleet.brokers[node].stop)

        route = await replica_set_placed(
            fleet.route, lambda leader: serving(fleet.brokers[leader]), NODES
        )
        if finalize:
            status, answer = await call(
                "POST",
                f"{admin_url}/v1/fleet/features/{LEASE_FREE_READS}/finalize",
                token=secret,
            )
            assert status == 200 and answer["enabled"] is True, answer

            def enabled() -> bool:
                return all(
                    b.fleet_features is not None and b.fleet_features.is_enabled(LEASE_FREE_READS)
                    for b in fleet.brokers.values()
                )

            await eventually(enabled, within=15, what="lease_free_reads enabled everywhere")
        yield fleet, route.leader


MODES = [
    pytest.param("majority", True, id="majority-finalized"),
    pytest.param("lease", True, id="lease-finalized"),
    pytest.param("majority", False, id="majority-not-finalized"),
]


@pytest.mark.parametrize(("quorum_reads", "finalize"), MODES)
async def test_reads_of_a_cut_off_leader_by_read_mode(
    etcd_server: EtcdProcess, tmp_path: Path, quorum_reads: str, finalize: bool
) -> None:
    majority = quorum_reads == "majority" and finalize
    async with running(
        tmp_path, etcd_server.endpoint, quorum_reads=quorum_reads, finalize=finalize
    ) as (fleet, leader):
        followers = [n for n in NODES if n != leader]
        reads = rounds(fleet.brokers[leader])
        assert reads.active is majority
        client, s = await fleet.session(leader)
        assert await ask(s, put("k", b"v1", 1)) == CacheOk(request_id=1)
        assert await ask(s, add("c", 3, 2)) == CounterValue(value=3, request_id=2)

        # While the replica set answers, every mode serves the reads.
        before = reads.rounds
        value = await ask(s, get("k", 3))
        assert isinstance(value, CacheValue) and value.value == b"v1", value
        assert await ask(s, counter("c", 4)) == CounterValue(value=3, request_id=4)
        # Forwarded from a follower: confirmed on the leader the same way.
        other, fs = await fleet.session(followers[0])
        value = await ask(fs, get("k", 5))
        assert isinstance(value, CacheValue) and value.value == b"v1", value
        other.close()
        # A round ran per read with majority reads on, and none otherwise.
        assert reads.rounds - before == (3 if majority else 0)
        assert reads.failed == 0

        # Cut the leader off from both replicas (replication messages only).
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        for message in (get("k", 6), counter("c", 7)):
            answer = await ask(s, message)
            if majority:
                assert isinstance(answer, Error), answer
                lost = ErrorCode.LEADERSHIP_LOST
                assert (answer.code, answer.retry) == (lost.wire, lost.default_retry.wire)
                assert "no majority" in answer.message, answer
            else:  # the lease alone confirms it: still served
                assert not isinstance(answer, Error), answer
        assert reads.failed == (2 if majority else 0)
        assert fleet.route(leader).leader == leader  # its lease held: nobody replaced it

        # Healed: majority reads are served again.
        write_fault(faults_file(tmp_path, leader), Faults())
        await asyncio.sleep(0.3)
        value = await ask(s, get("k", 8))
        assert isinstance(value, CacheValue) and value.value == b"v1", value
        client.close()


async def test_a_replica_holding_a_newer_generation_fails_the_round(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint, quorum_reads="majority", finalize=True) as (
        fleet,
        leader,
    ):
        followers = [n for n in NODES if n != leader]
        client, s = await fleet.session(leader)
        assert await ask(s, put("k", b"v1", 1)) == CacheOk(request_id=1)

        def driver(node: str) -> ReplicaDriver:
            replication = fleet.brokers[node].cache_replication
            held = replication.driver(SHARD) if replication is not None else None
            assert held is not None
            return held

        own = driver(leader).replica

        def quiet() -> bool:
            return all(p.matched == own.length for p in own.progress()) and all(
                driver(n).replica.commit == own.commit for n in followers
            )

        await eventually(quiet, within=15, what="the replica set caught up and told the mark")
        await asyncio.sleep(0.5)  # a few ticks: nothing left to ship while idle
        assert quiet() and own.accepts_writes
        # Both followers take a fence at a newer generation, as from a candidate the
        # placer promoted (the core's own input; its answer goes to a node with no
        # outbox and is dropped). The idle old leader ships nothing, so it has not
        # heard: only its read round finds out.
        newer = own.generation + 1000
        for node in followers:
            await driver(node).receive(Fence(newer, "node-elsewhere"))
            assert driver(node).replica.generation == newer
        answer = await ask(s, get("k", 2))
        assert isinstance(answer, Error) and answer.code == "leadership_lost", answer
        assert f"holds generation {newer}" in answer.message, answer
        client.close()


async def test_concurrent_reads_share_rounds(etcd_server: EtcdProcess, tmp_path: Path) -> None:
    async with running(tmp_path, etcd_server.endpoint, quorum_reads="majority", finalize=True) as (
        fleet,
        leader,
    ):
        client, s = await fleet.session(leader)
        assert await ask(s, put("k", b"v1", 1)) == CacheOk(request_id=1)
        reads = rounds(fleet.brokers[leader])
        before = reads.rounds
        count = 20
        for rid in range(100, 100 + count):
            await s.send(get("k", rid))
        answers = []
        async with asyncio.timeout(20):
            for _ in range(count):
                answers.append(await s.recv())
        assert sorted(a.request_id for a in answers) == list(range(100, 100 + count))
        assert all(isinstance(a, CacheValue) and a.value == b"v1" for a in answers), answers
        # One round running and one queued per shard: pipelined reads join the queued
        # round instead of each running its own.
        assert 1 <= reads.rounds - before < count
        client.close()
