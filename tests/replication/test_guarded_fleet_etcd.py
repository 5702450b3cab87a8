"""publish_if and commit on a Quorum stream end to end: a real etcd, the control
plane (its store in etcd, the placer running; atomic_commit finalized through its
admin API) with the stream defined through its API at replication_factor 3, and
three brokers that joined through etcd (real QUIC, mutual TLS between peers, real
storage). Nothing sets a route by hand. Every replica's stream log is checked.

- publish_if accepted at the tail, refused offset_mismatch when the tail moved (and
  of two racing for one offset exactly one wins); nothing refused is on any replica;
- commit with and without expected_offset: the event on every replica, the state
  changes in every replica's state view, a refused one nowhere;
- a guarded write acknowledged by the leader survives its loss: the successor holds
  it, serves its state, and judges the next condition against the same log;
- a leader cut off from both its replicas (the fault file's ``peer_blocked``)
  answers a guarded write with ``quorum_timeout`` (outcome unknown), and no
  follower's replication log holds it;
- until the fleet finalized ``replicated_conditions``, publish_if, commit and
  publish_idempotent to the Quorum stream are refused ``invalid_request`` (nothing
  written, plain publishes served), and served once it is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.chaos.faults import Faults, write_fault
from felix_broker.fleet.features import ATOMIC_COMMIT, REPLICATED_CONDITIONS
from felix_broker.fleet.routing import AssignmentState
from felix_broker.storage.format import CommitMark, StoredChange
from felix_common.etcd_process import EtcdProcess
from felix_wire.messages import (
    Commit,
    CommitOk,
    Error,
    OffsetMismatch,
    PublishError,
    PublishIf,
    PublishOk,
    PublishRefusal,
    PublishRefused,
    StateChangeDelete,
    StateChangePut,
    StateGet,
    StateValue,
)
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import eventually
from .support import (
    BASE,
    SHARD,
    SPEC,
    ask,
    batch,
    faults_file,
    finalize_feature,
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

ENTITY = b"account-1"


def publish_if(payloads: list[bytes], expected: int, rid: int) -> PublishIf:
    return PublishIf(**BASE, payloads=payloads, expected_offset=expected, request_id=rid)


def commit(event: bytes, changes: list[Any], rid: int, expected: int | None = None) -> Commit:
    return Commit(
        **BASE,
        entity_key=ENTITY,
        event=event,
        changes=changes,
        request_id=rid,
        expected_offset=expected,
    )


def mismatch(rid: int, tail: int) -> Any:
    return PublishRefusal(offset_mismatch=OffsetMismatch(tail=tail))


def commits(broker: Broker) -> list[tuple[int, CommitMark]]:
    """The commit marks this replica's stream log stores, by offset."""
    assert broker.engine is not None
    log = broker.engine.shard(SPEC, 0).log
    assert log is not None
    return [(offset, ext.commit) for offset, _n, ext in log.extensions() if ext.commit]


def state(broker: Broker, key: str) -> tuple[bytes | None, int | None]:
    assert broker.engine is not None
    read = broker.engine.shard(SPEC, 0).marks.state.get(ENTITY, key)
    return read.value, read.version


