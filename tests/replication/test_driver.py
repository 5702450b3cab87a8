"""Three replicas of one shard over the real peer channel (QUIC, mutual TLS, loopback)
with real files: the driver carries out the core's effects, and what clients and disks
see is what the protocol promises."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from felix_broker.fleet.peer import PeerDialer, PeerLimits, PeerListener, PeerOrigin, PeerTls
from felix_broker.replication.apply import encode_batch
from felix_broker.replication.core import Entry, Phase, Ship, ShipOk
from felix_broker.replication.disk import ReplicaDisk
from felix_broker.replication.driver import ReplicaDriver, ReplicationRefusedError
from felix_broker.replication.service import peer_sender
from felix_broker.replication.wire import WireMessage, from_wire, to_wire
from felix_transport import generate_ca
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import PeerMessage, ReplicaReceived, ReplicatedBatch

from .driver_support import CONFIG, NODES, SHARD, STREAM, Fleet, opened, until


def stream_files(self: Fleet, node: str) -> dict[str, bytes]:
    """The bytes of `node`'s stream log files (segments and indexes), by name."""
    root = self.brokers[node].folder / "durable"
    found = {p.name: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    assert found, f"no stream files under {root}"
    return found


@pytest.fixture
async def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    streams = bool(getattr(request, "param", False))
    f = Fleet(tmp_path, generate_ca("replication test fleet"), streams=streams)
    for node in NODES:
        await f.start(node)
    try:
        yield f
    finally:
        await f.close()


def payloads_of(entries: tuple[Entry, ...]) -> list[bytes]:
    return [e.payload for e in entries if not e.start]


@pytest.mark.timeout(60)
async def test_a_quorum_write_is_acked_only_once_a_follower_holds_it_on_disk(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    assert leader.read(0, 10).records == ()  # open, with a mark: readers are served
    acked = await leader.append([b"a", b"b"])
    assert (acked.first_offset, acked.count, acked.generation) == (1, 2, 1)
    followers_holding = [n for n in ("b2", "b3") if payloads_of(fleet.on_disk(n)) == [b"a", b"b"]]
    assert followers_holding, "acked, but no follower's disk holds the records"
    assert leader.read(0, 10).records == ((1, b"a"), (2, b"b"))


@pytest.mark.timeout(60)
async def test_followers_logs_equal_the_leaders_record_for_record(fleet: Fleet) -> None:
    leader = await opened(fleet, "b1", 1)
    for i in range(20):
        await leader.append([f"r{i}".encode(), bytes([i]) * 100])
    want = fleet.on_disk("b1")
    await until(lambda: all(fleet.on_disk(n) == want for n in ("b2", "b3")))
    assert len(want) == 41 and want[0].start and all(e.generation == 1 for e in want)


@pytest.mark.timeout(60)
async def test_no_majority_in_time_is_quorum_timeout_with_the_outcome_unknown(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    await fleet.cut("b2")
    await fleet.cut("b3")
    with pytest.raises(ReplicationRefusedError) as refused:
        async with asyncio.timeout(5):
            await leader.append([b"lonely"])
    assert (refused.value.code, refused.value.retry) == (
        ErrorCode.QUORUM_TIMEOUT,
        RetryClass.OUTCOME_UNKNOWN,
    )
    assert leader.read(0, 10).records == ()  # readers stop at the mark
    assert payloads_of(fleet.on_disk("b1")) == [b"lonely"]  # durable here, not committed


@pytest.mark.timeout(90)
async def test_the_leaders_loss_promotes_a_successor_that_holds_every_acked_record(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    acked = [b"k%d" % i for i in range(10)]
    for payload in acked:
        await leader.append([payload])
    await fleet.stop("b1")  # kill: its process ends
    successor = await opened(fleet, "b2", 2)
    after = await successor.append([b"after"])
    assert after.generation == 2
    seen = [payload for _, payload in successor.read(0, 100).records]
    assert seen == [*acked, b"after"]


@pytest.mark.timeout(90)
async def test_a_returning_old_leader_stops_leading_and_truncates_what_it_never_shipped(
    fleet: Fleet,
) -> None:
    old = await opened(fleet, "b1", 1)
    await old.append([b"committed"])
    await fleet.cut("b2")
    await fleet.cut("b3")
    with pytest.raises(ReplicationRefusedError):
        await old.append([b"unshipped"])
    assert payloads_of(fleet.on_disk("b1")) == [b"committed", b"unshipped"]
    await fleet.stop("b1")
    for node in ("b2", "b3"):  # they come back reachable
        await fleet.stop(node)
        await fleet.start(node)
    successor = await opened(fleet, "b2", 2)
    await successor.append([b"new"])
    returned = await fleet.start("b1")  # restarts from its disk: a follower at its ballot
    assert returned.replica.phase is Phase.FOLLOWER
    with pytest.raises(ReplicationRefusedError) as refused:
        await returned.append([b"stale"])
    assert refused.value.code is ErrorCode.NOT_LEADER
    await until(lambda: fleet.on_disk("b1") == fleet.on_disk("b2"))
    assert payloads_of(fleet.on_disk("b1")) == [b"committed", b"new"]


@pytest.mark.timeout(60)
async def test_a_candidate_behind_a_majority_is_refused_and_nothing_is_served(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    await fleet.cut("b3")  # b3 misses what follows
    await leader.append([b"x"])
    await fleet.stop("b1")
    await fleet.stop("b3")
    await fleet.start("b3")
    await fleet.stop("b2")
    await fleet.start("b2")
    behind = fleet.driver("b3")
    await behind.promote(2)
    await until(lambda: behind.promotion_refused is not None)
    assert behind.promotion_refused is not None and behind.promotion_refused.ahead == ("b2",)
    assert behind.read(0, 10).code is ErrorCode.NOT_LEADER  # never served short
    successor = await opened(fleet, "b2", 3)
    assert [p for _, p in successor.read(0, 10).records] == [b"x"]


@pytest.mark.timeout(30)
async def test_a_replication_message_naming_another_sender_is_dropped(fleet: Fleet) -> None:
    from felix_broker.replication.core import Fence
    from felix_broker.replication.wire import to_wire

    b1 = fleet.brokers["b1"]
    assert b1.dialer is not None
    answer = await b1.dialer.request(
        "b2", fleet.brokers["b2"].address, to_wire(SHARD, Fence(9, "b3"))
    )
    assert answer.held is False  # type: ignore[union-attr]
    assert fleet.brokers["b2"].service.spoofed == 1
    assert fleet.driver("b2").replica.generation == 0


def batch(i: int) -> bytes:
    return encode_batch(
        ReplicatedBatch(
            timestamp_us=1_000_000 + i, publisher="svc" if i % 2 else None, payloads=[b"p%d" % i]
        )
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fleet", [True], indirect=True)
async def test_stream_storage_gets_committed_batches_only_and_is_the_leaders_byte_for_byte(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    written = [await leader.append([batch(i)]) for i in range(12)]
    assert [w.stream_offset for w in written] == list(range(12))
    shard = fleet.brokers["b1"].engine.shard(STREAM, 0)  # type: ignore[union-attr]
    assert shard.log is not None
    records = shard.log.read(0, max_records=100, max_bytes=1 << 20)
    assert [(r.offset, r.timestamp_us, r.payload) for r in records] == [
        (i, 1_000_000 + i, b"p%d" % i) for i in range(12)
    ]
    await until(lambda: all(fleet.brokers[n].driver.applied == 13 for n in NODES))  # type: ignore[union-attr]
    await fleet.close()  # everything on disk, files closed
    want = stream_files(fleet, "b1")
    assert stream_files(fleet, "b2") == want and stream_files(fleet, "b3") == want


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fleet", [True], indirect=True)
async def test_readers_stop_at_the_mark_and_a_restarted_replica_does_not_apply_twice(
    fleet: Fleet,
) -> None:
    leader = await opened(fleet, "b1", 1)
    await leader.append([batch(0)])
    await until(lambda: fleet.driver("b2").applied == 2)  # the mark reached b2 too
    await fleet.cut("b2")
    await fleet.cut("b3")
    with pytest.raises(ReplicationRefusedError):
        await leader.append([batch(1)])  # on b1's replication log only
    shard = fleet.brokers["b1"].engine.shard(STREAM, 0)  # type: ignore[union-attr]
    assert shard.next_offset == 1  # the stream log, what readers read, holds the committed one
    await fleet.stop("b2")
    await fleet.start("b2")
    again = fleet.driver("b2")
    assert again.applied == 2  # its start entry and batch 0 were applied before the restart
    assert fleet.brokers["b2"].engine.shard(STREAM, 0).next_offset == 1  # type: ignore[union-attr]


def stream_payloads(fleet: Fleet, node: str) -> list[bytes]:
    engine = fleet.brokers[node].engine
    assert engine is not None
    log = engine.shard(STREAM, 0).log
    assert log is not None
    return [r.payload for r in log.read(0, max_records=1000, max_bytes=1 << 22)]


@pytest.mark.timeout(120)
async def test_the_replication_log_is_compacted_and_a_lagging_follower_is_served_from_disk(
    tmp_path: Path,
) -> None:
    """Real files: memory holds only what is not yet applied everywhere known, the
    file is rewritten from the floor every replica holds, a follower that was away
    catches up from the leader's disk, and a restart from a compacted file applies
    nothing twice."""
    fleet = Fleet(tmp_path, generate_ca("compaction"), streams=True, compact_every=8)
    for node in NODES:
        await fleet.start(node)
    try:
        leader = await opened(fleet, "b1", 1)
        for i in range(40):
            await leader.append([batch(i)])
        await until(lambda: all(fleet.driver(n).applied == 41 for n in NODES))
        await until(lambda: all(fleet.driver(n)._disk.base >= 32 for n in NODES))
        for node in NODES:
            assert len(fleet.driver(node).replica.log) <= 9, node
            folder = fleet.brokers[node].folder / "replication"

            def entries_files(folder: Path = folder) -> list[str]:
                return sorted(p.name for p in folder.iterdir() if p.name.startswith("entries"))

            await until(lambda: len(entries_files()) == 1)  # a rewrite may be under way
            base = fleet.driver(node)._disk.base
            assert entries_files() == [f"entries-{base}-1-{base - 1}.log"]
        await fleet.stop("b3")  # away: it misses what follows
        for i in range(40, 70):
            await leader.append([batch(i)])
        assert len(leader.replica.log) <= 9  # memory stays bounded while b3 is away
        assert leader.replica.stored_from <= 41  # the disk keeps what b3 lacks
        await fleet.start("b3")
        await until(lambda: fleet.driver("b3").applied == 71, 20)
        assert stream_payloads(fleet, "b3") == [b"p%d" % i for i in range(70)]
        await leader.append([batch(70)])
        await until(lambda: fleet.driver("b1").replica.stored_from >= 71)
        # b2's own file is rewritten once it learns every replica holds the floor (with
        # windowed shipping that may come a few answers after the leader's): closed
        # before it, b2 would reopen a file holding more than two compactions' worth.
        await until(lambda: fleet.driver("b2")._disk.base >= 72 - 2 * 8)
        await fleet.close()
        await fleet.start("b2")  # from its compacted file and its stream log
        again = fleet.driver("b2")
        # Recovered from the compacted file: only what it kept past its last rewrite.
        assert again.replica.base == again._disk.base > 0
        assert len(again.replica.log) <= 2 * 8
        # Applied exactly what its stream log holds (one start entry, then batches): the
        # rest is applied once a leader tells it the mark again, never twice.
        assert again.applied >= again.replica.base
        assert stream_payloads(fleet, "b2") == [b"p%d" % i for i in range(again.applied - 1)]
    finally:
        await fleet.close()


@pytest.mark.timeout(30)
async def test_a_followers_answers_queued_behind_a_slow_send_merge_into_one(
    tmp_path: Path,
) -> None:
    """Regression (the Quorum throughput collapse): every ship and every fsync queued
    its own `ShipOk` on the serial per-peer outbox, so a slow link carried stale
    answers one by one. Queued behind a send in progress, they are one answer saying
    how far the follower holds the log."""
    gate = asyncio.Event()
    sent: list[WireMessage] = []

    async def slow(_node: str, message: WireMessage, more: bool = False) -> None:
        sent.append(message)
        await gate.wait()

    disk = ReplicaDisk(tmp_path / "replication")
    follower = ReplicaDriver.open(SHARD, "b2", NODES, disk, slow, config=CONFIG)
    follower.start()
    try:
        await follower.receive(Ship(1, "b1", 0, 0, (Entry(1, b"", start=True),), 0))
        await until(lambda: len(sent) == 1)  # the first answer is on its way, slowly
        for offset in range(1, 41):
            await follower.receive(Ship(1, "b1", offset, 1, (Entry(1, b"r%d" % offset),), 0))
            await asyncio.sleep(0)  # let fsyncs complete now and then
        await until(lambda: follower.replica.synced_length == 41)
        gate.set()
        await asyncio.sleep(0.3)  # whatever was queued is sent now
        answers = [from_wire(m)[1] for m in sent]
        assert answers == [ShipOk(1, "b2", 0, 1), ShipOk(1, "b2", 41, 41)]
        assert follower.dropped == 0
    finally:
        gate.set()
        await follower.close()


@pytest.mark.timeout(30)
async def test_the_peer_sender_pipelines_a_burst_in_order_without_waiting_for_answers(
    tmp_path: Path,
) -> None:
    """Regression (the Quorum throughput collapse): each replication message was one
    request on a stream of its own and the per-peer sender waited for its answer, so
    a peer's messages left one round trip apart. A burst (`more`: the outbox holds
    others behind) now leaves as written, in order, on one pipe."""
    ca = generate_ca("pipelined sender")
    gate = asyncio.Event()
    seen: list[int] = []

    async def handler(message: PeerMessage, _origin: PeerOrigin) -> PeerMessage:
        seen.append(message.matched)  # type: ignore[attr-defined]
        await gate.wait()  # the first request is not answered until the gate opens
        return ReplicaReceived(held=True)

    limits = PeerLimits(request_timeout=10.0, connect_timeout=5.0)
    listener = PeerListener(PeerTls.issue(ca, "b1"), handler, limits)
    await listener.start("127.0.0.1", 0)
    host, port = listener.address
    dialer = PeerDialer(PeerTls.issue(ca, "b2"), limits)
    send = peer_sender(dialer, lambda _node: f"{host}:{port}")
    try:
        async with asyncio.timeout(10):  # all written while the first waits for its answer
            for matched in range(10):
                await send("b1", to_wire(SHARD, ShipOk(1, "b2", 0, matched)), more=True)
        await until(lambda: seen == [0])
        gate.set()
        await until(lambda: seen == list(range(10)))
    finally:
        gate.set()
        await dialer.close()
        await listener.close()
