"""Durable streams over real QUIC: offsets, replay joined to live delivery, bounded reads,
time lookups, acks with offsets, lagged subscribers, restarts and kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from felix_wire.binary import (
    AckStatus,
    BinaryAckMode,
    EventBatchSharedFrame,
    PublishAckFrame,
    PublishBatchFrame,
)
from felix_wire.messages import (
    Error,
    OffsetForTime,
    OffsetValue,
    PublishOk,
    StartOffset,
    StreamRead,
    StreamRecords,
    Subscribe,
    SubscribeCursorError,
    Subscribed,
    SubscriptionLagged,
)

from ..fleet.harness import THROUGH_LEADER, TOPOLOGIES
from ..support.broker_process import broker_process, free_udp_port
from ..support.wire import (
    NS,
    OFFICIAL_FEATURES,
    TENANT,
    BrokerProcess,
    Feature,
    Flag,
    WireClient,
    WireStream,
    token,
)
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)

EVERYTHING = 0x7FFF  # every event modifier, for the subscriber side


def publish(*payloads: bytes, stream: str = "log", **kw: object) -> PublishBatchFrame:
    return PublishBatchFrame(
        tenant_id=TENANT, namespace=NS, stream=stream, payloads=list(payloads), **kw
    )


async def events_until(stream: object, count: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    while len(got) < count:
        frame = await stream.recv(timeout=10)  # type: ignore[attr-defined]
        assert isinstance(frame, EventBatchSharedFrame), frame
        assert frame.base_offset is not None
        got.extend((frame.base_offset + i, p) for i, p in enumerate(frame.payloads))
    return got


async def subscribe(client: WireClient, **kw: object) -> tuple[Subscribed, object]:
    flags = kw.pop("flags", EVERYTHING)
    features = kw.pop("features", OFFICIAL_FEATURES)
    control, _ = await client.authed(flags=flags, features=features)  # type: ignore[arg-type]
    await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="log", **kw))
    answer = await control.recv()
    if not isinstance(answer, Subscribed):
        return answer, None  # type: ignore[return-value]
    events = await client.event_stream()
    await events.recv()  # hello
    return answer, events


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_offsets_times_and_replay_from_earliest(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology, record_publishers=True) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        for i in range(3):
            await pub.send(
                publish(f"m{i}".encode(), request_id=i + 1, ack_mode=BinaryAckMode.PER_MESSAGE)
            )
            assert (await pub.recv()).status is AckStatus.OK  # type: ignore[union-attr]
        before = time.time_ns() // 1000
        answer, events = await subscribe(client, start="earliest")
        assert (answer.start_offset, answer.live_offset) == (0, 3)
        await pub.send(publish(b"live"))
        frames: list[EventBatchSharedFrame] = []
        got = []
        while len(got) < 4:
            frame = await events.recv()  # type: ignore[attr-defined]
            frames.append(frame)
            got.extend((frame.base_offset + i, p) for i, p in enumerate(frame.payloads))
        assert got == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"live")]
        assert all(f.publisher == "tester" for f in frames)
        assert frames[-1].timestamps is not None and frames[-1].timestamps[0] >= before
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_subscribed_offsets_only_for_offset_clients(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        plain, events = await subscribe(client, flags=int(Flag.BINARY_EVENT_BATCH_SHARED))
        assert (plain.start_offset, plain.live_offset) == (None, None)
        pub, _ = await client.authed()
        await pub.send(publish(b"x"))
        frame = await events.recv()  # type: ignore[attr-defined]
        assert isinstance(frame, EventBatchSharedFrame) and frame.base_offset is None
        latest, _ = await subscribe(client)
        assert latest.start_offset == latest.live_offset == 1
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_replay_joins_live_with_no_gap_and_no_duplicate(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(
        tmp_path, topology=topology, subscriber_queue_capacity=4096
    ) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        total = 6000

        async def publisher() -> None:
            for i in range(0, total, 50):
                await pub.send(publish(*[f"{i + j}".encode() for j in range(50)]))
                if i % 500 == 0:
                    await asyncio.sleep(0.005)

        task = asyncio.get_running_loop().create_task(publisher())
        await asyncio.sleep(0.05)  # some history, more on its way
        subscribers = []
        for start in ("earliest", StartOffset(offset=0), StartOffset(offset=0)):
            subscribers.append((await subscribe(client, start=start, queue_capacity=4096))[1])
            await asyncio.sleep(0.02)
        await task
        for events in subscribers:
            got = await events_until(events, total)
            assert [offset for offset, _ in got] == list(range(total))
            assert [int(p) for _, p in got] == list(range(total))
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_cursor_errors(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        await pub.send(publish(b"a", b"b", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        await pub.recv()
        answer, _ = await subscribe(client, start=StartOffset(offset=3))
        assert answer == SubscribeCursorError(reason="in_future", requested=3, available=2)
        at_tail, _ = await subscribe(client, start=StartOffset(offset=2))
        assert isinstance(at_tail, Subscribed) and at_tail.start_offset == 2
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_acks_after_the_write_carry_the_first_offset(tmp_path: Path, topology: str) -> None:
    async with running_broker(
        tmp_path, topology=topology, ack_on_commit=True, durable_fsync_mode="on_commit"
    ) as broker:
        client = await WireClient.connect(broker)
        binary, _ = await client.authed()
        await binary.send(publish(b"a", b"b", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await binary.recv()
        assert isinstance(ack, PublishAckFrame) and ack.offset == 0
        no_offset_flag = int(
            Flag.BINARY_PUBLISH_BATCH | Flag.BINARY_PUBLISH_ACKED | Flag.BINARY_PUBLISH_ACK
        )
        bare, _ = await client.authed(flags=no_offset_flag)
        await bare.send(publish(b"c", request_id=2, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await bare.recv()
        assert isinstance(ack, PublishAckFrame) and ack.offset is None
        json_client, _ = await client.authed(
            flags=int(Flag.BINARY_PUBLISH_ACK_OFFSET | Flag.BINARY_PUBLISH_BATCH)
        )
        from felix_wire.messages import AckMode, Publish

        await json_client.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="log",
                payload=b"d",
                request_id=3,
                ack=AckMode.PER_MESSAGE,
            )
        )
        assert await json_client.recv() == PublishOk(request_id=3, offset=3)
        # In-memory streams never report offsets.
        await binary.send(
            publish(b"m", stream="orders", request_id=4, ack_mode=BinaryAckMode.PER_BATCH)
        )
        ack = await binary.recv()
        assert isinstance(ack, PublishAckFrame) and ack.offset is None
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_client_feature_ack_on_commit_asks_for_offsets(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        asked, _ = await client.authed(
            features=OFFICIAL_FEATURES | int(Feature.FEATURE_ACK_ON_COMMIT)
        )
        await asked.send(publish(b"a", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        assert (await asked.recv()).offset == 0  # type: ignore[union-attr]
        default, _ = await client.authed()
        await default.send(publish(b"b", request_id=2, ack_mode=BinaryAckMode.PER_BATCH))
        assert (await default.recv()).offset is None  # type: ignore[union-attr]  # answered when queued
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_stream_read_pages_and_offset_for_time(tmp_path: Path, topology: str) -> None:
    async with running_broker(
        tmp_path, topology=topology, durable_max_records_per_read=4
    ) as broker:
        client = await WireClient.connect(broker)
        stream, answer = await client.authed()
        assert answer.server_features & Feature.FEATURE_STREAM_READ  # type: ignore[union-attr]
        first_batch_time = time.time_ns() // 1000
        await stream.send(
            publish(
                *[f"r{i}".encode() for i in range(6)],
                request_id=1,
                ack_mode=BinaryAckMode.PER_BATCH,
            )
        )
        await stream.recv()
        await asyncio.sleep(0.01)
        second_batch_time = time.time_ns() // 1000
        await stream.send(publish(b"late", request_id=2, ack_mode=BinaryAckMode.PER_BATCH))
        await stream.recv()
        read = StreamRead(
            tenant_id=TENANT, namespace=NS, stream="log", shard=0, from_=1, request_id=3
        )
        await stream.send(read)
        page = await stream.recv()
        assert isinstance(page, StreamRecords)
        assert [r.offset for r in page.records] == [1, 2, 3, 4] and page.next_offset == 5
        assert all(r.timestamp_micros >= first_batch_time for r in page.records)
        await stream.send(
            StreamRead(
                tenant_id=TENANT, namespace=NS, stream="log", shard=0, from_=5, end=6, request_id=4
            )
        )
        page = await stream.recv()
        assert [r.payload for r in page.records] == [b"r5"] and page.next_offset == 6  # type: ignore[union-attr]
        await stream.send(
            StreamRead(tenant_id=TENANT, namespace=NS, stream="log", shard=0, from_=7, request_id=5)
        )
        assert await stream.recv() == StreamRecords(
            records=[], next_offset=7, request_id=5
        )  # nothing yet
        await stream.send(
            StreamRead(tenant_id=TENANT, namespace=NS, stream="log", shard=0, from_=9, request_id=6)
        )
        assert await stream.recv() == SubscribeCursorError(
            reason="in_future", requested=9, available=7
        )
        await stream.send(
            StreamRead(
                tenant_id=TENANT, namespace=NS, stream="orders", shard=0, from_=0, request_id=7
            )
        )
        refused = await stream.recv()
        assert isinstance(refused, Error) and refused.code == "invalid_request"
        for at, expected in (
            (0, 0),
            (second_batch_time, 6),
            (time.time_ns() // 1000 + 10**7, None),
        ):
            await stream.send(
                OffsetForTime(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="log",
                    shard=0,
                    at_micros=at,
                    request_id=8,
                )
            )
            assert await stream.recv() == OffsetValue(offset=expected, request_id=8)
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_a_lagging_subscriber_is_ended_with_subscription_lagged(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(
        tmp_path, topology=topology, subscriber_queue_capacity=1, event_batch_max_events=1
    ) as broker:
        slow = await WireClient.connect(broker)
        _, events = await subscribe(slow)  # offers SUBSCRIPTION_LAGGED and offsets
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        for _ in range(20):
            await pub.send(publish(*[b"z" * 30_000] * 10))
        last = None
        offsets: list[int] = []
        while True:
            frame = await events.recv(timeout=10)  # type: ignore[attr-defined]
            if isinstance(frame, SubscriptionLagged):
                last = frame
                break
            offsets.extend(frame.base_offset + i for i in range(len(frame.payloads)))
        assert offsets == list(range(len(offsets)))  # contiguous up to the drop
        assert last.resume_from == len(offsets)
        await events.expect_end()  # type: ignore[attr-defined]
        client.close()
        slow.close()


async def test_restart_keeps_offsets_and_history(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        await pub.send(publish(b"before", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        await pub.recv()
        client.close()
    async with running_broker(tmp_path, ack_on_commit=True) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        await pub.send(publish(b"after", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        assert (await pub.recv()).offset == 1  # type: ignore[union-attr]
        _, events = await subscribe(client, start="earliest")
        assert await events_until(events, 2) == [(0, b"before"), (1, b"after")]
        url = f"http://127.0.0.1:{broker.http_port}/backup/offsets"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        status = json.loads(body)
        assert {
            "tenant_id": "t1",
            "namespace": NS,
            "name": "log",
            "shard": 0,
            "kind": "stream",
            "generation": 0,
            "logs": {"records": 2},
        } in status["shards"]
        client.close()


def test_acknowledged_records_survive_kill_9(tmp_path: Path) -> None:
    """on_commit acks: kill -9 the broker at random points, restart, check every
    acknowledged record is there exactly once, in order, offsets unchanged."""
    data = tmp_path / "data"
    port = free_udp_port()
    acknowledged: dict[int, bytes] = {}
    rng = random.Random(7)
    for round_ in range(3):
        with broker_process(tmp_path, port, FELIX_ACK_ON_COMMIT="true") as process:
            acked = asyncio.run(
                _publish_until_killed(data, port, process, round_, rng.uniform(0.2, 0.8))
            )
        for offset, payload in acked:
            assert offset not in acknowledged
            acknowledged[offset] = payload
    assert acknowledged, "nothing was acknowledged"
    records = asyncio.run(_read_all(tmp_path, port))
    by_offset = dict(records)
    assert [o for o, _ in records] == list(range(len(records)))  # contiguous, in order, once
    for offset, payload in acknowledged.items():
        assert by_offset[offset] == payload


async def _client(data: Path, port: int) -> WireStream:
    """An authenticated stream to the broker process on `port` keeping its files in `data`."""
    broker = BrokerProcess(port, data)
    client = await WireClient.connect(broker)
    stream, _ = await client.authed(flags=0x1FFF, features=0, tok=token(broker, subject="crash"))
    return stream


async def _publish_until_killed(
    data: Path, port: int, process: subprocess.Popen[bytes], round_: int, after: float
) -> list[tuple[int, bytes]]:
    stream = await _client(data, port)
    acked: list[tuple[int, bytes]] = []
    loop = asyncio.get_running_loop()
    loop.call_later(after, lambda: os.kill(process.pid, signal.SIGKILL))
    sent: dict[int, bytes] = {}
    try:
        for rid in range(1, 100_000):
            payload = f"{round_}-{rid}".encode()
            sent[rid] = payload
            await stream.send(publish(payload, request_id=rid, ack_mode=BinaryAckMode.PER_BATCH))
            ack = await stream.recv(timeout=3)
            assert (
                isinstance(ack, PublishAckFrame)
                and ack.status is AckStatus.OK
                and ack.offset is not None
            )
            acked.append((ack.offset, sent[ack.request_id]))
    except (EOFError, TimeoutError, OSError, Exception):
        pass
    return acked


async def _read_all(tmp: Path, port: int) -> list[tuple[int, bytes]]:
    with broker_process(tmp, port, end=signal.SIGTERM, FELIX_ACK_ON_COMMIT="true"):
        stream = await _client(tmp / "data", port)
        records: list[tuple[int, bytes]] = []
        position = 0
        while True:
            await stream.send(
                StreamRead(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="log",
                    shard=0,
                    from_=position,
                    request_id=position + 1,
                )
            )
            page = await stream.recv()
            assert isinstance(page, StreamRecords)
            if not page.records:
                return records
            records.extend((r.offset, r.payload) for r in page.records)
            position = page.next_offset