async def test_publish_if_and_commit_on_a_quorum_stream_are_judged_against_the_replicated_log(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0", b"r1"])
        client, s = await fleet.session(leader)
        assert await ask(s, publish_if([b"if-a", b"if-b"], 2, 1)) == PublishOk(
            request_id=1, offset=2
        )
        refused = await ask(s, publish_if([b"late"], 2, 2))
        assert refused == PublishRefused(
            request_id=2, reason=mismatch(2, 4), message=refused.message
        )
        # Two racing for offset 4 on two streams: exactly one wins, the other sees 5.
        other = await client.session()
        await s.send(publish_if([b"race-s"], 4, 3))
        await other.send(publish_if([b"race-o"], 4, 3))
        answers = [await s.recv(timeout=20), await other.recv(timeout=20)]
        won = [a for a in answers if isinstance(a, PublishOk)]
        lost = [a for a in answers if isinstance(a, PublishRefused)]
        assert len(won) == 1 and won[0].offset == 4 and len(lost) == 1, answers
        assert lost[0].reason == mismatch(3, 5)
        winner = b"race-s" if answers[0] is won[0] else b"race-o"

        # Commits: unconditional, conditional at the tail, conditional on a stale tail.
        opened = [StateChangePut(key="balance", value=b"10"), StateChangePut(key="tmp", value=b"")]
        assert await ask(s, commit(b"opened", opened, 4)) == CommitOk(request_id=4, offset=5)
        moved = [StateChangePut(key="balance", value=b"7"), StateChangeDelete(key="tmp")]
        assert await ask(s, commit(b"moved", moved, 5, expected=6)) == CommitOk(
            request_id=5, offset=6
        )
        stale = await ask(s, commit(b"stale", [StateChangePut(key="balance", value=b"0")], 6, 6))
        assert isinstance(stale, PublishRefused) and stale.reason == mismatch(6, 7), stale
        answer = await ask(s, StateGet(**BASE, entity_key=ENTITY, key="balance", request_id=7))
        assert answer == StateValue(value=b"7", version=6, as_of=6, request_id=7)
        client.close()

        want = [b"r0", b"r1", b"if-a", b"if-b", winner, b"opened", b"moved"]
        await same_everywhere(fleet, want)
        want_marks = [
            (5, CommitMark(ENTITY, (StoredChange("balance", b"10"), StoredChange("tmp", b"")))),
            (6, CommitMark(ENTITY, (StoredChange("balance", b"7"), StoredChange("tmp", None)))),
        ]
        for broker in fleet.brokers.values():
            assert commits(broker) == want_marks
            assert state(broker, "balance") == (b"7", 6)
            assert state(broker, "tmp") == (None, None)


async def test_a_guarded_write_survives_the_leaders_loss(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        generation,
    ):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0"])
        client, s = await fleet.session(leader)
        assert await ask(s, publish_if([b"guarded"], 1, 1)) == PublishOk(request_id=1, offset=1)
        put = [StateChangePut(key="owner", value=b"alice")]
        assert await ask(s, commit(b"claimed", put, 2, expected=2)) == CommitOk(
            request_id=2, offset=2
        )
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
        assert payloads(fleet.brokers[new]) == [b"r0", b"guarded", b"claimed"]
        client, s = await fleet.session(new)
        answer = await ask(s, StateGet(**BASE, entity_key=ENTITY, key="owner", request_id=3))
        assert answer == StateValue(value=b"alice", version=2, as_of=2, request_id=3)
        # The next condition is judged against the same log on the successor.
        refused = await ask(s, commit(b"stolen", [StateChangePut(key="owner", value=b"eve")], 4, 2))
        assert isinstance(refused, PublishRefused) and refused.reason == mismatch(4, 3), refused
        assert await ask(s, publish_if([b"next"], 3, 5)) == PublishOk(request_id=5, offset=3)
        client.close()
        remaining = {n: fleet.brokers[n] for n in followers}
        await eventually(
            lambda: all(
                payloads(b) == [b"r0", b"guarded", b"claimed", b"next"] for b in remaining.values()
            ),
            within=15,
            what="both remaining replicas hold the guarded writes",
        )
        for broker in remaining.values():
            assert state(broker, "owner") == (b"alice", 2)


async def test_a_partitioned_leader_answers_quorum_timeout_for_guarded_writes(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        followers = [n for n in NODES if n != leader]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0"])
        await same_everywhere(fleet, [b"r0"])
        client, s = await fleet.session(leader)
        write_fault(faults_file(tmp_path, leader), Faults(peer_blocked=frozenset(followers)))
        await asyncio.sleep(0.3)  # the fault file is reread within 50 ms
        put = [StateChangePut(key="owner", value=b"bob")]
        for message in (publish_if([b"cut-off"], 1, 1), commit(b"cut", put, 2, expected=1)):
            answer = await ask(s, message)
            assert isinstance(answer, Error), answer
            assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        client.close()
        replication = fleet.brokers[leader].replication
        assert replication is not None
        driver = replication.driver(SHARD)
        assert driver is not None and driver.replica.mark is not None
        for node in followers:
            held = fleet.brokers[node].replication
            assert held is not None
            follower = held.driver(SHARD)
            assert follower is not None and follower.replica.length == driver.replica.mark
            assert payloads(fleet.brokers[node]) == [b"r0"]
            assert state(fleet.brokers[node], "owner") == (None, None)


async def test_a_restarted_follower_reopens_past_refused_guarded_batches(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """A refused guarded batch is a no-op entry of the replication log: a follower that
    applied one reopens (its restart walk counts it as no records) and catches up."""
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        follower = next(n for n in NODES if n != leader)
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0"])
        client, s = await fleet.session(leader)
        # Two payloads: a walk counting the refused batch as records could not reopen.
        refused = await ask(s, publish_if([b"stale-a", b"stale-b"], 0, 1))
        assert isinstance(refused, PublishRefused) and refused.reason == mismatch(1, 1)
        assert await ask(s, publish_if([b"fits"], 1, 2)) == PublishOk(request_id=2, offset=1)
        await same_everywhere(fleet, [b"r0", b"fits"])
        await fleet.brokers[follower].stop()
        refused = await ask(s, commit(b"stale", [], 3, expected=1))
        assert isinstance(refused, PublishRefused) and refused.reason == mismatch(3, 2)
        assert await ask(s, commit(b"while-away", [], 4, expected=2)) == CommitOk(
            request_id=4, offset=2
        )
        client.close()
        again = await start_broker_with_faults(
            tmp_path, follower, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        fleet.brokers[follower] = again
        try:
            await eventually(
                lambda: payloads(again) == [b"r0", b"fits", b"while-away"],
                within=30,
                what="the restarted follower caught up",
            )
            replication = again.replication
            assert replication is not None
            driver = replication.driver(SHARD)
            assert driver is not None and driver.failure is None
            assert commits(again) == [(2, CommitMark(ENTITY, ()))]
        finally:
            await again.stop()


async def test_guarded_and_idempotent_writes_wait_for_replicated_conditions(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    admin: list[tuple[str, str]] = []
    async with running_quorum_fleet(
        tmp_path, etcd_server.endpoint, finalize=(ATOMIC_COMMIT,), admin=admin
    ) as (
        fleet,
        leader,
        _generation,
    ):
        admin_url, secret = admin[0]
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r0"])
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        refusals = [
            await ask(s, publish_if([b"if"], 1, 2)),
            await ask(s, commit(b"c", [StateChangePut(key="k", value=b"v")], 3)),
            await ask(s, batch(pid, 0, [b"idem"], 4)),
        ]
        for answer in refusals:
            # publish_if and commit: error; publish_idempotent: publish_error
            assert isinstance(answer, Error | PublishError), answer
            assert (answer.code, answer.retry) == ("invalid_request", "fatal"), answer
            assert REPLICATED_CONDITIONS in answer.message
        client.close()
        await publish_all(fleet.brokers[leader], fleet.issuer, [b"r1"], 1)  # plain: served
        await same_everywhere(fleet, [b"r0", b"r1"])

        await finalize_feature(fleet, admin_url, secret, REPLICATED_CONDITIONS)
        client, s = await session(fleet, leader)
        assert await ask(s, publish_if([b"if"], 2, 5)) == PublishOk(request_id=5, offset=2)
        pid = await producer(s, 6)
        answer = await ask(s, batch(pid, 0, [b"idem"], 7))
        assert answer == PublishOk(request_id=7, offset=3), answer
        client.close()
        await same_everywhere(fleet, [b"r0", b"r1", b"if", b"idem"])
