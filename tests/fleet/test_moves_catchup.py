"""Planned moves in two phases, end to end (real etcd, the placer, three brokers that
joined through etcd, the mutual-TLS peer channel):

- a large shard moved under two publishers (one on the owner, one forwarded through a
  non-owner): the old leader copies it while it still takes writes, so no publish is
  refused, and every acknowledged record is on the new owner once and in order;
- the hold covers only the last delta: what the old leader sent under the fence is
  at most FELIX_SHARD_MOVE_CATCHUP_BYTES, the rest went before it; with
  FELIX_SHARD_MOVE_CATCHUP_PASSES=0 the whole shard goes under the fence;
- a drain of a broker leading many shards copies at most max_moves of them at once,
  the others listed queued by GET /v1/fleet/moves until a slot frees;
- a move cancelled after its readers were ended with shard_moved: the readers that
  follow shard_moved to the named successor are pointed back to the old owner
  (not_leader at the retake's generation) and resume there with nothing missed;
  cancelled during its catch-up, nothing is held and no reader is ended;
- a staged copy that lost a file between the catch-up and the fence does not match
  the old leader's file list: the whole shard is sent again, nothing is lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from felix_broker.fleet.routing import AssignmentState, ShardId, ShardKind
from felix_common.etcd_process import EtcdProcess
from felix_controlplane.fleet_api import FleetApi
from felix_controlplane.http import Request
from felix_wire.binary import EventBatchSharedFrame
from felix_wire.messages import (
    EventBatch,
    NotLeader,
    PublishOk,
    ShardMoved,
    StartOffset,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import NODES
from .moves_support import SHARD, STREAM, MovingFleet, moving_fleet, publish, read_all
from .support import eventually

pytestmark = pytest.mark.timeout(240)

BATCHES = (EventBatch, EventBatchSharedFrame)
BIG = 256 * 1024  # one seed record
THRESHOLD = 512 * 1024  # FELIX_SHARD_MOVE_CATCHUP_BYTES in these tests


async def seed(fleet: MovingFleet, owner: str, mib: int) -> list[bytes]:
    """`mib` MiB of records in the shard, through its owner."""
    payloads = [bytes([i % 251]) * BIG for i in range(mib * 4)]
    client = await WireClient.connect(fleet.entry(owner))
    try:
        for i, payload in enumerate(payloads, start=1):
            assert await client.request(publish(payload, i)) == PublishOk(request_id=i)
    finally:
        client.close()
    return payloads


async def owner_target_seeded(fleet: MovingFleet, mib: int) -> tuple[str, str, list[bytes]]:
    """The shard's owner, the move's target (the first other node) and the `mib` MiB
    of records seeded through the owner."""
    owner = fleet.leader()
    target = next(n for n in NODES if n != owner)
    return owner, target, await seed(fleet, owner, mib)


async def reader_from_start(fleet: MovingFleet, node: str) -> tuple[WireClient, Any]:
    """A client subscribed to the shard at `node` from offset 0, and its event stream."""
    client = await WireClient.connect(fleet.entry(node))
    control = await client.session()
    await control.send(
        Subscribe(
            tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0,
            start=StartOffset(offset=0),
        )
    )  # fmt: skip
    subscribed = await control.recv()
    assert isinstance(subscribed, Subscribed), subscribed
    return client, await client.event_stream(subscribed.subscription_id)


async def test_a_large_shard_moves_under_two_publishers_refusing_nothing_and_holding_only_the_last_delta(  # noqa: E501
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server, shard_move_catchup_bytes=THRESHOLD) as fleet:
        owner, target, seeded = await owner_target_seeded(fleet, 16)
        forwarder = next(n for n in NODES if n not in (owner, target))

        acked: dict[str, list[bytes]] = {"p1": [], "p2": []}
        refused: list[Any] = []
        stop = asyncio.Event()

        async def publisher(name: str, node: str) -> None:
            client = await WireClient.connect(fleet.entry(node))
            try:
                stream = await client.session()
                n = 0
                while not stop.is_set() and n < 5000:
                    n += 1
                    payload = f"{name}-{n}".encode() * 20
                    await stream.send(publish(payload, n))
                    answer = await stream.recv(timeout=15)
                    if answer == PublishOk(request_id=n):
                        acked[name].append(payload)
                    else:
                        refused.append(answer)
                    await asyncio.sleep(0.002)
            finally:
                client.close()

        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(publisher("p1", owner)),
            loop.create_task(publisher("p2", forwarder)),
        ]
        await eventually(lambda: all(len(done) >= 20 for done in acked.values()))
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=60, what="the cut-over")
        before = {name: len(done) for name, done in acked.items()}
        await eventually(lambda: all(len(acked[n]) >= before[n] + 20 for n in acked), within=30)
        stop.set()
        await asyncio.gather(*tasks)
        assert refused == []

        # The hold covered only the last delta: the catch-up sent the bulk before it.
        moves = fleet.brokers[owner].moves
        assert moves is not None
        stats = moves.stats[SHARD]
        assert stats.passes >= 1
        assert stats.precopied_bytes >= 16 * 1024 * 1024
        assert stats.fenced_bytes <= THRESHOLD, stats

        # Every acknowledged record once, in each publisher's order, nothing else.
        total = len(seeded) + sum(len(done) for done in acked.values())
        log = [payload for _, payload in await read_all(fleet.entry(target), 0, total)]
        assert log[: len(seeded)] == seeded
        for name, done in acked.items():
            mine = [p for p in log if p.startswith(f"{name}-".encode())]
            assert mine == done
        assert len(log) == total
        client = await WireClient.connect(fleet.entry(target))
        try:
            control = await client.session()
            start = StartOffset(offset=total)
            await control.send(
                Subscribe(tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, start=start)
            )
            subscribed = await control.recv()
            assert isinstance(subscribed, Subscribed), subscribed
            assert subscribed.live_offset == total  # nothing stored twice
        finally:
            client.close()


async def test_with_no_catch_up_pass_the_whole_shard_goes_under_the_fence(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server, shard_move_catchup_passes=0) as fleet:
        owner, target, seeded = await owner_target_seeded(fleet, 2)
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=60, what="the cut-over")
        moves = fleet.brokers[owner].moves
        assert moves is not None
        stats = moves.stats[SHARD]
        assert (stats.passes, stats.precopied_bytes) == (0, 0)
        assert stats.fenced_bytes >= 2 * 1024 * 1024
        log = await read_all(fleet.entry(target), 0, len(seeded))
        assert [p for _, p in log] == seeded


async def _moves_api(fleet: MovingFleet) -> dict[str, Any]:
    """GET /v1/fleet/moves as the control plane's admin listener answers it."""
    api = FleetApi(lambda: fleet.placer)
    handler = next(h for method, path, h in api.routes() if method == "GET" and "moves" in path)
    request = Request(
        method="GET", path="/v1/fleet/moves", query={}, headers={}, body=b"", peer="127.0.0.1"
    )
    response = await handler(request, {})
    assert response.status == 200
    body: dict[str, Any] = response.body
    return body


