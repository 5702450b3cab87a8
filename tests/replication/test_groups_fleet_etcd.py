"""Consumer groups of a Quorum stream end to end: a real etcd, the control plane (its
store in etcd, the placer running) with the stream defined through its API at
replication_factor 3, and three brokers that joined through etcd (real QUIC, mutual
TLS between peers, real storage). Nothing sets a route by hand.

- acks and a dead-letter move acknowledged by the leader survive its loss: the
  promoted leader delivers only the unacknowledged records, lists the dead letter,
  and takes settles at once;
- a leader cut off from both its replicas (the test-mode fault file's
  ``peer_blocked``) answers a group ack and a dead-letter move with
  ``quorum_timeout`` (outcome unknown), and no replica holds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.chaos.faults import Faults, write_fault
from felix_broker.fleet.routing import AssignmentState
from felix_broker.groups.records import GroupDurable, apply_change, decode_change
from felix_common.etcd_process import EtcdProcess
from felix_wire.messages import (
    CacheOk,
    Error,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetterList,
    GroupDeadLetters,
    GroupPoll,
    GroupRecords,
)
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import eventually, replica_set_placed
from ..support.wire import NS, TENANT
from .support import (
    SHARD,
    SPEC,
    STREAM,
    Fleet,
    ask,
    control_plane,
    faults_file,
    publish_all,
    serving,
    start_broker_with_faults,
)

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(180)

GROUP = "workers"


def poll(rid: int, max_records: int = 100, wait_ms: int = 0) -> GroupPoll:
    return GroupPoll(
        tenant_id=TENANT,
        namespace=NS,
        stream=STREAM,
        shard=0,
        group=GROUP,
        max_records=max_records,
        wait_ms=wait_ms,
        request_id=rid,
    )


def ack(offset: int, rid: int) -> GroupAck:
    return GroupAck(
        tenant_id=TENANT,
        namespace=NS,
        stream=STREAM,
        shard=0,
        group=GROUP,
        offset=offset,
        request_id=rid,
    )


def dead_letter(offset: int, rid: int) -> GroupDeadLetter:
    return GroupDeadLetter(
        tenant_id=TENANT,
        namespace=NS,
        stream=STREAM,
        shard=0,
        group=GROUP,
        offset=offset,
        request_id=rid,
    )


def dead_letters(rid: int) -> GroupDeadLetters:
    return GroupDeadLetters(
        tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, group=GROUP, request_id=rid
    )


@asynccontextmanager
async def running(tmp: Path, endpoint: str) -> AsyncIterator[tuple[Fleet, str, int]]:
    """The control plane and three brokers; yields the fleet, the stream shard's
    leader (open) and its generation."""
    fleet = Fleet(tmp)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(control_plane(tmp, endpoint))
        for node in NODES:
            fleet.brokers[node] = await start_broker_with_faults(
                tmp, node, endpoint, fleet.fleet_ca, fleet.issuer
            )
            stack.push_async_callback(fleet.brokers[node].stop)

        route = await replica_set_placed(
            fleet.route, lambda leader: serving(fleet.brokers[leader]), NODES
        )
        assert sorted(route.replicas) == sorted(NODES)
        yield fleet, route.leader, route.generation


def offsets(answer: Any) -> list[int]:
    assert isinstance(answer, GroupRecords), answer
    return [r.offset for r in answer.records]


async def test_acked_group_settles_survive_the_leaders_loss(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, generation):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(10)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == list(range(10))
        for rid, offset in enumerate([0, 1, 2, 3, 4, 7], start=10):
            assert await ask(s, ack(offset, rid)) == CacheOk(request_id=rid)
        assert await ask(s, dead_letter(8, 20)) == CacheOk(request_id=20)
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
        client, s = await fleet.session(new)
        # Only what was not acknowledged: 5, 6 and 9 (0-4 and 7 acked, 8 dead-lettered).
        assert offsets(await ask(s, poll(30))) == [5, 6, 9]
        assert await ask(s, dead_letters(31)) == GroupDeadLetterList(offsets=[8], request_id=31)
        for rid, offset in enumerate([5, 6, 9], start=40):
            assert await ask(s, ack(offset, rid)) == CacheOk(request_id=rid)
        assert offsets(await ask(s, poll(50))) == []
        client.close()
        # The acknowledgements at the new generation reached the remaining follower too.
        other = next(n for n in followers if n != new)
        await eventually(
            lambda: durable_state(fleet.brokers[other]) == (10, {8}),
            within=15,
            what="the follower's group log at cursor 10 with dead letter 8",
        )


def durable_state(broker: Broker) -> tuple[int | None, set[int]]:
    """The group's cursor and dead letters as this replica's group log holds them."""
    groups = broker.groups
    assert groups is not None
    log = groups._shard_groups(SPEC, 0).log
    durable: dict[str, GroupDurable] = {}
    for record in log.read(log.start_offset, max_records=10_000, max_bytes=1 << 24):
        apply_change(durable, decode_change(record.payload))
    state = durable.get(GROUP)
    return (state.cursor, state.dead) if state is not None else (None, set())


async def test_a_partitioned_leaders_group_settles_answer_quorum_timeout(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(4)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == [0, 1, 2, 3]
        assert await ask(s, ack(0, 2)) == CacheOk(request_id=2)
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        for message in (ack(1, 3), dead_letter(2, 4)):
            answer = await ask(s, message)
            assert isinstance(answer, Error), answer
            assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        client.close()
        # No follower holds them: each replication log ends at the leader's mark.
        replication = fleet.brokers[leader].replication
        assert replication is not None
        driver = replication.driver(SHARD)
        assert driver is not None and driver.replica.mark is not None
        for node in followers:
            held = fleet.brokers[node].replication
            assert held is not None
            follower = held.driver(SHARD)
            assert follower is not None and follower.replica.length == driver.replica.mark
            # Applied as far as the mark it last heard of: at most the first ack.
            assert durable_state(fleet.brokers[node]) in ((None, set()), (0, set()), (1, set()))


async def test_a_settle_the_leader_failed_to_replicate_is_never_answered_ok_when_repeated(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """Issue 19: an ack whose replicated write failed (here quorum_timeout; in the
    chaos run the leader's replica stopped on an fsync failure) had been taken by the
    leader's in-memory group state already, so the client's resend of that ack was
    answered ok with nothing written, and a later leader handed the record out again.
    The resend must be replicated again (and fail again while the fault lasts)."""
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(4)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == [0, 1, 2, 3]
        assert await ask(s, ack(0, 2)) == CacheOk(request_id=2)
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        for rid in (3, 4, 5):  # the ack, then the client's resends of it
            answer = await ask(s, ack(1, rid))
            assert isinstance(answer, Error), answer
            assert answer.code in ("quorum_timeout", "shard_unavailable"), answer
        client.close()
        for node in NODES:  # nobody holds an ack of 1 (cursor 1 once 0 is acked)
            assert durable_state(fleet.brokers[node])[0] in (None, 0, 1)


async def test_a_leader_whose_replica_stopped_serves_no_group_request(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """Issue 19: after an fsync failure stopped the leader's replica, it still served
    group polls (claims it could never settle: every ack refused)."""
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(4)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == [0, 1, 2, 3]
        write_fault(faults_file(tmp_path, leader), Faults(fail=True))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        replication = fleet.brokers[leader].replication
        assert replication is not None
        driver = replication.driver(SHARD)
        assert driver is not None
        for offset in range(3):  # a periodic fsync fails; the next write stops it
            await ask(s, ack(offset, 10 + offset))
            await asyncio.sleep(0.3)  # periodic fsyncs run every 100 ms
            if driver.failure is not None:
                break
        assert driver.failure is not None
        for message in (poll(300), ack(3, 301)):
            answer = await ask(s, message)
            assert isinstance(answer, Error) and answer.code == "shard_unavailable", answer
        client.close()


async def test_a_restarted_follower_keeps_the_group_and_applies_what_it_missed(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, _generation):
        follower = next(n for n in NODES if n != leader)
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(6)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == list(range(6))
        assert await ask(s, ack(0, 2)) == CacheOk(request_id=2)
        assert await ask(s, ack(2, 3)) == CacheOk(request_id=3)
        await eventually(
            lambda: durable_state(fleet.brokers[follower]) == (1, set()),
            within=15,
            what="the follower's group log at cursor 1",
        )
        await fleet.brokers[follower].stop()
        # Settled while the follower is away: it catches up from the leader's log.
        assert await ask(s, ack(1, 4)) == CacheOk(request_id=4)
        assert await ask(s, dead_letter(4, 5)) == CacheOk(request_id=5)
        client.close()
        again = await start_broker_with_faults(
            tmp_path, follower, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        fleet.brokers[follower] = again
        try:
            await _caught_up(fleet, follower)
        finally:
            await again.stop()


async def _caught_up(fleet: Fleet, follower: str) -> None:
    await eventually(
        lambda: durable_state(fleet.brokers[follower]) == (3, {4}),
        within=30,
        what="the restarted follower's group log at cursor 3 with dead letter 4",
    )
    replication = fleet.brokers[follower].replication
    assert replication is not None
    driver = replication.driver(SHARD)
    assert driver is not None and driver.refusal() is not None  # still a follower


async def test_every_replicas_group_log_compacts_and_a_successor_serves_the_committed_group(
    etcd_server: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small group logs: every replica compacts its group log of the Quorum shard (to
    the committed state), and the successor after the leader's loss serves the group
    from its compacted log: the same cursor, acks and dead letters."""
    from felix_broker.groups import service as group_service

    small = group_service.GroupServiceLimits(
        upkeep_interval=0.1, segment_bytes=256, compact_min_bytes=512
    )
    monkeypatch.setattr(group_service, "GroupServiceLimits", lambda: small)
    async with running(tmp_path, etcd_server.endpoint) as (fleet, leader, generation):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r%d" % i for i in range(60)])
        client, s = await fleet.session(leader)
        assert offsets(await ask(s, poll(1))) == list(range(60))
        assert await ask(s, dead_letter(30, 2)) == CacheOk(request_id=2)
        for rid, offset in enumerate([o for o in range(55) if o != 30], start=10):
            assert await ask(s, ack(offset, rid)) == CacheOk(request_id=rid)
        client.close()

        def compacted(node: str) -> bool:
            groups = fleet.brokers[node].groups
            assert groups is not None
            return groups._shard_groups(SPEC, 0).log.start_offset > 0

        await eventually(
            lambda: (
                all(compacted(n) for n in NODES)
                and all(durable_state(fleet.brokers[n]) == (55, {30}) for n in NODES)
            ),
            within=20,
            what="every replica's group log compacted, at cursor 55 with dead letter 30",
        )
        await fleet.brokers[leader].stop()

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
        assert offsets(await ask(s, poll(100))) == [55, 56, 57, 58, 59]
        assert await ask(s, dead_letters(101)) == GroupDeadLetterList(offsets=[30], request_id=101)
        client.close()
