"""Read rounds (felix_broker/replication/reads.py) between three replicas of one shard
over the real peer channel (QUIC, mutual TLS, loopback) with real files: a leader's
read is confirmed by a majority, fails as leadership_lost without one or against a
newer generation, and concurrent reads share rounds (one running, one queued)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from felix_broker.replication.core import Fence
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.replication.reads import ReadRounds
from felix_transport import generate_ca
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import ReplicaReadRound

from .driver_support import CONFIG, NODES, Fleet, opened

pytestmark = pytest.mark.timeout(60)


class Reads:
    """A fleet whose every broker answers read rounds and can run them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.rounds: dict[str, ReadRounds] = {}
        for node in NODES:
            b = fleet.brokers[node]
            assert b.dialer is not None
            rounds = ReadRounds(
                b.dialer,
                fleet.address_of,
                b.service,
                timeout_ms=CONFIG.quorum_timeout_ms,
                active=lambda: True,
            )
            b.service.handlers[ReplicaReadRound] = rounds.handle  # beside replica_*
            self.rounds[node] = rounds


@pytest.fixture
async def reads(tmp_path: Path) -> AsyncIterator[Reads]:
    fleet = Fleet(tmp_path, generate_ca("read rounds test fleet"))
    for node in NODES:
        await fleet.start(node)
    try:
        yield Reads(fleet)
    finally:
        await fleet.close()


async def test_a_majority_confirms_the_leader(reads: Reads) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    await reads.rounds["b1"].confirm(leader)
    assert (reads.rounds["b1"].rounds, reads.rounds["b1"].failed) == (1, 0)
    await reads.fleet.cut("b3")  # one follower gone: the leader and b2 are a majority
    await reads.rounds["b1"].confirm(leader)
    assert (reads.rounds["b1"].rounds, reads.rounds["b1"].failed) == (2, 0)


async def test_without_a_majority_the_read_is_leadership_lost(reads: Reads) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    await reads.fleet.cut("b2")
    await reads.fleet.cut("b3")
    with pytest.raises(ReplicationRefusedError) as refused:
        await reads.rounds["b1"].confirm(leader)
    assert refused.value.code is ErrorCode.LEADERSHIP_LOST
    assert refused.value.retry is RetryClass.OUTCOME_UNKNOWN  # the catalogue's class
    assert "no majority" in str(refused.value)


async def test_a_replica_at_a_newer_generation_fails_the_round(reads: Reads) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    # b2 took a newer candidate's fence (its answer goes to a node with no outbox);
    # b3 still confirms, but one newer ballot is enough to know leadership moved on.
    await reads.fleet.driver("b2").receive(Fence(7, "b9"))
    with pytest.raises(ReplicationRefusedError) as refused:
        await reads.rounds["b1"].confirm(leader)
    assert refused.value.code is ErrorCode.LEADERSHIP_LOST
    assert "holds generation 7" in str(refused.value)


async def test_a_replica_following_another_leader_at_the_same_generation_gives_no_vote(
    reads: Reads,
) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    for node in ("b2", "b3"):  # as if they had followed someone else at generation 1
        reads.fleet.driver(node).replica.leader = "b9"
    with pytest.raises(ReplicationRefusedError) as refused:
        await reads.rounds["b1"].confirm(leader)
    assert "no majority" in str(refused.value)


async def test_concurrent_reads_join_the_queued_round(reads: Reads) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    rounds = reads.rounds["b1"]
    # The first read starts a round; the nine after it arrive while it runs and all
    # join the one queued behind it: two rounds for ten reads.
    await asyncio.gather(*(rounds.confirm(leader) for _ in range(10)))
    assert (rounds.rounds, rounds.failed) == (2, 0)


async def test_a_reader_going_away_does_not_cancel_the_shared_round(reads: Reads) -> None:
    leader = await opened(reads.fleet, "b1", 1)
    rounds = reads.rounds["b1"]
    first = asyncio.create_task(rounds.confirm(leader))
    second = asyncio.create_task(rounds.confirm(leader))
    await asyncio.sleep(0)
    first.cancel()
    await second  # the round both joined still answers the one that stayed
    assert first.cancelled() and rounds.failed == 0