def _shards(n: int) -> list[ShardId]:
    return [ShardId(ShardKind.STREAM, TENANT, NS, STREAM, i) for i in range(n)]


async def test_a_drain_copies_at_most_max_moves_shards_at_once_and_lists_the_rest_queued(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    shards = 12
    async with moving_fleet(tmp_path, etcd_server, stream_shards=shards) as fleet:
        fleet.placer.max_moves = 2
        owner = fleet.leader()
        led = [s for s in _shards(shards) if fleet.leader(s) == owner]
        assert len(led) >= 3  # spread by count: four of the twelve each
        await fleet.placer.drain(owner, "test")
        seen_copying = 0
        seen_queued = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while not all(fleet.leader(s) != owner for s in led):
            assert loop.time() < deadline, "the drain did not finish"
            moves = await fleet.placer.moves()
            copying = [h for h in moves.values() if h.record.successor != h.record.leader]
            assert len(copying) <= 2, moves
            seen_copying = max(seen_copying, len(copying))
            body = await _moves_api(fleet)
            assert body["max_moves"] == 2
            assert len(body["items"]) <= 2
            queued = {(q["name"], q["shard"]) for q in body["queued"]}
            moving = {(i["name"], i["shard"]) for i in body["items"]}
            assert not queued & moving
            assert all(q["leader"] == owner for q in body["queued"])
            seen_queued = max(seen_queued, len(queued))
            await asyncio.sleep(0.01)
        assert seen_copying >= 1
        assert seen_queued >= 1  # the others waited for a slot
        await eventually(lambda: all(fleet.settled_on(fleet.leader(s), s) for s in led), within=30)
        body = await _moves_api(fleet)
        assert body["items"] == [] and body["queued"] == []


async def test_readers_ended_by_a_cancelled_move_are_pointed_back_to_the_old_owner(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner, target, seeded = await owner_target_seeded(fleet, 1)
        target_moves = fleet.brokers[target].moves
        assert target_moves is not None
        # The successor installs nothing until the test lets it: the move stays fenced.
        release = asyncio.Event()
        install = target_moves._install_final

        async def held_install(*args: Any) -> None:
            await release.wait()
            await install(*args)

        target_moves._install_final = held_install  # type: ignore[method-assign]

        client, events = await reader_from_start(fleet, owner)
        await fleet.placer.move(SHARD, target)
        await eventually(
            lambda: (r := fleet.route(owner)) is not None and r.state is AssignmentState.MOVING,
            within=30,
            what="the fence",
        )
        delivered = 0
        while True:
            frame = await events.recv(timeout=10)
            if isinstance(frame, ShardMoved):
                moved = frame
                break
            assert isinstance(frame, BATCHES), frame
            delivered += len(frame.payloads)
        client.close()
        assert moved.node_id == target
        assert delivered == len(seeded)

        retaken = await fleet.placer.cancel(SHARD)
        assert retaken.outcome == "retake"
        release.set()
        await eventually(lambda: fleet.settled_on(owner), what="the old owner serves again")

        # The reader follows shard_moved to the successor: it is sent back to the owner.
        resume = max(delivered, moved.resume_from or 0)
        follow = await WireClient.connect(fleet.entry(target))
        try:
            control = await follow.session()
            await control.send(
                Subscribe(
                    tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0,
                    start=StartOffset(offset=resume),
                )
            )  # fmt: skip
            answer = await control.recv()
            assert isinstance(answer, NotLeader), answer
            assert answer.node_id == owner
            assert answer.addr == f"127.0.0.1:{fleet.brokers[owner].quic_port}"
            assert answer.generation == retaken.generation
        finally:
            follow.close()
        # At the old owner it resumes, and what is published after the retake arrives.
        other = await WireClient.connect(fleet.entry(owner))
        try:
            assert await other.request(publish(b"after", 9000)) == PublishOk(request_id=9000)
        finally:
            other.close()
        rest = await read_all(fleet.entry(owner), resume, len(seeded) + 1)
        assert [p for _, p in rest] == [*seeded[resume:], b"after"]


async def test_a_move_cancelled_during_its_catch_up_holds_nothing_and_ends_no_reader(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner, target, seeded = await owner_target_seeded(fleet, 1)
        target_moves = fleet.brokers[target].moves
        assert target_moves is not None
        # The successor does not report the catch-up until the test lets it: no fence.
        release = asyncio.Event()
        reported = asyncio.Event()
        report = target_moves._report

        async def held_report(*args: Any) -> None:
            reported.set()
            await release.wait()
            await report(*args)

        target_moves._report = held_report  # type: ignore[method-assign]
        client, events = await reader_from_start(fleet, owner)
        await fleet.placer.move(SHARD, target)
        async with asyncio.timeout(30):
            await reported.wait()  # the catch-up passes were sent
        folder = tmp_path / target / "durable"
        assert any(".incoming" in p.name for p in folder.rglob("*"))  # staged there
        route = fleet.route(owner)
        assert route is not None and route.state is AssignmentState.ACTIVE
        assert route.successor == target
        # Publishes during the catch-up are served at once (nothing held).
        other = await WireClient.connect(fleet.entry(owner))
        try:
            assert await other.request(publish(b"during", 9000)) == PublishOk(request_id=9000)
            cancelled = await fleet.placer.cancel(SHARD)
            assert cancelled.outcome == "cancel"
            release.set()
            await eventually(
                lambda: (
                    fleet.settled_on(owner)
                    and (r := fleet.route(owner)) is not None
                    and r.successor is None
                ),
                what="the catch-up dropped",
            )
            assert await other.request(publish(b"after", 9001)) == PublishOk(request_id=9001)
        finally:
            other.close()
        # The reader was never ended: it gets everything, then what came after.
        got: list[bytes] = []
        while len(got) < len(seeded) + 2:
            frame = await events.recv(timeout=10)
            assert isinstance(frame, BATCHES), frame
            got.extend(frame.payloads)
        client.close()
        assert got == [*seeded, b"during", b"after"]
        moves = fleet.brokers[owner].moves
        assert moves is not None and SHARD not in moves.stats  # nothing went under a fence
        # The successor dropped what it had staged.
        await eventually(
            lambda: not any(".incoming" in p.name for p in folder.rglob("*")),
            what="the successor's staging removed",
        )


async def test_a_staged_copy_that_lost_a_file_is_sent_again_whole_under_the_fence(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner, target, seeded = await owner_target_seeded(fleet, 2)
        target_moves = fleet.brokers[target].moves
        assert target_moves is not None
        report = target_moves._report
        lost: list[Path] = []

        async def losing_report(*args: Any) -> None:
            if not lost:  # the catch-up's report: a staged segment goes missing
                staged = [
                    p
                    for p in (tmp_path / target / "durable").rglob("*.log")
                    if ".incoming" in p.parent.name
                ]
                victim = max(staged, key=lambda p: p.stat().st_size)
                victim.unlink()
                lost.append(victim)
            await report(*args)

        target_moves._report = losing_report  # type: ignore[method-assign]
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=60, what="the cut-over")
        assert lost
        log = await read_all(fleet.entry(target), 0, len(seeded))
        assert [p for _, p in log] == seeded
        moves = fleet.brokers[owner].moves
        assert moves is not None
        # The final delta did not match what the successor held: all of it went again.
        assert moves.stats[SHARD].fenced_bytes >= 2 * 1024 * 1024
