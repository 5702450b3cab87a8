"""Planned moves and drains, end to end: a real etcd, the control plane's placer, and
three brokers that joined through etcd (each its own data folder). Nothing sets a
route by hand: the placer's writes drive the move, the brokers copy the shard's
storage over the mutual-TLS peer channel, the successor reports the copy in etcd.

- a drain of the owner under load (two publishers through different brokers, a
  subscriber on the owner, a consumer group with a committed cursor): no publish is
  refused, the subscriber gets shard_moved and resumes at max(last + 1,
  resume_from) on the new owner with no gap, every acknowledged record is in the
  new owner's log once and in each publisher's order, the group's cursor continues;
- a publish held past FELIX_SHARD_MOVE_HOLD_MS is refused shard_unavailable/moving
  with retry_after_ms, and nothing of it is written;
- a move cancelled before its cut-over leaves the old owner serving at a newer
  generation; a cancel after the cut-over is 409.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from felix_common.etcd_process import EtcdProcess
from felix_controlplane.fleet_api import MoveError
from felix_wire.errors import ErrorCode
from felix_wire.messages import (
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    CacheWatch,
    CacheWatchStarted,
    CounterAdd,
    GroupAck,
    GroupPoll,
    GroupRecords,
    PublishError,
    PublishIdempotent,
    PublishOk,
    PublishRefusal,
    SequenceGap,
    ShardMoved,
    StartOffset,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import NODES, Entry
from .moves_support import (
    BATCHES,
    CACHE,
    MEMORY,
    SHARD,
    STREAM,
    moving_fleet,
    publish,
    read_all,
)
from .support import eventually

pytestmark = pytest.mark.timeout(180)

GROUP = "workers"


async def test_a_drain_under_load_loses_nothing_and_refuses_nothing(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        others = [n for n in NODES if n != owner]

        # Before the move: records 0..9 and a group that acked 0..4.
        seed = await WireClient.connect(fleet.entry(owner))
        control = await seed.session()
        for i in range(10):
            await control.send(publish(f"seed-{i}".encode(), i + 1))
            assert await control.recv() == PublishOk(request_id=i + 1)
        poll = GroupPoll(
            tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, group=GROUP,
            max_records=5, request_id=100,
        )  # fmt: skip
        await control.send(poll)
        polled = await control.recv()
        assert isinstance(polled, GroupRecords), polled
        assert [r.offset for r in polled.records] == [0, 1, 2, 3, 4]
        for record in polled.records:
            ack = GroupAck(
                tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, group=GROUP,
                offset=record.offset, request_id=200 + record.offset,
            )  # fmt: skip
            await control.send(ack)
            await control.recv()
        seed.close()

        # A subscriber on the owner, from the start.
        sub = await WireClient.connect(fleet.entry(owner))
        sub_control = await sub.session()
        await sub_control.send(
            Subscribe(
                tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, start=StartOffset(offset=0)
            )
        )
        subscribed = await sub_control.recv()
        assert isinstance(subscribed, Subscribed), subscribed
        events = await sub.event_stream(subscribed.subscription_id)

        # Two publishers: one on the owner, one through a non-owner (forwarded).
        acked: dict[str, list[bytes]] = {"p1": [], "p2": []}
        refused: list[Any] = []
        stop = asyncio.Event()

        async def publisher(name: str, node: str) -> None:
            client = await WireClient.connect(fleet.entry(node))
            try:
                stream = await client.session()
                n = 0
                while not stop.is_set() and n < 2000:
                    n += 1
                    payload = f"{name}-{n}".encode()
                    await stream.send(publish(payload, n))
                    answer = await stream.recv(timeout=15)
                    if answer == PublishOk(request_id=n):
                        acked[name].append(payload)
                    else:
                        refused.append(answer)
                    await asyncio.sleep(0.005)
            finally:
                client.close()

        tasks = [
            asyncio.get_running_loop().create_task(publisher("p1", owner)),
            asyncio.get_running_loop().create_task(publisher("p2", others[0])),
        ]
        await eventually(lambda: len(acked["p1"]) >= 20 and len(acked["p2"]) >= 20)

        # Drain the owner: the placer moves its shard to another broker.
        await fleet.placer.drain(owner, "test")
        await eventually(
            lambda: fleet.leader() != owner and fleet.settled_on(fleet.leader()),
            within=30,
            what="the shard cut over",
        )
        successor = fleet.leader()
        assert successor in others
        before = {name: len(done) for name, done in acked.items()}
        await eventually(lambda: all(len(acked[n]) >= before[n] + 20 for n in acked), within=30)
        stop.set()
        await asyncio.gather(*tasks)
        assert refused == []

        # The subscriber: batches without a gap, then shard_moved naming the successor.
        delivered: list[tuple[int, bytes]] = []
        moved: ShardMoved | None = None
        while moved is None:
            frame = await events.recv(timeout=10)
            if isinstance(frame, ShardMoved):
                moved = frame
                break
            assert isinstance(frame, BATCHES), frame
            assert frame.base_offset == len(delivered), (frame.base_offset, len(delivered))
            delivered.extend((frame.base_offset + i, p) for i, p in enumerate(frame.payloads))
        await events.expect_end()
        assert moved.node_id == successor
        assert moved.addr == f"127.0.0.1:{fleet.brokers[successor].quic_port}"
        assert moved.resume_from is not None
        resume = max(len(delivered), moved.resume_from)
        assert resume == len(delivered)  # it was offered nothing it did not get
        sub.close()

        # At the new owner: the rest from the resume point, no gap; altogether every
        # acknowledged record once, in each publisher's order.
        total = 10 + sum(len(done) for done in acked.values())
        rest = await read_all(fleet.entry(successor), resume, total)
        log = [payload for _, payload in delivered + rest]
        assert len(log) == total
        assert log[:10] == [f"seed-{i}".encode() for i in range(10)]
        for name, done in acked.items():
            assert [p for p in log if p.startswith(f"{name}-".encode())] == done
        # Nothing past the acknowledged records (nothing stored twice).
        await read_more_is_nothing(fleet.entry(successor), total)

        # The group's cursor moved with the shard: the next poll starts at 5.
        client = await WireClient.connect(fleet.entry(successor))
        try:
            stream = await client.session()
            await stream.send(msgspec.structs.replace(poll, request_id=300))
            polled = await stream.recv()
            assert isinstance(polled, GroupRecords), polled
            assert [r.offset for r in polled.records] == [5, 6, 7, 8, 9]
        finally:
            client.close()


async def read_more_is_nothing(entry: Entry, end: int) -> None:
    client = await WireClient.connect(entry)
    try:
        control = await client.session()
        await control.send(
            Subscribe(
                tenant_id=TENANT,
                namespace=NS,
                stream=STREAM,
                shard=0,
                start=StartOffset(offset=end),
            )
        )
        subscribed = await control.recv()
        assert isinstance(subscribed, Subscribed), subscribed
        assert subscribed.live_offset == end, subscribed
    finally:
        client.close()


@pytest.mark.parametrize(
    "bound",
    [{"shard_move_hold_ms": 300}, {"shard_move_hold_max": 0}],
    ids=["past FELIX_SHARD_MOVE_HOLD_MS", "past FELIX_SHARD_MOVE_HOLD_MAX"],
)
async def test_a_publish_held_past_the_bound_is_refused_moving_and_not_written(
    etcd_server: EtcdProcess, tmp_path: Path, bound: dict[str, int]
) -> None:
    async with moving_fleet(tmp_path, etcd_server, **bound) as fleet:
        owner = fleet.leader()
        client = await WireClient.connect(fleet.entry(owner))
        try:
            stream = await client.session()
            await stream.send(publish(b"before", 1))
            assert await stream.recv() == PublishOk(request_id=1)
            # A fence never cuts over: the hold runs out.
            leader, generation = await fleet.placer.fence(SHARD)
            assert leader == owner
            await eventually(
                lambda: all(
                    (r := fleet.route(n)) is not None and r.generation == generation for n in NODES
                )
            )
            for node in NODES:  # through the owner and through non-owners
                other = await WireClient.connect(fleet.entry(node))
                try:
                    answer = await other.request(publish(b"refused", 7))
                finally:
                    other.close()
                assert isinstance(answer, PublishError), answer
                assert answer.code == ErrorCode.SHARD_UNAVAILABLE.wire, answer
                assert answer.retry == "retry", answer
                assert answer.detail is not None and answer.detail.reason == "moving", answer
                assert (answer.detail.retry_after_ms or 0) > 0, answer
            # Healed (cancelled): the owner serves again at a newer generation, and the
            # refused publishes were never written.
            retaken = await fleet.placer.cancel(SHARD)
            assert retaken.generation > generation and retaken.outcome == "retake"
            await eventually(lambda: fleet.settled_on(owner))
            await stream.send(publish(b"after", 2))
            assert await stream.recv() == PublishOk(request_id=2)
            log = await read_all(fleet.entry(owner), 0, 2)
            assert [p for _, p in log] == [b"before", b"after"]
            await read_more_is_nothing(fleet.entry(owner), 2)
        finally:
            client.close()


async def test_a_move_cancelled_before_its_cut_over_stays_and_a_late_cancel_is_409(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        target = next(n for n in NODES if n != owner)
        # No move in progress: nothing to cancel.
        with pytest.raises(MoveError) as nothing:
            await fleet.placer.cancel(SHARD)
        assert nothing.value.status == 409
        # Fenced, then cancelled before the successor's copy can be reported: the
        # successor is stopped from answering by fencing at a broker that is not it.
        generation = await fleet.placer.move(SHARD, target)
        retaken = await fleet.placer.cancel(SHARD)
        assert retaken.generation > generation
        await eventually(lambda: fleet.settled_on(owner), what="the old owner serves again")
        # A whole move, then a cancel after its cut-over: 409.
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=30, what="cut over")
        with pytest.raises(MoveError) as late:
            await fleet.placer.cancel(SHARD)
        assert late.value.status == 409


async def open_subscriber(entry: Entry) -> tuple[WireClient, Any]:
    client = await WireClient.connect(entry)
    control = await client.session()
    await control.send(
        Subscribe(
            tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, start=StartOffset(offset=0)
        )
    )
    subscribed = await control.recv()
    assert isinstance(subscribed, Subscribed), subscribed
    return client, await client.event_stream(subscribed.subscription_id)


async def until_moved(events: Any) -> tuple[int, ShardMoved]:
    """Records delivered (checked gap-free from 0), then the shard_moved that ends them."""
    delivered = 0
    while True:
        frame = await events.recv(timeout=10)
        if isinstance(frame, ShardMoved):
            await events.expect_end()
            return delivered, frame
        assert isinstance(frame, BATCHES), frame
        assert frame.base_offset == delivered, (frame.base_offset, delivered)
        delivered += len(frame.payloads)


async def test_a_member_told_to_stop_hands_its_shards_off_first(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        other = next(n for n in NODES if n != owner)
        client = await WireClient.connect(fleet.entry(other))
        sub, events = await open_subscriber(fleet.entry(owner))
        try:
            stream = await client.session()
            for i in range(5):
                await stream.send(publish(f"r{i}".encode(), i + 1))
                assert await stream.recv() == PublishOk(request_id=i + 1)
            # What SIGTERM runs first (felix_broker/cli.py): readiness off, its own
            # drain asked for, serving on until it leads nothing.
            handing = asyncio.get_running_loop().create_task(fleet.brokers[owner].hand_off())
            n = 5
            while not handing.done():  # publishes through the hand-off: none refused
                n += 1
                await stream.send(publish(f"r{n - 1}".encode(), n))
                assert await stream.recv(timeout=15) == PublishOk(request_id=n)
            await handing
            assert fleet.leader() != owner
            assert fleet.brokers[owner].health.state.value == "draining"
            delivered, moved = await until_moved(events)
            assert moved.node_id == fleet.leader()
            assert moved.resume_from == delivered
            log = await read_all(fleet.entry(fleet.leader()), 0, n)
            assert [p for _, p in log] == [f"r{i}".encode() for i in range(n)]
        finally:
            client.close()
            sub.close()


async def test_a_rolling_restart_refuses_no_publish(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """Each member in turn does what SIGTERM runs (hand its shards off, then stop) and
    starts again on its data, while a client publishes through a member that stays
    up: every publish is acknowledged, and the shard holds each once, in order."""
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        n = 0
        for node in NODES:
            entry = next(other for other in NODES if other != node)
            client = await WireClient.connect(fleet.entry(entry))
            try:
                stream = await client.session()

                async def restart(node: str = node) -> None:
                    await fleet.brokers[node].hand_off()
                    await fleet.restart(node)

                restarting = asyncio.get_running_loop().create_task(restart())
                while not restarting.done():
                    n += 1
                    await stream.send(publish(f"r{n - 1}".encode(), n))
                    assert await stream.recv(timeout=15) == PublishOk(request_id=n), node
                await restarting
            finally:
                client.close()

            def rejoined() -> bool:
                views = [b.fleet.view.snapshot for b in fleet.brokers.values() if b.fleet]
                return all(len(v.members) == 3 for v in views) and fleet.settled_on(fleet.leader())

            await eventually(rejoined, within=30, what=f"{node} back as a member")
        assert n > len(NODES)  # publishes went on through every restart
        log = await read_all(fleet.entry(fleet.leader()), 0, n)
        assert [p for _, p in log] == [f"r{i}".encode() for i in range(n)]


async def test_a_lapsed_lease_ends_the_readers_of_every_shard_it_led(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        seed = await WireClient.connect(fleet.entry(owner))
        sub, events = await open_subscriber(fleet.entry(owner))
        try:
            stream = await seed.session()
            await stream.send(publish(b"one", 1))
            assert await stream.recv() == PublishOk(request_id=1)
            # What the membership does when the lease is judged lost (membership.py).
            broker_fleet = fleet.brokers[owner].fleet
            assert broker_fleet is not None
            broker_fleet.view.fence()
            delivered, moved = await until_moved(events)
            assert delivered == 1 and moved.resume_from == 1
            # No owner named: the client finds the shard again.
            assert moved.node_id is None and moved.addr is None
            broker_fleet.view.unfence()
        finally:
            seed.close()
            sub.close()


async def test_a_cache_shard_moves_with_its_values_and_counters_and_a_memory_shard_moves_empty(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader(CACHE)
        target = next(n for n in NODES if n != owner)
        kv = {"tenant_id": TENANT, "namespace": NS, "cache": CACHE.name}
        client = await WireClient.connect(fleet.entry(owner))
        try:
            stream = await client.session()
            await stream.send(CachePut(**kv, key="k", value=b"v1", request_id=1))
            assert isinstance(await stream.recv(), CacheOk)
            await stream.send(CounterAdd(**kv, key="hits", delta=5, request_id=2))
            assert (await stream.recv()).value == 5
        finally:
            client.close()
        # A watch at the old owner: ended with shard_moved naming the successor.
        watcher = await WireClient.connect(fleet.entry(owner))
        try:
            control = await watcher.session()
            await control.send(CacheWatch(**kv, key="k"))
            started = await control.recv()
            assert isinstance(started, CacheWatchStarted), started
            events = await watcher.event_stream(started.subscription_id)
            await fleet.placer.move(CACHE, target)
            moved = await events.recv(timeout=10)
            assert isinstance(moved, ShardMoved), moved
            assert moved.node_id == target and moved.subscription_id == started.subscription_id
            assert moved.resume_from is not None and moved.resume_from >= started.resume_offset
            await events.expect_end()
        finally:
            watcher.close()
        await eventually(lambda: fleet.settled_on(target, CACHE), within=30, what="cut over")
        client = await WireClient.connect(fleet.entry(target))
        try:
            stream = await client.session()
            await stream.send(CacheGet(**kv, key="k", request_id=3))
            got = await stream.recv()
            assert isinstance(got, CacheValue) and got.value == b"v1", got
            await stream.send(CounterAdd(**kv, key="hits", delta=1, request_id=4))
            assert (await stream.recv()).value == 6  # the counter continued
        finally:
            client.close()

        # An in-memory shard: nothing to copy; it cuts over and serves at once.
        mem_owner = fleet.leader(MEMORY)
        mem_target = next(n for n in NODES if n != mem_owner)
        await fleet.placer.move(MEMORY, mem_target)
        await eventually(lambda: fleet.settled_on(mem_target, MEMORY), within=30)
        client = await WireClient.connect(fleet.entry(mem_target))
        try:
            message = msgspec.structs.replace(publish(b"m", 1), stream=MEMORY.name)
            assert await client.request(message) == PublishOk(request_id=1)
        finally:
            client.close()


async def test_producer_sequences_move_with_the_shard(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        target = next(n for n in NODES if n != owner)

        def idem(sequence: int, *payloads: bytes, rid: int) -> PublishIdempotent:
            return PublishIdempotent(
                tenant_id=TENANT,
                namespace=NS,
                stream=STREAM,
                payloads=list(payloads),
                request_id=rid,
                producer_id=0x1234_5678,
                sequence=sequence,
            )

        client = await WireClient.connect(fleet.entry(owner))
        try:
            stream = await client.session()
            await stream.send(idem(0, b"a", b"b", rid=1))
            assert await stream.recv() == PublishOk(request_id=1, offset=0)
            await stream.send(idem(1, b"c", rid=2))
            assert await stream.recv() == PublishOk(request_id=2, offset=2)
        finally:
            client.close()
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=30, what="cut over")
        client = await WireClient.connect(fleet.entry(target))
        try:
            stream = await client.session()
            # A resend of the last batch is remembered at the new owner: nothing appended.
            await stream.send(idem(1, b"c", rid=3))
            assert await stream.recv() == PublishOk(request_id=3, offset=2)
            await stream.send(idem(2, b"d", rid=4))
            assert await stream.recv() == PublishOk(request_id=4, offset=3)
            await stream.send(idem(4, b"f", rid=5))
            refused = await stream.recv()
            assert refused.reason == PublishRefusal(sequence_gap=SequenceGap(expected=3))
        finally:
            client.close()
        log = await read_all(fleet.entry(target), 0, 4)
        assert [p for _, p in log] == [b"a", b"b", b"c", b"d"]
        await read_more_is_nothing(fleet.entry(target), 4)


async def test_a_group_poll_waiting_when_its_shard_leaves_answers_empty(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        target = next(n for n in NODES if n != owner)
        client = await WireClient.connect(fleet.entry(owner))
        try:
            stream = await client.session()
            poll = GroupPoll(
                tenant_id=TENANT, namespace=NS, stream=STREAM, shard=0, group=GROUP,
                max_records=5, wait_ms=20_000, request_id=1,
            )  # fmt: skip
            await stream.send(poll)
            await stream.nothing(wait=0.3)  # waiting: nothing to take
            started = asyncio.get_running_loop().time()
            await fleet.placer.move(SHARD, target)
            answer = await stream.recv(timeout=10)
            assert answer == GroupRecords(records=[], request_id=1), answer
            assert asyncio.get_running_loop().time() - started < 10
        finally:
            client.close()


async def test_the_old_leader_removes_its_stale_copy_after_the_cut_over(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    from felix_broker.storage.paths import log_dir

    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        target = next(n for n in NODES if n != owner)

        def folder(node: str) -> Path:
            root = tmp_path / node / "durable"
            return log_dir(root, "streams", TENANT, NS, STREAM, 0)

        client = await WireClient.connect(fleet.entry(owner))
        try:
            for i in range(3):
                answer = await client.request(publish(b"r%d" % i, i + 1))
                assert isinstance(answer, PublishOk), answer
        finally:
            client.close()
        assert folder(owner).is_dir()
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=30, what="cut over")
        await eventually(lambda: not folder(owner).exists(), within=10, what="stale copy gone")
        assert folder(target).is_dir()
        assert [p for _, p in await read_all(fleet.entry(target), 0, 3)] == [b"r0", b"r1", b"r2"]
        # Moved back, the old leader gets a fresh copy (with what was written meanwhile).
        client = await WireClient.connect(fleet.entry(target))
        try:
            assert isinstance(await client.request(publish(b"r3", 9)), PublishOk)
        finally:
            client.close()
        await fleet.placer.move(SHARD, owner)
        await eventually(lambda: fleet.settled_on(owner), within=30, what="moved back")
        await eventually(lambda: not folder(target).exists(), within=10, what="gone again")
        log = await read_all(fleet.entry(owner), 0, 4)
        assert [p for _, p in log] == [b"r0", b"r1", b"r2", b"r3"]


async def test_a_shard_with_files_larger_than_the_hello_cap_moves(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    # Each move_chunk (1 MiB of data, base64) rides a single request's stream right
    # after its hello: it must be read under the cap that follows hello_ok.
    async with moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        target = next(n for n in NODES if n != owner)
        payloads = [bytes([i]) * (256 * 1024) for i in range(8)]  # 2 MiB in one segment
        client = await WireClient.connect(fleet.entry(owner))
        try:
            for i, payload in enumerate(payloads, start=1):
                assert isinstance(await client.request(publish(payload, i)), PublishOk)
        finally:
            client.close()
        await fleet.placer.move(SHARD, target)
        await eventually(lambda: fleet.settled_on(target), within=30, what="cut over")
        log = await read_all(fleet.entry(target), 0, len(payloads))
        assert [p for _, p in log] == payloads
