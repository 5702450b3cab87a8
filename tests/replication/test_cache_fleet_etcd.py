"""A Quorum cache end to end: a real etcd, the control plane (its store in etcd, the
placer running) with the cache defined through its API at replication_factor 3, and
three brokers that joined through etcd (real QUIC, mutual TLS between peers, real
storage). Nothing sets a route by hand.

- puts and counter adds acknowledged by the leader survive its loss: the placer
  promotes a replica at a new generation, which serves the same values, versions
  and exact counter totals;
- a leader cut off from both its replicas (the test-mode fault file's
  ``peer_blocked``) answers ``quorum_timeout`` (outcome unknown), and the write it
  could not replicate is not served as acknowledged;
- every replica compacts its replication log below a snapshot, and a follower whose
  log lost the compacted records (its replica folder wiped, as a replaced disk)
  catches up from the leader's snapshot: the same entries, versions and counters;
  a restart of it then rebuilds them from its own snapshot and log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog
from felix_broker.chaos.faults import Faults, write_fault
from felix_broker.config import load_config
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot
from felix_broker.fleet.view import FleetView
from felix_broker.replication import cache as cache_replication
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_transport import default_impl
from felix_wire.messages import (
    CacheOk,
    CacheValue,
    CounterValue,
    Error,
)
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import etcd_control_plane, eventually, replica_set_placed
from ..support.wire import NS, TENANT
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


async def _stop(fleet: Fleet, node: str) -> None:
    """Stop the broker `node` runs now (a test may have replaced the one first started)."""
    await fleet.brokers[node].stop()


@asynccontextmanager
async def control_plane(tmp: Path, endpoint: str) -> AsyncIterator[None]:
    """The control plane on etcd with the Quorum cache (RF 3) created through its API."""
    cache = {"name": CACHE, "consistency": "Quorum", "replication_factor": 3}
    async with etcd_control_plane(tmp, endpoint, {"name": "plain"}, cache):
        yield


async def start_broker(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer
) -> Broker:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": endpoint,
        "node_lease_ttl_ms": 3000,
        "publish_quorum_timeout_ms": QUORUM_TIMEOUT_MS,
        "test_faults_file": str(faults_file(tmp, node_id)),
    }
    config = dataclasses.replace(
        load_config(environ={}, overrides=settings),
        catalog=StaticCatalog(streams=[PLAIN], caches=[SPEC]),
    )
    fleet = FleetNode(
        tls=PeerTls.issue(fleet_ca, node_id), view=FleetView(RoutingSnapshot(node_id=node_id))
    )
    broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
    await broker.start()
    return broker


def state(broker: Broker) -> tuple[dict[str, tuple[bytes, int]], dict[str, int]]:
    assert broker.cache is not None
    shard = broker.cache.shard(SPEC, 0)
    return (
        {k: (e.value, e.version) for k, e in shard.entries.items()},
        {k: c.total for k, c in shard.counters.items()},
    )


@asynccontextmanager
async def running(tmp: Path, endpoint: str) -> AsyncIterator[tuple[Fleet, str, int]]:
    """The control plane and three brokers; yields the fleet, the cache shard's leader
    (open) and its generation."""
    fleet = Fleet(tmp, endpoint)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(control_plane(tmp, endpoint))
        for node in NODES:
            fleet.brokers[node] = await start_broker(
                tmp, node, endpoint, fleet.fleet_ca, fleet.issuer
            )
            stack.push_async_callback(_stop, fleet, node)  # the broker then running

        route = await replica_set_placed(
            fleet.route, lambda leader: serving(fleet.brokers[leader]), NODES
        )
        assert sorted(route.replicas) == sorted(NODES)
        yield fleet, route.leader, route.generation


async def test_acked_puts_and_counter_adds_survive_the_leaders_loss(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, generation):
        followers = [n for n in NODES if n != leader]
        client, s = await fleet.session(leader)
        for i in range(6):
            assert await ask(s, put(f"k{i}", b"v%d" % i, i + 1)) == CacheOk(request_id=i + 1)
        total = 0
        for i, delta in enumerate([5, -2, 7, 1, 1, 10, -4, 3]):
            total += delta
            assert await ask(s, add("hits", delta, 100 + i)) == CounterValue(
                value=total, request_id=100 + i
            )
        client.close()
        # Counter adds through a follower: forwarded to the leader, acked there.
        client, s = await fleet.session(followers[0])
        for i in range(4):
            total += 2
            assert await ask(s, add("hits", 2, 200 + i)) == CounterValue(
                value=total, request_id=200 + i
            )
        client.close()
        want = state(fleet.brokers[leader])
        assert want[1] == {"hits": total}
        await eventually(
            lambda: all(state(fleet.brokers[n]) == want for n in followers),
            within=15,
            what="followers' cache state equals the leader's",
        )

        await fleet.brokers[leader].stop()  # revokes its lease: the placer acts at once

        def successor() -> str | None:
            route = fleet.route(followers[0])
            if route is None or route.generation <= generation or route.leader == leader:
                return None
            return route.leader if route.state is AssignmentState.ACTIVE else None

        await eventually(lambda: successor() is not None, within=30, what="a successor placed")
        new = successor()
        assert new in followers
        await eventually(lambda: serving(fleet.brokers[new]), within=15, what="successor open")
        client, s = await fleet.session(new)
        for i in range(6):
            answer = await ask(s, get(f"k{i}", i + 1))
            assert isinstance(answer, CacheValue) and answer.value == b"v%d" % i, answer
            assert answer.version == want[0][f"k{i}"][1]
        assert await ask(s, counter("hits", 50)) == CounterValue(value=total, request_id=50)
        assert await ask(s, add("hits", 1, 51)) == CounterValue(value=total + 1, request_id=51)
        client.close()


async def test_a_leader_cut_off_from_its_replicas_answers_quorum_timeout(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        followers = [n for n in NODES if n != leader]
        client, s = await fleet.session(leader)
        assert await ask(s, put("k", b"acked", 1)) == CacheOk(request_id=1)
        assert await ask(s, add("c", 3, 2)) == CounterValue(value=3, request_id=2)

        def length(node: str) -> int | None:
            replication = fleet.brokers[node].cache_replication
            driver = replication.driver(SHARD) if replication is not None else None
            return driver.replica.length if driver is not None else None

        # An ack needs only a majority: on a loaded machine one follower may still be a
        # ship behind; let both hold the acknowledged ops before the cut.
        await eventually(
            lambda: all(length(n) == length(leader) for n in followers),
            within=15,
            what="both followers hold the acknowledged ops",
        )
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        for message in (put("k", b"unacked", 3), add("c", 4, 4)):
            answer = await ask(s, message)
            assert isinstance(answer, Error), answer
            assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        # Not served as acknowledged: the leader's reads stop at the mark, and no
        # follower holds it (each holds the acknowledged ops in its replication log,
        # applied as far as the mark it last heard of).
        value = await ask(s, get("k", 5))
        assert isinstance(value, CacheValue) and value.value == b"acked", value
        assert await ask(s, counter("c", 6)) == CounterValue(value=3, request_id=6)
        held = fleet.brokers[leader].cache_replication
        assert held is not None
        driver = held.driver(SHARD)
        assert driver is not None and driver.replica.mark is not None
        acked_length = driver.replica.mark
        for node in followers:
            replica = fleet.brokers[node].cache_replication
            assert replica is not None
            follower = replica.driver(SHARD)
            assert follower is not None and follower.replica.length == acked_length
            entries, counters = state(fleet.brokers[node])
            assert entries["k"][0] == b"acked" and counters.get("c") in (None, 3)
        client.close()


def replica_folder(tmp: Path, node: str) -> Path:
    return tmp / node / "replication" / "@cache" / TENANT / NS / CACHE / "0"


def log_base(tmp: Path, node: str) -> int:
    """The offset the replica's replication log file starts at (0: never compacted)."""
    bases = [
        int(found.group(1))
        for path in replica_folder(tmp, node).glob("entries-*.log")
        if (found := re.fullmatch(r"entries-(\d+)-\d+-\d+\.log", path.name)) is not None
    ]
    return max(bases, default=0)


