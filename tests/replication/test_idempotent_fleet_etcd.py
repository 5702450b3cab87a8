"""Idempotent producers on a Quorum stream end to end: a real etcd, the control plane
(the stream defined through its API at replication_factor 3, the placer running) and
three brokers that joined through etcd (real QUIC, mutual TLS between peers, real
storage). Every replica judges an idempotent batch against its producer table where
the batch falls in the replicated log (decision quorum-idempotent-producers), so:

- batches (JSON and binary 0x0100) accepted, a resend answered with the original
  offset and written once, a sequence gap refused ``sequence_gap {expected}``, a
  reused sequence refused ``sequence_reused``; every replica's stream log and
  producer marks are the same;
- a batch the leader acknowledged, resent to the promoted successor after the
  leader's loss, lands once (exactly once across failover), and the producer goes on;
- a leader cut off from both replicas (``peer_blocked``) answers ``quorum_timeout``
  (outcome unknown) and no follower holds the batch;
- a follower restarted past refused idempotent batches reopens and catches up (its
  restart walk tells an applied batch from a refused one by the stream log).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.app import Broker
from felix_broker.chaos.faults import Faults, write_fault
from felix_broker.fleet.routing import AssignmentState
from felix_broker.streams.producers import payload_digest
from felix_common.etcd_process import EtcdProcess
from felix_wire.binary import BinaryAckMode, PublishBatchFrame
from felix_wire.messages import (
    PublishError,
    PublishOk,
    PublishRefusal,
    PublishRefused,
    SequenceGap,
)
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import eventually
from .support import (
    BASE,
    IDEMPOTENT_FEATURES,
    SHARD,
    SPEC,
    ask,
    batch,
    faults_file,
    payloads,
    producer,
    publish_all,
    running_quorum_fleet,
    same_everywhere,
    serving,
    session,
    start_broker_with_faults,
)

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(180)


def marks(broker: Broker) -> list[tuple[int, int, int, int]]:
    """(offset, producer, sequence, digest) of every producer mark this replica stores."""
    assert broker.engine is not None
    log = broker.engine.shard(SPEC, 0).log
    assert log is not None
    return [
        (offset, ext.producer.producer_id, ext.producer.sequence, ext.producer.digest)
        for offset, _n, ext in log.extensions()
        if ext.producer is not None
    ]


async def test_idempotent_batches_on_a_quorum_stream_are_deduplicated_on_every_replica(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0"])
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        assert await ask(s, batch(pid, 0, [b"a0", b"a1"], 2)) == PublishOk(request_id=2, offset=1)
        assert await ask(s, batch(pid, 1, [b"b"], 3)) == PublishOk(request_id=3, offset=3)
        # A resend of sequence 0: the original offset, nothing written.
        assert await ask(s, batch(pid, 0, [b"a0", b"a1"], 4)) == PublishOk(request_id=4, offset=1)
        gap = await ask(s, batch(pid, 5, [b"gap"], 5))
        assert isinstance(gap, PublishRefused), gap
        assert gap.reason == PublishRefusal(sequence_gap=SequenceGap(expected=2))
        reused = await ask(s, batch(pid, 1, [b"other"], 6))
        assert isinstance(reused, PublishRefused) and reused.reason == "sequence_reused", reused
        unknown = await ask(s, batch(pid + 1, 3, [b"who"], 7))
        assert isinstance(unknown, PublishRefused) and unknown.reason == "unknown_producer"
        # Two resends racing the original on two streams: still written once.
        other = await client.session(features=IDEMPOTENT_FEATURES)
        await s.send(batch(pid, 2, [b"c"], 8))
        await other.send(batch(pid, 2, [b"c"], 8))
        answers = [await s.recv(timeout=20), await other.recv(timeout=20)]
        assert answers == [PublishOk(request_id=8, offset=4)] * 2, answers
        # A binary idempotent frame (0x0100) rides the same path, answered in JSON.
        frame = PublishBatchFrame(
            request_id=9,
            ack_mode=BinaryAckMode.PER_BATCH,
            producer_id=pid,
            sequence=3,
            tenant_id=BASE["tenant_id"],
            namespace=BASE["namespace"],
            stream=BASE["stream"],
            payloads=[b"bin"],
        )
        for _resend in range(2):
            await s.send(frame)
            assert await s.recv(timeout=20) == PublishOk(request_id=9, offset=5)
        client.close()

        await same_everywhere(fleet, [b"r0", b"a0", b"a1", b"b", b"c", b"bin"])
        want = [
            (1, pid, 0, payload_digest([b"a0", b"a1"])),
            (3, pid, 1, payload_digest([b"b"])),
            (4, pid, 2, payload_digest([b"c"])),
            (5, pid, 3, payload_digest([b"bin"])),
        ]
        for broker in fleet.brokers.values():
            assert marks(broker) == want
            assert broker.engine is not None
            table = broker.engine.shard(SPEC, 0).marks.producers
            assert table.next_sequence(pid) == 4


async def test_a_batch_acked_by_the_old_leader_lands_once_after_failover(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        generation,
    ):
        followers = [n for n in NODES if n != leader]
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        assert await ask(s, batch(pid, 0, [b"x0"], 2)) == PublishOk(request_id=2, offset=0)
        assert await ask(s, batch(pid, 1, [b"x1", b"x2"], 3)) == PublishOk(request_id=3, offset=1)
        client.close()

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
        client, s = await session(fleet, new)
        # The producer did not see the ack of sequence 1: it resends it to the successor.
        assert await ask(s, batch(pid, 1, [b"x1", b"x2"], 4)) == PublishOk(request_id=4, offset=1)
        assert await ask(s, batch(pid, 0, [b"x0"], 5)) == PublishOk(request_id=5, offset=0)
        assert await ask(s, batch(pid, 2, [b"x3"], 6)) == PublishOk(request_id=6, offset=3)
        client.close()
        remaining = [fleet.brokers[n] for n in followers]
        await eventually(
            lambda: all(payloads(b) == [b"x0", b"x1", b"x2", b"x3"] for b in remaining),
            within=15,
            what="both remaining replicas hold each batch once",
        )
        for broker in remaining:
            assert [m[:3] for m in marks(broker)] == [(0, pid, 0), (1, pid, 1), (3, pid, 2)]


async def test_a_partitioned_leader_answers_quorum_timeout_for_idempotent_batches(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        followers = [n for n in NODES if n != leader]
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        assert await ask(s, batch(pid, 0, [b"in"], 2)) == PublishOk(request_id=2, offset=0)
        await same_everywhere(fleet, [b"in"])
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        answer = await ask(s, batch(pid, 1, [b"cut-off"], 3))
        assert isinstance(answer, PublishError), answer
        assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        client.close()
        for node in followers:
            assert payloads(fleet.brokers[node]) == [b"in"]
            assert [m[:3] for m in marks(fleet.brokers[node])] == [(0, pid, 0)]


async def test_a_restarted_follower_reopens_past_refused_idempotent_batches(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        follower = next(n for n in NODES if n != leader)
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        assert await ask(s, batch(pid, 0, [b"p0"], 2)) == PublishOk(request_id=2, offset=0)
        # Two payloads each: a walk counting a refused batch as records could not reopen.
        assert await ask(s, batch(pid, 0, [b"p0"], 3)) == PublishOk(request_id=3, offset=0)
        gap = await ask(s, batch(pid, 4, [b"g0", b"g1"], 4))
        assert isinstance(gap, PublishRefused), gap
        assert await ask(s, batch(pid, 1, [b"p1", b"p2"], 5)) == PublishOk(request_id=5, offset=1)
        await same_everywhere(fleet, [b"p0", b"p1", b"p2"])
        await fleet.brokers[follower].stop()
        assert await ask(s, batch(pid, 1, [b"p1", b"p2"], 6)) == PublishOk(request_id=6, offset=1)
        assert await ask(s, batch(pid, 2, [b"p3"], 7)) == PublishOk(request_id=7, offset=3)
        client.close()
        again = await start_broker_with_faults(
            tmp_path, follower, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        fleet.brokers[follower] = again
        try:
            await eventually(
                lambda: payloads(again) == [b"p0", b"p1", b"p2", b"p3"],
                within=30,
                what="the restarted follower caught up",
            )
            replication = again.replication
            assert replication is not None
            driver = replication.driver(SHARD)
            assert driver is not None and driver.failure is None
            assert [m[:3] for m in marks(again)] == [(0, pid, 0), (1, pid, 1), (3, pid, 2)]
        finally:
            await again.stop()
