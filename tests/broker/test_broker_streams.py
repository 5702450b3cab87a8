"""Publishing and subscribing over real QUIC: every publish form, acks, refusals, delivery."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from felix_transport import StreamClosedError
from felix_wire.binary import (
    AckStatus,
    BinaryAckMode,
    EventBatchLegacyFrame,
    EventBatchSharedFrame,
    PublishAckFrame,
    PublishBatchFrame,
)
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.frame import encode_header
from felix_wire.messages import (
    AckMode,
    Error,
    EventBatch,
    Publish,
    PublishBatch,
    PublishError,
    PublishOk,
    StartOffset,
    Subscribe,
    SubscribeCursorError,
    Subscribed,
)
from felix_wire.routing import shard_for_key

from ..fleet.harness import THROUGH_LEADER, TOPOLOGIES, leader_of, unhinted
from ..support.wire import NS, TENANT, Feature, Flag, WireClient, token
from .harness import running_broker, subscribe

pytestmark = pytest.mark.timeout(40)


def batch(stream: str = "orders", *payloads: bytes, **kw: object) -> PublishBatchFrame:
    return PublishBatchFrame(
        tenant_id=kw.pop("tenant", TENANT),
        namespace=NS,
        stream=stream,
        payloads=list(payloads),
        **kw,
    )


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_binary_publish_forms_and_their_answers(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        subscriber = await WireClient.connect(leader_of(broker))
        _, events = await subscribe(subscriber)
        pub, _ = await client.authed()
        await pub.send(batch("orders", b"plain"))  # 0x0001: never answered
        await pub.send(batch("orders", b"keyed", key=b"k"))  # 0x0041: never answered
        await pub.nothing()
        await pub.send(batch("orders", b"acked", request_id=7, ack_mode=BinaryAckMode.PER_MESSAGE))
        assert unhinted(await pub.recv(), broker) == PublishAckFrame(
            status=AckStatus.OK, request_id=7, message=""
        )
        await pub.send(
            batch("orders", b"both", request_id=8, ack_mode=BinaryAckMode.PER_BATCH, key=b"")
        )
        assert unhinted(await pub.recv(), broker) == PublishAckFrame(
            status=AckStatus.OK, request_id=8, message=""
        )
        got: list[bytes] = []
        while len(got) < 4:
            frame = await events.recv()  # type: ignore[attr-defined]
            assert isinstance(frame, EventBatchSharedFrame)
            assert frame.base_offset is None and frame.timestamps is None  # in-memory: no offsets
            got.extend(frame.payloads)
        assert got == [b"plain", b"keyed", b"acked", b"both"]
        client.close()
        subscriber.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_json_publishes_and_acks(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        subscriber = await WireClient.connect(leader_of(broker))
        _, events = await subscribe(subscriber)
        pub, _ = await client.authed()
        await pub.send(Publish(tenant_id=TENANT, namespace=NS, stream="orders", payload=b"one"))
        await pub.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="orders",
                payload=b"two",
                request_id=1,
                ack=AckMode.PER_MESSAGE,
            )
        )
        assert await pub.recv() == PublishOk(request_id=1)
        await pub.send(
            PublishBatch(
                tenant_id=TENANT,
                namespace=NS,
                stream="orders",
                payloads=[b"3", b"4"],
                request_id=2,
                ack=AckMode.PER_BATCH,
            )
        )
        assert await pub.recv() == PublishOk(request_id=2)
        await pub.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="orders",
                payload=b"x",
                ack=AckMode.PER_MESSAGE,
            )
        )
        refusal = await pub.recv()
        assert isinstance(refusal, Error) and refusal.code == "invalid_request"
        got: list[bytes] = []
        while len(got) < 4:
            got.extend((await events.recv()).payloads)  # type: ignore[attr-defined]
        assert got == [b"one", b"two", b"3", b"4"]
        client.close()
        subscriber.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_refusals_of_a_binary_acked_publish(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        await pub.send(batch("missing", b"x", request_id=1, ack_mode=BinaryAckMode.PER_MESSAGE))
        ack = await pub.recv()
        assert isinstance(ack, PublishAckFrame) and ack.status is AckStatus.ERROR
        assert (ack.code, ack.retry) == (ErrorCode.NOT_FOUND, RetryClass.RETRY_AFTER)
        assert ack.message.startswith("stream not found")
        await pub.send(
            batch("other", b"x", tenant="t2", request_id=2, ack_mode=BinaryAckMode.PER_MESSAGE)
        )
        ack = await pub.recv()
        assert isinstance(ack, PublishAckFrame) and ack.code == ErrorCode.FORBIDDEN
        limited, _ = await client.authed(tok=token(broker, perms=["stream.subscribe:stream:t1/*"]))
        await limited.send(batch("orders", b"x", request_id=3, ack_mode=BinaryAckMode.PER_MESSAGE))
        ack = await limited.recv()
        assert isinstance(ack, PublishAckFrame) and (ack.code, ack.retry) == (
            ErrorCode.FORBIDDEN,
            RetryClass.FATAL,
        )
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_binary_ack_carries_only_what_the_client_offered(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        bare, _ = await client.authed(
            flags=int(
                Flag.BINARY_PUBLISH_BATCH | Flag.BINARY_PUBLISH_ACKED | Flag.BINARY_PUBLISH_ACK
            )
        )
        await bare.send(batch("missing", b"x", request_id=1, ack_mode=BinaryAckMode.PER_MESSAGE))
        ack = await bare.recv()
        assert isinstance(ack, PublishAckFrame) and ack.code is None and ack.retry is None
        # Without BINARY_PUBLISH_ACK the answer is JSON.
        json_only, _ = await client.authed(
            flags=int(Flag.BINARY_PUBLISH_BATCH | Flag.BINARY_PUBLISH_ACKED), features=0
        )
        await json_only.send(
            batch("missing", b"x", request_id=2, ack_mode=BinaryAckMode.PER_MESSAGE)
        )
        answer = await json_only.recv()
        assert isinstance(answer, PublishError) and answer.request_id == 2 and answer.code is None
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_malformed_acked_body_is_answered_by_its_request_id(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        body = struct.pack(">QB", 42, 1) + b"\x00\x05t1"  # tenant length runs past the end
        await pub.send(encode_header(0x0009, len(body)) + body)
        ack = await pub.recv()
        assert (
            isinstance(ack, PublishAckFrame)
            and ack.request_id == 42
            and ack.code == ErrorCode.INVALID_REQUEST
        )
        await pub.send(batch("orders", b"ok", request_id=43, ack_mode=BinaryAckMode.PER_MESSAGE))
        assert (await pub.recv()).status is AckStatus.OK  # type: ignore[union-attr]
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_pipelined_acks_come_back_in_order(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, ack_on_commit=True, topology=topology) as broker:
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        for rid in range(1, 201):
            await pub.send(
                batch("orders", b"p" * 10, request_id=rid, ack_mode=BinaryAckMode.PER_MESSAGE)
            )
        ids = [(await pub.recv()).request_id for _ in range(200)]  # type: ignore[union-attr]
        assert ids == list(range(1, 201))
        client.close()


async def test_full_tenant_queue_answers_overloaded_and_queues_nothing(tmp_path: Path) -> None:
    settings = {
        "pub_queue_depth": 1,
        "publish_queue_wait_timeout_ms": 0,
        "subscriber_queue_capacity": 1,
        "subscriber_queue_policy": "block",
    }
    async with running_broker(tmp_path, **settings) as broker:
        # The stalled subscriber gets a connection of its own: qh3 pauses a whole
        # connection while one of its streams is over its receive bound.
        stalled = await WireClient.connect(broker)
        await subscribe(stalled)  # a subscriber that never reads its event stream
        client = await WireClient.connect(broker)
        pub, _ = await client.authed()
        big = b"x" * 60_000
        refused = None
        for rid in range(1, 400):
            await pub.send(batch("orders", big, request_id=rid, ack_mode=BinaryAckMode.PER_MESSAGE))
            answer = await pub.recv()
            assert isinstance(answer, PublishAckFrame)
            if answer.status is AckStatus.ERROR:
                refused = answer
                break
        assert refused is not None, "the queue never filled"
        assert (refused.code, refused.retry) == (ErrorCode.OVERLOADED, RetryClass.RETRY_AFTER)
        assert (refused.reason, refused.retry_after_ms) == ("publish_queue_full", 10)
        metrics = broker.metrics.exposition().decode()
        assert 'felix_tenant_publish_queue_full_total{tenant="t1"} 1.0' in metrics
        client.close()
        stalled.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_subscription_outlives_its_control_stream_and_ends_on_stop_sending(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        control, _ = await client.authed()
        await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
        answer = await control.recv()
        assert isinstance(answer, Subscribed)
        await control.stream.write(b"", end_stream=True)  # what the official client does
        control.stream.stop_sending(0)
        events = await client.event_stream()
        await events.recv()  # hello
        pub, _ = await client.authed()
        await pub.send(batch("orders", b"after-close"))
        frame = await events.recv()
        assert isinstance(frame, EventBatchSharedFrame) and frame.payloads == [b"after-close"]
        events.stream.stop_sending(0)
        shard = broker.engine.shard(broker.engine.stream(TENANT, NS, "orders"), 0)  # type: ignore[union-attr, arg-type]
        await pub.send(batch("orders", b"wakes the writer"))
        for _ in range(100):
            if not shard.subscribers:
                break
            await asyncio.sleep(0.02)
        assert shard.subscribers == []
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_connection_close_ends_its_subscriptions(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        await subscribe(client)
        shard = broker.engine.shard(broker.engine.stream(TENANT, NS, "orders"), 0)  # type: ignore[union-attr, arg-type]
        assert len(shard.subscribers) == 1
        client.close()
        for _ in range(100):
            if not shard.subscribers:
                break
            await asyncio.sleep(0.02)
        assert shard.subscribers == []


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_subscribe_refusals(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology, max_subscriptions_per_conn=1) as broker:
        client = await WireClient.connect(broker)
        control, _ = await client.authed()
        for request, code in [
            (Subscribe(tenant_id=TENANT, namespace=NS, stream="missing"), "not_found"),
            (Subscribe(tenant_id="t2", namespace=NS, stream="other"), "forbidden"),
            (
                Subscribe(tenant_id=TENANT, namespace=NS, stream="orders", shard=1),
                "invalid_request",
            ),
        ]:
            await control.send(request)
            answer = await control.recv()
            assert isinstance(answer, Error) and answer.code == code, answer
        await control.send(
            Subscribe(tenant_id=TENANT, namespace=NS, stream="orders", start=StartOffset(offset=5))
        )
        assert await control.recv() == SubscribeCursorError(
            reason="in_future", requested=5, available=0
        )
        await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
        assert isinstance(await control.recv(), Subscribed)
        await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
        answer = await control.recv()
        assert isinstance(answer, Error) and answer.code == "limit_exceeded"
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_queue_capacity_is_clamped_and_echoed(tmp_path: Path, topology: str) -> None:
    async with running_broker(
        tmp_path, topology=topology, subscriber_queue_capacity=50, subscriber_queue_capacity_max=100
    ) as broker:
        client = await WireClient.connect(broker)
        answer, _ = await subscribe(client, queue_capacity=5000)
        assert answer.queue_capacity == 100
        plain, _ = await subscribe(client)
        assert plain.queue_capacity is None
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_delivery_layout_follows_what_the_client_offered(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _, legacy = await subscribe(
            client, auth={"flags": int(Flag.BINARY_EVENT_BATCH | Flag.EVENT_BATCH_PUBLISHER)}
        )
        _, json_events = await subscribe(
            client, auth={"flags": int(Flag.BINARY_PUBLISH_BATCH), "features": 0}
        )
        _, shared = await subscribe(client)
        pub, _ = await client.authed(tok=token(broker, subject="alice"))
        await pub.send(batch("orders", b"a", b"b"))
        legacy_frame = await legacy.recv()  # type: ignore[attr-defined]
        assert isinstance(legacy_frame, EventBatchLegacyFrame)
        assert (legacy_frame.payloads, legacy_frame.publisher) == ([b"a", b"b"], "alice")
        json_frame = await json_events.recv()  # type: ignore[attr-defined]
        assert json_frame == EventBatch(
            tenant_id=TENANT, namespace=NS, stream="orders", payloads=[b"a", b"b"]
        )
        shared_frame = await shared.recv()  # type: ignore[attr-defined]
        assert isinstance(shared_frame, EventBatchSharedFrame) and shared_frame.publisher is None
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_a_slow_subscriber_drops_and_never_slows_the_others(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(
        tmp_path, topology=topology, subscriber_queue_capacity=2, event_batch_max_events=1
    ) as broker:
        client = await WireClient.connect(broker)
        slow_client = await WireClient.connect(broker)
        _, fast = await subscribe(client, queue_capacity=4096)  # room for the whole burst
        await subscribe(slow_client)  # default capacity 2, never reads
        pub, _ = await client.authed()
        total = 3000
        payload = b"y" * 2000
        for _ in range(0, total, 100):
            await pub.send(batch("orders", *[payload] * 100))
        received = 0
        while received < total:
            received += len((await fast.recv(timeout=10)).payloads)  # type: ignore[attr-defined]
        assert received == total
        slow = next(
            sub
            for sub in broker.engine.shard(
                broker.engine.stream(TENANT, NS, "orders"), 0
            ).subscribers  # type: ignore[union-attr, arg-type]
            if sub.capacity == 2
        )
        assert slow.dropped > 0
        assert broker.metrics.subscriber_drops._value.get() == slow.dropped
        client.close()
        slow_client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_keyed_publishes_route_by_the_streams_function(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        subs = {}
        for shard in range(4):
            subs[shard] = (await subscribe(client, "wide", shard=shard))[1]
        pub, _ = await client.authed()
        keys = [f"customer-{i}".encode() for i in range(8)]
        for key in keys:
            await pub.send(batch("wide", key, key=key))
        expected: dict[int, list[bytes]] = {shard: [] for shard in range(4)}
        for key in keys:
            expected[shard_for_key(key, 4, "jump_hash")].append(key)
        for shard, wanted in expected.items():
            got: list[bytes] = []
            while len(got) < len(wanted):
                got.extend((await subs[shard].recv()).payloads)  # type: ignore[attr-defined]
            assert got == wanted  # per-shard order is publish order
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_publish_only_unidirectional_stream(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _, events = await subscribe(client)
        from felix_wire.codec import encode_frame
        from felix_wire.gating import client_auth

        uni = await client.connection.open_uni_stream()
        await uni.write(
            encode_frame(client_auth(TENANT, token(broker), client_flags=0x1FFF, client_features=0))
        )
        await uni.write(
            encode_frame(
                batch("orders", b"via-uni", request_id=1, ack_mode=BinaryAckMode.PER_MESSAGE)
            )
        )
        frame = await events.recv()  # type: ignore[attr-defined]
        assert frame.payloads == [b"via-uni"]
        await uni.write(encode_frame(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders")))
        with pytest.raises(StreamClosedError):  # anything but publishes closes it
            for _ in range(50):
                await uni.write(b"\x00")
                await asyncio.sleep(0.02)
        client.close()


def test_features_advertised_match_what_is_served() -> None:
    from felix_broker.app import SERVER_FEATURES

    assert SERVER_FEATURES & Feature.FEATURE_ACK_ON_COMMIT
    assert not SERVER_FEATURES & Feature.FEATURE_SUBSCRIPTION_LAGGED