def state_or_none(broker: Broker) -> Any:
    try:
        return state(broker) if serving_or_following(broker) else None
    except Exception:  # not adopted yet
        return None


def serving_or_following(broker: Broker) -> bool:
    replication = broker.cache_replication
    return replication is not None and replication.driver(SHARD) is not None


async def test_a_follower_whose_log_lost_the_compacted_records_catches_up_from_a_snapshot(
    etcd_server: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_replication, "SNAPSHOT_EVERY", 16)
    monkeypatch.setattr(cache_replication, "COMPACT_EVERY", 8)
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        followers = [n for n in NODES if n != leader]
        rid = itertools.count(1)
        total = 0

        async def writes(count: int) -> None:
            nonlocal total
            client, s = await fleet.session(leader)
            for i in range(count):
                n = next(rid)
                if i % 3 == 0:
                    total += n
                    assert await ask(s, add("hits", n, n)) == CounterValue(
                        value=total, request_id=n
                    )
                else:
                    assert await ask(s, put(f"k{n % 11}", b"v%d" % n, n)) == CacheOk(request_id=n)
            client.close()

        await writes(90)
        await eventually(
            lambda: all(log_base(tmp_path, n) > 0 for n in NODES),
            within=20,
            what="every replica's replication log compacted below its snapshot",
        )
        lost = followers[0]
        await fleet.brokers[lost].stop()
        shutil.rmtree(replica_folder(tmp_path, lost))  # a replaced disk
        fleet.brokers[lost] = await start_broker(
            tmp_path, lost, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        await writes(10)  # the leader ships past the lost follower's empty log
        want = state(fleet.brokers[leader])
        assert want[1] == {"hits": total}
        await eventually(
            lambda: state_or_none(fleet.brokers[lost]) == want,
            within=40,
            what="the wiped follower's cache state equals the leader's",
        )
        replication = fleet.brokers[lost].cache_replication
        assert replication is not None and replication.snapshots_installed >= 1
        assert log_base(tmp_path, lost) > 0  # its log starts at the snapshot it was given

        # A restart of the rebuilt follower: its own snapshot and log give the same state.
        await fleet.brokers[lost].stop()
        fleet.brokers[lost] = await start_broker(
            tmp_path, lost, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        await writes(3)  # a follower learns the mark from the leader's next ship
        want = state(fleet.brokers[leader])
        await eventually(
            lambda: state_or_none(fleet.brokers[lost]) == want,
            within=30,
            what="the restarted follower rebuilt the same state",
        )
