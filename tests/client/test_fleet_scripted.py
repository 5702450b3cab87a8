"""The client's fleet rules against scripted brokers (real QUIC and TLS, both stacks):
topology, not_leader (hops, visits, generations), back to the entry once,
shard_moved resumes, owner hints on binary acks, and what is never resent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import felix_client
from felix_client import ClientConfig
from felix_client.errors import NotLeaderError, ShardUnavailableError, UnacknowledgedError
from felix_wire.binary import AckStatus, PublishAckFrame
from felix_wire.messages import (
    ShardOwner,
    ShardOwnersView,
    StartOffset,
    StreamRecords,
    Subscribed,
)

from .scripted import (
    Reply,
    ScriptedBroker,
    ScriptedFleet,
    batch,
    moved,
    refusal,
    scripted_fleet,
    topology,
)

pytestmark = pytest.mark.timeout(60)

IMPLS = ["qh3", "aioquic"]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FELIX_QUIC_IMPL", request.param)
    return str(request.param)


@pytest.fixture
async def fleet(tmp_path: Path, impl: str) -> AsyncIterator[ScriptedFleet]:
    async with scripted_fleet(tmp_path, 5, impl) as brokers:
        yield brokers


async def connect(fleet: ScriptedFleet, seed: ScriptedBroker, **config: Any) -> felix_client.Client:
    return await felix_client.connect(
        seed.addr,
        tenant_id="t1",
        token="scripted",
        ca_file=fleet.ca_file,
        config=ClientConfig(**{"connect_timeout": 1.0, "request_timeout": 5.0, **config}),
    )


def serve_subscribe(first: int, payloads: list[bytes], *, end: Any = None, sid: int = 1):  # type: ignore[no-untyped-def]
    """A subscribe handler that serves from the requested offset (or `first`)."""

    def handler(_b: ScriptedBroker, request: Any, reply: Reply) -> list[Any]:
        start = request.start.offset if isinstance(request.start, StartOffset) else first
        frames: list[Any] = [batch(request.stream, start, payloads)]
        if end is not None:
            frames.append(end)
        reply.events(sid, frames, end=end is not None)
        return [Subscribed(subscription_id=sid, start_offset=start)]

    return handler


def redirect_to(owner: ScriptedBroker | None, generation: int):  # type: ignore[no-untyped-def]
    def handler(broker: ScriptedBroker, _r: Any, _reply: Reply) -> list[Any]:
        return [broker.not_leader(owner, generation)]

    return handler


def starts(broker: ScriptedBroker) -> list[Any]:
    return [r.start for r in broker.got("subscribe")]


async def test_the_fleet_is_learned_from_one_seed_additively_and_again_after_a_reconnect(
    fleet: ScriptedFleet,
) -> None:
    a, b, c = fleet[0], fleet[1], fleet[2]
    a.on["topology"] = topology(b, c)  # the seed itself is not listed
    client = await connect(fleet, a)
    try:
        assert client.brokers == [a.addr, b.addr, c.addr]
        a.on["topology"] = topology()  # empty is valid, and drops nothing
        assert await client.refresh_topology() == [a.addr, b.addr, c.addr]
        asked = len(a.got("topology"))
        a.drop_connections()
        # The next request reconnects (to whichever known broker answers first).
        b.on["stream_shards"] = c.on["stream_shards"] = a.on["stream_shards"] = lambda *_: [
            refusal("invalid_request", "fatal")
        ]
        for broker in (b, c):
            broker.on["topology"] = topology()
        # A request may meet the dying connection (its outcome unknown); the next
        # one reconnects, and the replacement asks topology again.
        for _ in range(50):
            try:
                await client.stream_shards("orders")
            except felix_client.errors.InvalidRequestError:
                break
            except felix_client.errors.ConnectionLostError:
                await asyncio.sleep(0.05)
        for _ in range(100):
            if sum(len(x.got("topology")) for x in (a, b, c)) > asked:
                break
            await asyncio.sleep(0.05)
        assert sum(len(x.got("topology")) for x in (a, b, c)) > asked
        assert client.brokers == [a.addr, b.addr, c.addr]
    finally:
        await client.aclose()


async def test_a_redirected_subscription_keeps_its_start_offset(fleet: ScriptedFleet) -> None:
    a, b = fleet[0], fleet[1]
    a.on["subscribe"] = redirect_to(b, 3)
    b.on["subscribe"] = serve_subscribe(0, [b"x", b"y"])
    client = await connect(fleet, a)
    try:
        sub = await client.subscribe("log", shard=0, start=7)
        first = await sub.next(timeout=5)
        assert (first.offset, first.payload) == (7, b"x")
        assert starts(a) == [StartOffset(offset=7)]
        assert starts(b) == [StartOffset(offset=7)]
        assert sub.start_offset == 7
        await sub.aclose()
        # The redirect named b at generation 3: the next subscribe goes straight there.
        again = await client.subscribe("log", shard=0, start=9)
        assert (await again.next(timeout=5)).offset == 9
        assert len(a.got("subscribe")) == 1 and len(b.got("subscribe")) == 2
        await again.aclose()
    finally:
        await client.aclose()


async def test_at_most_three_hops(fleet: ScriptedFleet) -> None:
    a, b, c, d, e = fleet.brokers
    a.on["subscribe"] = redirect_to(b, 1)
    b.on["subscribe"] = redirect_to(c, 2)
    c.on["subscribe"] = redirect_to(d, 3)
    d.on["subscribe"] = redirect_to(e, 4)
    e.on["subscribe"] = serve_subscribe(0, [b"never"])
    client = await connect(fleet, a)
    try:
        with pytest.raises(NotLeaderError):
            await client.subscribe("log", shard=0, start=0)
        assert [len(x.got("subscribe")) for x in fleet.brokers] == [1, 1, 1, 1, 0]
    finally:
        await client.aclose()


async def test_never_the_same_broker_twice_in_one_attempt(fleet: ScriptedFleet) -> None:
    a, b = fleet[0], fleet[1]
    a.on["subscribe"] = redirect_to(b, 1)
    b.on["subscribe"] = redirect_to(a, 2)  # back to the entry: refused
    client = await connect(fleet, a)
    try:
        with pytest.raises(NotLeaderError):
            await client.subscribe("log", shard=0, start=0)
        assert (len(a.got("subscribe")), len(b.got("subscribe"))) == (1, 1)
    finally:
        await client.aclose()


async def test_a_redirect_older_than_the_generation_held_is_ignored(fleet: ScriptedFleet) -> None:
    a, b, c = fleet[0], fleet[1], fleet[2]
    a.on["subscribe"] = redirect_to(b, 5)
    b.on["subscribe"] = serve_subscribe(0, [b"b"])
    c.on["subscribe"] = serve_subscribe(0, [b"c"])
    client = await connect(fleet, a)
    try:
        await (await client.subscribe("log", shard=0, start=0)).aclose()  # holds b at 5
        b.on["subscribe"] = redirect_to(c, 4)  # older: ignored, c is never asked
        with pytest.raises(NotLeaderError):
            await client.subscribe("log", shard=0, start=0)
        assert c.got("subscribe") == []
        b.on["subscribe"] = redirect_to(c, 6)  # newer: followed
        sub = await client.subscribe("log", shard=0, start=0)
        assert (await sub.next(timeout=5)).payload == b"c"
        await sub.aclose()
        # The generation is per shard: shard 1 follows a generation-1 redirect.
        a.on["subscribe"] = redirect_to(c, 1)
        other = await client.subscribe("log", shard=1, start=0)
        assert (await other.next(timeout=5)).payload == b"c"
        await other.aclose()
    finally:
        await client.aclose()


async def test_a_target_answering_shard_unavailable_sends_the_client_back_to_the_entry_once(
    fleet: ScriptedFleet,
) -> None:
    a, b = fleet[0], fleet[1]
    answers = iter([[a.not_leader(b, 1)], None])

    def entry(broker: ScriptedBroker, request: Any, reply: Reply) -> list[Any]:
        scripted = next(answers)
        return (
            scripted if scripted is not None else serve_subscribe(0, [b"a"])(broker, request, reply)
        )

    a.on["subscribe"] = entry
    b.on["subscribe"] = lambda *_: [refusal("shard_unavailable", "retry", "not_ready")]
    client = await connect(fleet, a)
    try:
        sub = await client.subscribe("log", shard=0, start=0)
        assert (await sub.next(timeout=5)).payload == b"a"
        assert (len(a.got("subscribe")), len(b.got("subscribe"))) == (2, 1)
        await sub.aclose()
        # Draining twice: back once, then the refusal is the answer.
        a.on["subscribe"] = redirect_to(b, 2)
        b.on["subscribe"] = lambda *_: [refusal("draining", "retry")]
        with pytest.raises(felix_client.errors.DrainingError):
            await client.subscribe("log", shard=0, start=0)
        # b's refusal made the client forget it as owner, so the entry is asked
        # first; back at the entry, b is named again, which this attempt already
        # tried: the draining refusal (retryable) is the answer.
        assert (len(a.got("subscribe")), len(b.got("subscribe"))) == (4, 2)
    finally:
        await client.aclose()


@pytest.mark.parametrize(("resume_from", "expected"), [(3, 5), (9, 9)])
async def test_shard_moved_resumes_at_the_named_owner_from_max_of_next_and_resume_from(
    fleet: ScriptedFleet, resume_from: int, expected: int
) -> None:
    a, b = fleet[0], fleet[1]
    a.on["subscribe"] = serve_subscribe(
        0,
        [b"0", b"1", b"2", b"3", b"4"],
        end=moved(1, 2, resume_from=resume_from, node_id=b.node_id, addr=b.addr),
    )
    b.on["subscribe"] = serve_subscribe(0, [b"after"], sid=2)
    client = await connect(fleet, a)
    try:
        sub = await client.subscribe("log", shard=0, start=0)
        offsets = [(await sub.next(timeout=5)).offset for _ in range(6)]
        assert offsets == [0, 1, 2, 3, 4, expected]
        assert starts(b) == [StartOffset(offset=expected)]
        assert len(a.got("subscribe")) == 1  # the named owner first, not the entry
        assert sub.resumes == 1
        await sub.aclose()
    finally:
        await client.aclose()


async def test_shard_moved_to_an_unreachable_owner_falls_back_to_the_entry(
    fleet: ScriptedFleet,
) -> None:
    a, gone = fleet[0], fleet[4]
    gone_addr = gone.addr
    await gone.stop()
    answers = iter(["first", "again"])

    def entry(broker: ScriptedBroker, request: Any, reply: Reply) -> list[Any]:
        if next(answers) == "first":
            end = moved(1, 3, resume_from=2, node_id="node-4", addr=gone_addr)
            return serve_subscribe(0, [b"0", b"1"], end=end)(broker, request, reply)
        return serve_subscribe(0, [b"later"], sid=2)(broker, request, reply)

    a.on["subscribe"] = entry
    client = await connect(fleet, a, connect_timeout=0.5)
    try:
        sub = await client.subscribe("log", shard=0, start=0)
        offsets = [(await sub.next(timeout=10)).offset for _ in range(3)]
        assert offsets == [0, 1, 2]
        assert starts(a) == [StartOffset(offset=0), StartOffset(offset=2)]
        await sub.aclose()
    finally:
        await client.aclose()


async def test_an_in_memory_stream_resumes_at_the_new_tail_after_a_move(
    fleet: ScriptedFleet,
) -> None:
    a, b = fleet[0], fleet[1]
    from felix_wire.messages import Event

    def memory(sid: int, end: Any):  # type: ignore[no-untyped-def]
        def handler(_b: ScriptedBroker, _r: Any, reply: Reply) -> list[Any]:
            frames: list[Any] = [
                Event(tenant_id="t1", namespace="default", stream="orders", payload=b"m%d" % sid)
            ]
            if end is not None:
                frames.append(end)
            reply.events(sid, frames, end=end is not None)
            return [Subscribed(subscription_id=sid)]

        return handler

    a.on["subscribe"] = memory(1, moved(1, 2, node_id=b.node_id, addr=b.addr))
    b.on["subscribe"] = memory(2, None)
    client = await connect(fleet, a)
    try:
        sub = await client.subscribe("orders", shard=0)
        assert [(await sub.next(timeout=5)).payload for _ in range(2)] == [b"m1", b"m2"]
        assert starts(b) == ["latest"]
        await sub.aclose()
    finally:
        await client.aclose()


def ack(request: Any, **kw: Any) -> PublishAckFrame:
    return PublishAckFrame(status=AckStatus.OK, request_id=request.request_id, message="", **kw)


async def test_the_owner_hint_of_a_forwarded_ack_sends_the_next_batch_straight_to_the_owner(
    fleet: ScriptedFleet,
) -> None:
    a, b = fleet[0], fleet[1]
    a.on["PublishBatchFrame"] = lambda _br, r, _rep: [
        ack(r, node_id=b.node_id, addr=b.addr, generation=4)
    ]
    b.on["PublishBatchFrame"] = lambda _br, r, _rep: [ack(r)]
    client = await connect(fleet, a)
    try:
        await client.publish("orders", b"one")
        await client.publish("orders", b"two")
        await client.publish("orders", b"three")
        assert [p.payloads for p in a.got("PublishBatchFrame")] == [[b"one"]]
        assert [p.payloads for p in b.got("PublishBatchFrame")] == [[b"two"], [b"three"]]
        # "Nothing applied, not here" from the owner: the hint goes at once and the
        # batch is resent through the entry, which forwards it.
        b.on["PublishBatchFrame"] = lambda _br, r, _rep: [
            PublishAckFrame(
                status=AckStatus.ERROR,
                request_id=r.request_id,
                message="moving",
                code=5,
                retry=felix_client.errors.RetryClass.RETRY,
            )
        ]
        a.on["PublishBatchFrame"] = lambda _br, r, _rep: [ack(r)]  # no hint this time
        await client.publish("orders", b"four")
        await client.publish("orders", b"five")
        assert [p.payloads for p in b.got("PublishBatchFrame")][-1] == [b"four"]
        assert [p.payloads for p in a.got("PublishBatchFrame")] == [[b"one"], [b"four"], [b"five"]]
    finally:
        await client.aclose()


async def test_an_outcome_unknown_answer_from_the_owner_is_never_resent(
    fleet: ScriptedFleet,
) -> None:
    a, b = fleet[0], fleet[1]
    a.on["PublishBatchFrame"] = lambda _br, r, _rep: [
        ack(r, node_id=b.node_id, addr=b.addr, generation=1)
    ]
    b.on["PublishBatchFrame"] = lambda _br, r, _rep: [
        PublishAckFrame(
            status=AckStatus.ERROR,
            request_id=r.request_id,
            message="no answer from the log",
            code=9,
            retry=felix_client.errors.RetryClass.OUTCOME_UNKNOWN,
        )
    ]
    client = await connect(fleet, a)
    try:
        await client.publish("orders", b"one")
        with pytest.raises(UnacknowledgedError):
            await client.publish("orders", b"two")
        assert len(a.got("PublishBatchFrame")) == 1  # not resent anywhere
        assert len(b.got("PublishBatchFrame")) == 1
        await client.publish("orders", b"three")  # the hint was forgotten: via the entry
        assert len(a.got("PublishBatchFrame")) == 2
    finally:
        await client.aclose()


async def test_a_not_leader_error_code_is_followed_through_shard_owners(
    fleet: ScriptedFleet,
) -> None:
    a, b = fleet[0], fleet[1]
    a.on["stream_read"] = lambda *_: [refusal("not_leader", "redirect")]
    a.on["shard_owners"] = lambda _br, r, _rep: [
        ShardOwnersView(
            owners=[ShardOwner(shard=0, node_id=b.node_id, addr=b.addr, generation=2)],
            request_id=r.request_id,
        )
    ]
    b.on["stream_read"] = lambda _br, r, _rep: [
        StreamRecords(records=[], next_offset=r.from_, request_id=r.request_id)
    ]
    client = await connect(fleet, a)
    try:
        pages = [p async for p in client.stream_read("log", shard=0, start=4)]
        assert [p.next_offset for p in pages] == [4]
        assert len(b.got("stream_read")) == 1
    finally:
        await client.aclose()


async def test_a_shard_unavailable_answer_from_the_entry_is_the_answer(
    fleet: ScriptedFleet,
) -> None:
    a = fleet[0]
    a.on["subscribe"] = lambda *_: [refusal("shard_unavailable", "retry", "owner_unavailable")]
    client = await connect(fleet, a)
    try:
        with pytest.raises(ShardUnavailableError):
            await client.subscribe("log", shard=0, start=0)
        assert len(a.got("subscribe")) == 1
    finally:
        await client.aclose()


async def test_a_cache_watch_resumes_after_shard_moved_at_max_of_its_position_and_resume_from(
    fleet: ScriptedFleet,
) -> None:
    from felix_wire.messages import CacheEvent, CacheWatchStarted

    a, b = fleet[0], fleet[1]

    def watch_on(sid: int, frames: list[Any], end: bool):  # type: ignore[no-untyped-def]
        def handler(_b: ScriptedBroker, _r: Any, reply: Reply) -> list[Any]:
            reply.events(sid, frames, end=end)
            return [CacheWatchStarted(subscription_id=sid, resume_offset=0)]

        return handler

    change = CacheEvent(key="k", value=b"v", offset=6)
    a.on["cache_watch"] = watch_on(
        1, [change, moved(1, 2, resume_from=4, node_id=b.node_id, addr=b.addr)], True
    )
    b.on["cache_watch"] = watch_on(2, [], False)
    client = await connect(fleet, a)
    try:
        watch = await client.cache("c").watch(prefix="k", shard=0)
        assert (await watch.next(timeout=5)).offset == 6
        with pytest.raises(felix_client.errors.ClientTimeoutError):
            await watch.next(timeout=1.0)  # reopened at b meanwhile, nothing new
        assert [r.from_offset for r in b.got("cache_watch")] == [7]  # max(6 + 1, 4)
        await watch.aclose()
    finally:
        await client.aclose()


async def test_a_read_whose_broker_went_away_is_resent_to_another_broker(
    fleet: ScriptedFleet,
) -> None:
    from felix_wire.messages import StreamShardsView

    a, b = fleet[0], fleet[1]
    a.on["topology"] = topology(a, b)

    def shards(_br: ScriptedBroker, r: Any, _rep: Reply) -> list[Any]:
        return [StreamShardsView(shards=2, request_id=r.request_id)]

    b.on["stream_shards"] = shards
    client = await connect(fleet, a, connect_timeout=0.5)
    try:
        seed = a.addr
        await a.stop()  # the seed goes away, its connections closed
        assert await client.stream_shards("log") == 2
        assert len(b.got("stream_shards")) == 1
        assert client.brokers == [seed, b.addr]  # the seed is kept
    finally:
        await client.aclose()


async def test_a_publish_whose_connection_is_lost_is_not_resent(fleet: ScriptedFleet) -> None:
    a, b = fleet[0], fleet[1]
    a.on["topology"] = topology(a, b)

    def swallow(broker: ScriptedBroker, _r: Any, _rep: Reply) -> list[Any]:
        broker.drop_connections()  # it may have been written: outcome unknown
        return []

    a.on["PublishBatchFrame"] = swallow
    b.on["PublishBatchFrame"] = lambda _br, r, _rep: [ack(r)]
    client = await connect(fleet, a)
    try:
        with pytest.raises(felix_client.errors.ConnectionLostError):
            await client.publish("orders", b"once")
        assert len(a.got("PublishBatchFrame")) == 1
        assert b.got("PublishBatchFrame") == []
    finally:
        await client.aclose()


async def test_a_request_with_no_answer_times_out_and_its_late_answer_is_dropped(
    fleet: ScriptedFleet,
) -> None:
    # The per-request timer (one handle, not an asyncio.timeout scope) must still
    # fail the caller with ClientTimeoutError, and an answer arriving later must
    # not be taken for the next request on the same stream.
    from felix_wire.messages import CacheGet, CacheValue

    a = fleet[0]
    held: list[CacheGet] = []
    silent = [True]

    def value(r: CacheGet, data: bytes) -> CacheValue:
        scope = {"tenant_id": r.tenant_id, "namespace": r.namespace, "cache": r.cache}
        return CacheValue(**scope, key=r.key, value=data, request_id=r.request_id)

    def get(_b: ScriptedBroker, r: Any, _rep: Reply) -> list[Any]:
        if silent[0]:
            held.append(r)
            return []
        late = [value(h, b"late") for h in held]
        held.clear()
        return [*late, value(r, b"now")]

    a.on["cache_get"] = get
    client = await connect(fleet, a, request_timeout=0.3)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(felix_client.errors.ClientTimeoutError):
            await client.cache("c").get("k")  # same key: the same stream both times
        assert asyncio.get_running_loop().time() - started < 3
        assert held, "the request was sent"
        silent[0] = False
        assert await client.cache("c").get("k") == b"now"
    finally:
        await client.aclose()
