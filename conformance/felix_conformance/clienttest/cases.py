"""The client cases: what the scripted broker advertises and answers, what the
adapter is asked to do, and how the outcome is judged.

A judge sees everything: the frames the client put on the wire (captured by
the scripted broker), the rule breaches the broker noticed, and the adapter's
replies. It returns None for a pass, or why the client failed.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from felix_wire.binary import AckStatus, EventBatchLegacyFrame, EventBatchSharedFrame
from felix_wire.binary import PublishAckFrame as Ack
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import Feature
from felix_wire.flags import KNOWN_FLAGS, Flag
from felix_wire.frame import frame_bytes
from felix_wire.messages import (
    CacheValue,
    Error,
    ErrorDetail,
    Event,
    EventBatch,
    EventStreamHello,
    NotLeader,
    PublishError,
    PublishOk,
    ShardMoved,
    StartOffset,
    Subscribed,
    SubscriptionLagged,
)

from ..model import Level
from .broker import BINARY_PUBLISH, BrokerScript, Exchange, Handler, ScriptedBroker

__all__ = ["CLIENT_CASES", "ClientCase", "ClientUnsupportedError", "Judge"]

TENANT = "t-client-test"
NAMESPACE = "default"
TOKEN = "client-test-token"

# Everything our catalogue knows, but the features the cases below take away.
_ALL_FEATURES = sum(int(f) for f in Feature if int(f) < (1 << 31))

Judge = Callable[[ScriptedBroker, Sequence[dict[str, Any]]], str | None]


@dataclass(frozen=True)
class ClientCase:
    id: str
    title: str
    section: str
    requirement: str
    # A fresh script per run (handlers may keep state), given the peers' addresses.
    script: Callable[[Sequence[str]], BrokerScript]
    # What the adapter is asked to do after connecting; {"op": "idle", "seconds": s}
    # is the kit's own step (nothing is sent to the adapter for s seconds), and so is
    # {"op": "await_link", "seconds": s}: wait until the case's link is no longer
    # silent (at most s seconds).
    ops: tuple[dict[str, Any], ...]
    judge: Judge
    level: Level = Level.MUST
    # What the case puts on the wire (the scripted broker sends it, or it makes the
    # client send it), counted by `coverage` as exercised on the client side:
    # message types, binary layouts, frame flag values the broker sends, feature
    # bits the script advertises and depends on, error codes and retry classes it
    # refuses with.
    messages: tuple[str, ...] = field(default=())
    layouts: tuple[str, ...] = ()
    flags: tuple[int, ...] = ()
    features: tuple[str, ...] = ()
    error_codes: tuple[str, ...] = ()
    retries: tuple[str, ...] = ()
    # Scripts of further brokers started first (same CA), e.g. a redirect's target.
    peers: tuple[Callable[[Sequence[str]], BrokerScript], ...] = ()
    # The client reaches the broker through a SilentLink (the broker's `link`).
    link: bool = False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _violations(broker: ScriptedBroker) -> str | None:
    return "; ".join(broker.violations) if broker.violations else None


def _replies_ok(replies: Sequence[dict[str, Any]]) -> str | None:
    for reply in replies:
        if not reply["ok"]:
            return f"the adapter reported {reply['error']['kind']}: {reply['error']['message']}"
    return None


def _first(*checks: str | None) -> str | None:
    return next((c for c in checks if c is not None), None)


# -- handlers -----------------------------------------------------------------------------

_OFFSET = 41


async def _ack_publish(ex: Exchange, request: Any) -> None:
    """Accept a publish at offset 41, in the form the client negotiated."""
    request_id = getattr(request, "request_id", None)
    if request_id is None:
        return  # unacked: nothing is owed
    if ex.client.has(int(Flag.BINARY_PUBLISH_ACK)) and hasattr(request, "ack_mode"):
        offset = _OFFSET if ex.client.has(int(Flag.BINARY_PUBLISH_ACK_OFFSET)) else None
        await ex.reply(Ack(status=AckStatus.OK, request_id=request_id, message="", offset=offset))
        return
    offset = _OFFSET if ex.client.has(int(Flag.BINARY_PUBLISH_ACK_OFFSET)) else None
    await ex.reply(PublishOk(request_id=request_id, offset=offset))


def _refuse_publish(code: ErrorCode | str, retry: RetryClass) -> Handler:
    async def handler(ex: Exchange, request: Any) -> None:
        request_id = getattr(request, "request_id", None)
        if request_id is None:
            return
        codes = ex.client.has_feature(int(Feature.FEATURE_ERROR_CODES))
        if ex.client.has(int(Flag.BINARY_PUBLISH_ACK)) and hasattr(request, "ack_mode"):
            with_code = ex.client.has(int(Flag.BINARY_PUBLISH_ACK_CODE))
            number = int(code) if isinstance(code, ErrorCode) else 999
            await ex.reply(
                Ack(
                    status=AckStatus.ERROR,
                    request_id=request_id,
                    message="refused by the scripted broker",
                    code=number if with_code else None,
                    retry=retry if with_code else None,
                )
            )
            return
        wire = code.wire if isinstance(code, ErrorCode) else code
        await ex.reply(
            PublishError(
                request_id=request_id,
                message="refused by the scripted broker",
                code=wire if codes else None,
                retry=retry.wire if codes else None,
            )
        )

    return handler


_RETRY_AFTER_MS = 400


def _refuse_first(
    code: ErrorCode, retry: RetryClass, *, retry_after_ms: int | None = None
) -> Handler:
    """Refuse the first acked publish with `code` / `retry` (and a retry_after_ms
    detail where the client negotiated one), accept every later one."""
    refused: list[int] = []

    async def handler(ex: Exchange, request: Any) -> None:
        request_id = getattr(request, "request_id", None)
        if request_id is None:
            return
        if refused:
            await _ack_publish(ex, request)
            return
        refused.append(request_id)
        text = f"refused once by the scripted broker ({code.wire}, {retry.wire})"
        if ex.client.has(int(Flag.BINARY_PUBLISH_ACK)) and hasattr(request, "ack_mode"):
            with_code = ex.client.has(int(Flag.BINARY_PUBLISH_ACK_CODE))
            with_detail = with_code and ex.client.has(int(Flag.BINARY_PUBLISH_ACK_DETAIL))
            await ex.reply(
                Ack(
                    status=AckStatus.ERROR,
                    request_id=request_id,
                    message=text,
                    code=int(code) if with_code else None,
                    retry=retry if with_code else None,
                    reason=None,
                    retry_after_ms=retry_after_ms if with_detail else None,
                )
            )
            return
        codes = ex.client.has_feature(int(Feature.FEATURE_ERROR_CODES))
        detail = ErrorDetail(retry_after_ms=retry_after_ms) if retry_after_ms else None
        await ex.reply(
            PublishError(
                request_id=request_id,
                message=text,
                code=code.wire if codes else None,
                retry=retry.wire if codes else None,
                detail=detail if codes else None,
            )
        )

    return handler


_STALL = 3.0  # seconds an answer is held back: longer than a hasty client waits
_IDLE_TIMEOUT = 1.5  # the keepalive case's broker idle timeout, in seconds


async def _stalled_ack(ex: Exchange, request: Any) -> None:
    """A link that stalls: the answer comes, but only after _STALL seconds."""
    ex.broker.log.note(f"c{ex.conn}", f"holding the answer for {_STALL:.0f} s")
    await asyncio.sleep(_STALL)
    await _ack_publish(ex, request)


def _reset_first() -> Handler:
    """A link that resets: the connection carrying the first publish is closed
    without an answer; every later publish (on a new connection) is accepted."""
    closed: list[int] = []

    async def handler(ex: Exchange, request: Any) -> None:
        if not closed:
            closed.append(ex.conn)
            ex.broker.log.note(f"c{ex.conn}", "closing the connection unanswered")
            ex.connection.close(0x0, "the scripted broker resets the link")
            return
        await _ack_publish(ex, request)

    return handler


_SILENCE = 2 * 1.5  # seconds the link is silent: twice the broker's 1.5 s idle timeout


def _silence_first() -> Handler:
    """A link that goes silent: at the first publish every datagram, both ways, is
    discarded for _SILENCE seconds (nobody is told; both ends' idle timeouts end the
    connection); every later publish (after the silence, on a new connection) is
    accepted."""
    silenced: list[int] = []

    async def handler(ex: Exchange, request: Any) -> None:
        link = ex.broker.link
        if link is None:
            raise RuntimeError("the silent-link case runs behind a link")
        if not silenced:
            silenced.append(ex.conn)
            ex.broker.log.note(f"c{ex.conn}", f"the link goes silent for {_SILENCE:g} s")
            link.silence(_SILENCE)
            return  # an answer now would be lost with everything else
        await _ack_publish(ex, request)

    return handler


def _silent_link_script(peers: Sequence[str]) -> BrokerScript:
    """Publishes served by one _silence_first handler, behind a short idle timeout."""
    serve = _silence_first()
    return BrokerScript(
        _FULL.flags,
        _FULL.features,
        {BINARY_PUBLISH: serve, "publish": serve},
        idle_timeout=_IDLE_TIMEOUT,
    )


_BASE = 10  # the offset of a delivery script's first event


def _offset_batch(ex: Exchange, subscription_id: int, base: int, payloads: list[bytes]) -> Any:
    """An event batch with offsets in the binary layout the client offered."""
    if ex.client.has(int(Flag.BINARY_EVENT_BATCH_SHARED)):
        return EventBatchSharedFrame(base_offset=base, payloads=payloads)
    return EventBatchLegacyFrame(
        subscription_id=subscription_id, base_offset=base, payloads=payloads
    )


def _offers_offsets(ex: Exchange, feature: int | None = None) -> bool:
    binary = int(Flag.BINARY_EVENT_BATCH_SHARED) | int(Flag.BINARY_EVENT_BATCH)
    offered = ex.client.has(int(Flag.EVENT_BATCH_OFFSETS)) and ex.client.flags & binary != 0
    return offered and (feature is None or ex.client.has_feature(feature))


def _ending_subscribe(terminal: Callable[[int], Any], feature: int) -> Handler:
    """The first subscription delivers events 10 and 11, then ends its event stream
    with `terminal(subscription_id)` (subscription_lagged, shard_moved); a later
    subscribe is served from the offset it asks for. A client that did not offer
    offsets and `feature` gets the two events and no ending."""
    subscribes: list[int] = []

    async def handler(ex: Exchange, request: Any) -> None:
        subscribes.append(1)
        number = 6 + len(subscribes)
        if not _offers_offsets(ex, feature):
            await _subscribe(ex, request)
            return
        if len(subscribes) == 1:
            await ex.reply(
                Subscribed(subscription_id=number, start_offset=_BASE, live_offset=_BASE)
            )
            batch = _offset_batch(ex, number, _BASE, [b"event-one", b"event-two"])
            events = await ex.open_events(
                EventStreamHello(subscription_id=number), batch, terminal(number)
            )
            await events.finish()
            return
        start = request.start.offset if isinstance(request.start, StartOffset) else None
        if start is None:
            start = _BASE + 10  # a resume from latest: served at the tail (the judge fails it)
        await ex.reply(Subscribed(subscription_id=number, start_offset=start, live_offset=start))
        batch = _offset_batch(ex, number, start, [b"event-three", b"event-four"])
        await ex.open_events(EventStreamHello(subscription_id=number), batch)

    return handler


async def _gapped_subscribe(ex: Exchange, request: Any) -> None:
    """Events 10 and 11, then 14 and 15: two events lost between the batches."""
    if not _offers_offsets(ex):
        await _subscribe(ex, request)
        return
    await ex.reply(Subscribed(subscription_id=7, start_offset=_BASE, live_offset=_BASE))
    await ex.open_events(
        EventStreamHello(subscription_id=7),
        _offset_batch(ex, 7, _BASE, [b"event-one", b"event-two"]),
        _offset_batch(ex, 7, _BASE + 4, [b"event-three", b"event-four"]),
    )


def _unknown_then_ack() -> Handler:
    """A message type no catalogue has, then the ack (JSON acks with an unknown field)."""

    async def handler(ex: Exchange, request: Any) -> None:
        future = msgspec.json.encode({"type": "conformance_future_message", "words": [1, 2]})
        await ex.reply_raw(frame_bytes(0, future), f"unknown message {future.decode()}")
        request_id = getattr(request, "request_id", None)
        if request_id is None:
            return
        offset = _OFFSET if ex.client.has(int(Flag.BINARY_PUBLISH_ACK_OFFSET)) else None
        if ex.client.has(int(Flag.BINARY_PUBLISH_ACK)) and hasattr(request, "ack_mode"):
            await ex.reply(
                Ack(status=AckStatus.OK, request_id=request_id, message="", offset=offset)
            )
            return
        body: dict[str, Any] = {"type": "publish_ok", "request_id": request_id}
        if offset is not None:
            body["offset"] = offset
        ok = msgspec.json.encode({**body, "conformance_future_field": "x"})
        await ex.reply_raw(frame_bytes(0, ok), f"publish_ok with an unknown field {ok.decode()}")

    return handler


def _outcome_unknown() -> Handler:
    """Refuse every publish as quorum_timeout / outcome_unknown: it may have been applied."""
    return _refuse_publish(ErrorCode.QUORUM_TIMEOUT, RetryClass.OUTCOME_UNKNOWN)


class ClientUnsupportedError(Exception):
    """The client did not offer what the case exercises: the case does not apply."""


def _redirect_to(peers: Sequence[str]) -> Handler:
    """Answer subscribe with not_leader naming the peer (D2), or, to a client that did
    not offer FEATURE_REDIRECT, with the error code not_leader."""

    async def handler(ex: Exchange, request: Any) -> None:
        if ex.client.has_feature(int(Feature.FEATURE_REDIRECT)):
            await ex.reply(NotLeader(node_id="peer-1", addr=peers[0], generation=1))
        elif ex.client.has_feature(int(Feature.FEATURE_ERROR_CODES)):
            await ex.reply(
                Error(message="not the leader", code="not_leader", retry=RetryClass.REDIRECT.wire)
            )
        else:
            await ex.reply(Error(message="not the leader"))

    return handler


def _out_of_order_gets(values: dict[str, bytes]) -> Handler:
    """Hold the first cache_get until the second arrives (or 2 s), answer the later first."""
    held: list[tuple[Exchange, Any]] = []
    both = asyncio.Event()

    async def answer(ex: Exchange, request: Any) -> None:
        await ex.reply(
            CacheValue(
                tenant_id=request.tenant_id,
                namespace=request.namespace,
                cache=request.cache,
                key=request.key,
                value=values.get(request.key),
                request_id=request.request_id,
            )
        )

    async def handler(ex: Exchange, request: Any) -> None:
        held.append((ex, request))
        if len(held) < len(values):
            try:
                async with asyncio.timeout(2.0):
                    await both.wait()
            except TimeoutError:
                await answer(ex, request)  # the client sends one at a time: nothing to reorder
            return
        both.set()
        for pending_ex, pending in reversed(held):
            await answer(pending_ex, pending)

    return handler


async def _refuse_ungated(ex: Exchange, request: Any) -> None:
    """An answer for a request the client should not have sent, so it is not left waiting."""
    await ex.reply(Error(message="this broker did not advertise that request"))


async def _subscribe(ex: Exchange, request: Any) -> None:
    payloads = [b"event-one", b"event-two"]
    await ex.reply(Subscribed(subscription_id=7))
    if ex.client.has(int(Flag.BINARY_EVENT_BATCH_SHARED)):
        batch: Any = EventBatchSharedFrame(payloads=payloads)
    elif ex.client.has(int(Flag.BINARY_EVENT_BATCH)):
        batch = EventBatchLegacyFrame(subscription_id=7, payloads=payloads)
    else:
        batch = EventBatch(
            tenant_id=request.tenant_id,
            namespace=request.namespace,
            stream=request.stream,
            payloads=payloads,
        )
    await ex.open_events(EventStreamHello(subscription_id=7), batch)


async def _json_events(ex: Exchange, request: Any) -> None:
    """The events as two JSON `event` messages, the single-event compatibility
    encoding any client reads (JSON needs no flag), whatever layouts it offered."""
    await ex.reply(Subscribed(subscription_id=7))
    events = [
        Event(
            tenant_id=request.tenant_id,
            namespace=request.namespace,
            stream=request.stream,
            payload=payload,
        )
        for payload in (b"event-one", b"event-two")
    ]
    await ex.open_events(EventStreamHello(subscription_id=7), *events)


_SKIPPED = 2  # offsets 12 and 13 hold no event (markers): skipped, not lost


async def _skipping_subscribe(ex: Exchange, request: Any) -> None:
    """Events 10 and 11, then 14 and 15 in a batch whose skipped_before says that
    offsets 12 and 13 hold no event (layout 0x0822 / 0x0824): nothing was lost."""
    skips = ex.client.has(int(Flag.EVENT_BATCH_SKIPPED))
    if not _offers_offsets(ex) or not skips:
        await _subscribe(ex, request)
        return
    await ex.reply(Subscribed(subscription_id=7, start_offset=_BASE, live_offset=_BASE))
    second: Any
    later = [b"event-three", b"event-four"]
    if ex.client.has(int(Flag.BINARY_EVENT_BATCH_SHARED)):
        second = EventBatchSharedFrame(
            base_offset=_BASE + 4, skipped_before=_SKIPPED, payloads=later
        )
    else:
        second = EventBatchLegacyFrame(
            subscription_id=7, base_offset=_BASE + 4, skipped_before=_SKIPPED, payloads=later
        )
    await ex.open_events(
        EventStreamHello(subscription_id=7),
        _offset_batch(ex, 7, _BASE, [b"event-one", b"event-two"]),
        second,
    )


def _owner_named_refusal(peers: Sequence[str]) -> Handler:
    """Refuse the first binary acked publish as not_leader / redirect in the binary
    ack layout that names the owner (0x0290, or 0x0690 with a detail to a client
    that offered BINARY_PUBLISH_ACK_DETAIL); the owner named is the case's peer,
    which accepts it. A client that did not offer the owner and code modifiers, or
    publishes in JSON, gets a JSON not_leader refusal naming the same owner."""

    async def handler(ex: Exchange, request: Any) -> None:
        request_id = getattr(request, "request_id", None)
        if request_id is None:
            return
        text = "not the owner of this stream's shard"
        owner = int(Flag.BINARY_PUBLISH_ACK_OWNER) | int(Flag.BINARY_PUBLISH_ACK_CODE)
        binary = ex.client.has(int(Flag.BINARY_PUBLISH_ACK)) and hasattr(request, "ack_mode")
        if binary and ex.client.flags & owner == owner:
            detail = ex.client.has(int(Flag.BINARY_PUBLISH_ACK_DETAIL))
            await ex.reply(
                Ack(
                    status=AckStatus.ERROR, request_id=request_id, message=text,
                    code=int(ErrorCode.NOT_LEADER), retry=RetryClass.REDIRECT,
                    reason="not_owner" if detail else None,
                    retry_after_ms=0 if detail else None,
                    node_id="peer-1", addr=peers[0], generation=1,
                )
            )  # fmt: skip
            return
        codes = ex.client.has_feature(int(Feature.FEATURE_ERROR_CODES))
        await ex.reply(
            PublishError(
                request_id=request_id, message=f"{text}; the owner is {peers[0]}",
                code="not_leader" if codes else None,
                retry=RetryClass.REDIRECT.wire if codes else None,
            )
        )  # fmt: skip

    return handler


_WINDOW = 2  # the per-stream publish window the window case grants
_WINDOW_PUBLISHES = 6


async def _windowed_ack(ex: Exchange, request: Any) -> None:
    """Acks answered in arrival order per stream, each held 0.1 s; the most acked
    publishes one stream (connection, stream) ever had unanswered at once goes in
    the broker's notes."""
    if getattr(request, "request_id", None) is None:
        return
    notes = ex.broker.notes
    unanswered: dict[tuple[int, int], int] = notes.setdefault("unanswered", {})
    most: dict[tuple[int, int], int] = notes.setdefault("most_unanswered", {})
    locks: dict[tuple[int, int], asyncio.Lock] = notes.setdefault("locks", {})
    where = (ex.conn, ex.stream.stream_id)
    unanswered[where] = unanswered.get(where, 0) + 1
    most[where] = max(most.get(where, 0), unanswered[where])
    async with locks.setdefault(where, asyncio.Lock()):  # FIFO: answers in stream order (PL2)
        await asyncio.sleep(0.1)
        unanswered[where] -= 1
        await _ack_publish(ex, request)


def _window_script(peers: Sequence[str]) -> BrokerScript:
    return BrokerScript(
        _FULL.flags,
        _FULL.features,
        {BINARY_PUBLISH: _windowed_ack, "publish": _windowed_ack},
        publish_window=_WINDOW,
    )


# -- judges -------------------------------------------------------------------------------


def _judge_connect(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    if not broker.auths:
        return "the client sent no auth"
    for auth in broker.auths:
        if auth.client_flags is None:
            return "an auth without client_flags: the client negotiates nothing"
        if auth.tenant_id != TENANT or auth.token != TOKEN:
            return f"an auth for tenant {auth.tenant_id!r} with another token than given"
    return _first(_violations(broker), _replies_ok(replies))


def _published(broker: ScriptedBroker, payload: bytes) -> bool:
    return any(getattr(r, "payloads", None) == [payload] for r in broker.requests(BINARY_PUBLISH))
    # (JSON publishes are checked by the caller)


def _judge_publish_acked(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    payload = b"hello"
    sent = _published(broker, payload) or any(
        r.payload == payload for r in broker.requests("publish")
    )
    if not sent:
        return "the publish never reached the broker"
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    offset = replies[-1]["result"].get("offset")
    negotiated = any(
        a.client_flags is not None and a.client_flags & int(Flag.BINARY_PUBLISH_ACK_OFFSET)
        for a in broker.auths
    )
    if negotiated and offset != _OFFSET:
        return f"the broker acked offset {_OFFSET}, the client reported {offset!r}"
    return None


def _judge_refused(code: str | None) -> Judge:
    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        problem = _violations(broker)
        if problem is not None:
            return problem
        last = replies[-1]
        if last["ok"]:
            return "the broker refused the publish, the client reported success"
        error = last["error"]
        if error["kind"] != "broker":
            return f"a refusal reported as {error['kind']}: {error['message']}"
        if code is not None and error.get("code") not in (code, None):
            return f"refused with {code}, the client reported {error.get('code')!r}"
        return None

    return judge


def _judge_not_resent(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    sent = [
        r for r in broker.requests(BINARY_PUBLISH) if getattr(r, "payloads", None) == [b"hello"]
    ]
    sent += [r for r in broker.requests("publish") if r.payload == b"hello"]
    if len(sent) > 1:
        return f"the client sent the publish {len(sent)} times after an outcome_unknown refusal"
    return _judge_refused("quorum_timeout")(broker, replies)


_GUARDED = b"guarded"


def _conditional_outcome_unknown() -> Handler:
    """Refuse every publish_if as quorum_timeout / outcome_unknown: the write may
    have been applied, so only a read at expected_offset can tell."""

    async def handler(ex: Exchange, request: Any) -> None:
        codes = ex.client.has_feature(int(Feature.FEATURE_ERROR_CODES))
        await ex.reply(
            Error(
                message="the conditional write may have been applied (scripted broker)",
                code=ErrorCode.QUORUM_TIMEOUT.wire if codes else None,
                retry=RetryClass.OUTCOME_UNKNOWN.wire if codes else None,
            )
        )

    return handler


def _judge_conditional_not_resent(
    broker: ScriptedBroker, replies: Sequence[dict[str, Any]]
) -> str | None:
    last = replies[-1]
    if not last["ok"] and last["error"]["kind"] == "unsupported":
        raise ClientUnsupportedError(
            f"the client has no conditional publish: {last['error']['message']}"
        )
    sent = [r for r in broker.requests("publish_if") if list(r.payloads) == [_GUARDED]]
    if not sent:
        return f"the client never sent the publish_if (adapter reply {last})"
    if len(sent) > 1:
        return (
            f"the client sent the conditional write {len(sent)} times after an "
            "outcome_unknown refusal (it may have been applied: read at expected_offset)"
        )
    if last["ok"]:
        return "the broker refused the conditional write, the client reported success"
    if last["error"]["kind"] != "broker":
        return f"an outcome_unknown refusal reported as {last['error']['kind']}"
    return None


def _sends(broker: ScriptedBroker, payload: bytes) -> list[float]:
    """When each publish of `payload` (binary or JSON) reached the broker."""
    return [
        seen.at
        for seen in broker.seen
        if (seen.name == BINARY_PUBLISH and getattr(seen.value, "payloads", None) == [payload])
        or (seen.name == "publish" and getattr(seen.value, "payload", None) == payload)
    ]


def _told_the_wait(broker: ScriptedBroker) -> bool:
    """Whether the refusal could carry retry_after_ms: a binary publish from a client
    that offered BINARY_PUBLISH_ACK_DETAIL, a JSON one from a FEATURE_ERROR_CODES client."""
    binary = bool(broker.requests(BINARY_PUBLISH))
    for auth in broker.auths:
        flags, features = auth.client_flags or 0, auth.client_features or 0
        if binary and flags & int(Flag.BINARY_PUBLISH_ACK_DETAIL):
            return True
        if not binary and features & int(Feature.FEATURE_ERROR_CODES):
            return True
    return False


def _judge_acted_on(retry: RetryClass, *, resend: bool, wait: float = 0.0) -> Judge:
    """Judge a publish refused once with `retry`, asked for with the client's retry
    policy on. A class that allows a resend (`resend`) is passed by a resend made no
    sooner than `wait` seconds after the first, then reported as the second answer's
    success; a client that reports the refusal with that class instead has no retry
    policy: the case does not apply. A class that allows none is passed by one send,
    reported as a refusal with that class."""

    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        problem = _violations(broker)
        if problem is not None:
            return problem
        sends = _sends(broker, b"hello")
        last = replies[-1]
        if not sends:
            return "the publish never reached the broker"
        if not resend:
            if len(sends) > 1:
                return (
                    f"the client sent the publish {len(sends)} times after a {retry.wire} refusal"
                )
            if last["ok"]:
                return "the broker refused the publish, the client reported success"
            reported = last["error"].get("retry")
            if last["error"]["kind"] != "broker" or reported not in (retry.wire, None):
                return f"a {retry.wire} refusal reported as {last['error']}"
            return None
        if len(sends) == 1:
            if last["ok"]:
                return "the broker refused the only publish, the client reported success"
            if last["error"].get("retry") == retry.wire:
                raise ClientUnsupportedError(
                    f"the client reports a {retry.wire} refusal but does not resend on its own"
                )
            return f"a {retry.wire} refusal reported as {last['error']}"
        gap = sends[1] - sends[0]
        if gap < wait and _told_the_wait(broker):
            return (
                f"the client resent {gap * 1000:.0f} ms after a {retry.wire} refusal asking "
                f"for {wait * 1000:.0f} ms"
            )
        return _replies_ok(replies)

    return judge


def _judge_stalled(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    sends = _sends(broker, b"hello")
    if len(sends) != 1:
        return f"the client sent the publish {len(sends)} times while its answer was held back"
    return _first(_violations(broker), _replies_ok(replies))


def _judge_reconnected(what: str) -> Judge:
    """The first publish's connection was lost unanswered (`what` befell the link):
    its outcome may be reported as a lost connection or a timeout (or, resent, as a
    success); the next publish must reach the broker on a new connection and succeed."""

    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        problem = _violations(broker)
        if problem is not None:
            return problem
        first, second = replies[-2], replies[-1]
        if not first["ok"] and first["error"]["kind"] not in ("connection", "timeout"):
            return f"a publish whose connection was lost ({what}) reported as {first['error']}"
        if not second["ok"]:
            return f"after the link was {what} the next publish failed: {second['error']}"
        connections = {seen.conn for seen in broker.seen}
        if len(connections) < 2:
            return f"the client never opened a new connection after the link was {what}"
        return None

    return judge


_judge_reset = _judge_reconnected("reset")


def _judge_kept_alive(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    conns = [seen.conn for seen in broker.seen if seen.name in (BINARY_PUBLISH, "publish")]
    if not conns:
        return "no publish reached the broker"
    first = broker.connections[conns[0]]
    if first.closed:
        return (
            f"the connection of the first publish idled out within the broker's "
            f"{_IDLE_TIMEOUT:g} s idle timeout: the client sent no keepalive"
        )
    return None


_FOUR = [_b64(p) for p in (b"event-one", b"event-two", b"event-three", b"event-four")]


def _offered_offsets(broker: ScriptedBroker, feature: int | None = None) -> bool:
    binary = int(Flag.BINARY_EVENT_BATCH_SHARED) | int(Flag.BINARY_EVENT_BATCH)
    for auth in broker.auths:
        flags, features = auth.client_flags or 0, auth.client_features or 0
        offsets = flags & int(Flag.EVENT_BATCH_OFFSETS) and flags & binary
        if offsets and (feature is None or features & feature):
            return True
    return False


def _judge_resumed(feature: Feature, expected: int, rule: str) -> Judge:
    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        if not _offered_offsets(broker, int(feature)):
            raise ClientUnsupportedError(
                f"the client did not offer EVENT_BATCH_OFFSETS and {feature.name}"
            )
        subscribes = broker.requests("subscribe")
        if len(subscribes) < 2:
            return "the client did not subscribe again after its event stream ended"
        start = subscribes[1].start
        got = start.offset if isinstance(start, StartOffset) else start
        if got != expected:
            return f"the client resumed from {got!r}, not {expected} ({rule})"
        problem = _first(_violations(broker), _replies_ok(replies))
        if problem is not None:
            return problem
        payloads = replies[-1]["result"].get("payloads")
        return None if payloads == _FOUR else f"events {payloads}, the broker sent {_FOUR}"

    return judge


def _judge_gap(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    if not _offered_offsets(broker):
        raise ClientUnsupportedError("the client did not offer EVENT_BATCH_OFFSETS")
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    result = replies[-1]["result"]
    if result.get("payloads") != _FOUR:
        return f"events {result.get('payloads')}, the broker sent {_FOUR}"
    dropped = result.get("dropped")
    if dropped is None:
        raise ClientUnsupportedError("the adapter reports no gap counts (result.dropped)")
    if dropped != [0, 0, 2, 0]:
        return f"events 10, 11, 14, 15 reported with dropped {dropped}, not [0, 0, 2, 0]"
    return None


def _judge_values(values: dict[str, bytes]) -> Judge:
    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        problem = _first(_violations(broker), _replies_ok(replies))
        if problem is not None:
            return problem
        got = replies[-1]["result"].get("values", {})
        want = {k: _b64(v) for k, v in values.items()}
        if got != want:
            return f"values {got} for answers {want}: answers matched to the wrong requests"
        return None

    return judge


def _judge_ungated(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    if broker.requests("cache_delete"):
        return "the client sent cache_delete to a broker that did not advertise it"
    problem = _violations(broker)
    if problem is not None:
        return problem
    if replies[-1]["ok"]:
        return "the client reported a cache_delete it cannot have made"
    return None


def _judge_legacy(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    breaches = _violations(broker)
    if breaches is not None:
        return breaches
    if not any(r.payload == b"hello" for r in broker.requests("publish")) and not any(
        getattr(r, "payloads", None) == [b"hello"] for r in broker.requests("publish_batch")
    ):
        return "no JSON publish reached the legacy broker"
    return _first(_violations(broker), _replies_ok(replies))


def _judge_subscribe(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    got = replies[-1]["result"].get("payloads")
    want = [_b64(b"event-one"), _b64(b"event-two")]
    return None if got == want else f"events {got}, the broker sent {want}"


def _judge_followed(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    offered = any(
        a.client_features is not None and a.client_features & int(Feature.FEATURE_REDIRECT)
        for a in broker.auths
    )
    if not offered:
        raise ClientUnsupportedError("the client did not offer FEATURE_REDIRECT")
    (peer,) = broker.peers
    if not peer.requests("subscribe"):
        return "the client did not follow not_leader to the broker it named"
    return _first(_violations(peer), _judge_subscribe(broker, replies))


def _judge_refusal_kept(code: str, retry: RetryClass) -> Judge:
    """A refusal with `code` / `retry` that allows no resend: one send, reported as
    the broker's refusal with that code (or none: a client may not name it)."""
    acted_on = _judge_acted_on(retry, resend=False)

    def judge(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
        problem = acted_on(broker, replies)
        if problem is not None:
            return problem
        reported = replies[-1]["error"].get("code")
        if reported not in (code, None):
            return f"refused with {code}, the client reported {reported!r}"
        return None

    return judge


def _judge_json_events(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    return _judge_subscribe(broker, replies)


def _judge_skipped(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    offered = any(
        a.client_flags is not None and a.client_flags & int(Flag.EVENT_BATCH_SKIPPED)
        for a in broker.auths
    )
    if not _offered_offsets(broker) or not offered:
        raise ClientUnsupportedError("the client did not offer EVENT_BATCH_OFFSETS and SKIPPED")
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    result = replies[-1]["result"]
    if result.get("payloads") != _FOUR:
        return f"events {result.get('payloads')}, the broker sent {_FOUR}"
    dropped = result.get("dropped")
    if dropped is None:
        raise ClientUnsupportedError("the adapter reports no gap counts (result.dropped)")
    if dropped != [0, 0, 0, 0]:
        return (
            f"events 10, 11, 14, 15 (offsets 12 and 13 skipped_before, no events) reported "
            f"with dropped {dropped}, not [0, 0, 0, 0]: skipped offsets taken for lost events"
        )
    return None


def _judge_owner_named(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    """Passed by a client that follows the named owner (the peer accepts) or reports
    the refusal as not_leader; a client that cannot read the layout fails."""
    problem = _violations(broker)
    if problem is not None:
        return problem
    owner = int(Flag.BINARY_PUBLISH_ACK_OWNER) | int(Flag.BINARY_PUBLISH_ACK_CODE)
    binary = bool(broker.requests(BINARY_PUBLISH))
    offered = any((a.client_flags or 0) & owner == owner for a in broker.auths)
    if not (binary and offered):
        raise ClientUnsupportedError(
            "the client did not publish binary acked with BINARY_PUBLISH_ACK_OWNER and _CODE"
        )
    last = replies[-1]
    if last["ok"]:
        reached = any(_sends(peer, b"hello") for peer in broker.peers)
        return None if reached else "the client reported success for a refused publish"
    error = last["error"]
    if error["kind"] != "broker" or error.get("code") not in ("not_leader", None):
        return f"an owner-named not_leader refusal reported as {error}"
    return None


def _judge_window(broker: ScriptedBroker, replies: Sequence[dict[str, Any]]) -> str | None:
    offered = any(
        (a.client_features or 0) & int(Feature.FEATURE_PUBLISH_PIPELINE) for a in broker.auths
    )
    if not offered:
        raise ClientUnsupportedError(
            "the client did not offer FEATURE_PUBLISH_PIPELINE: no window was granted"
        )
    problem = _first(_violations(broker), _replies_ok(replies))
    if problem is not None:
        return problem
    sends = _sends_any(broker)
    if sends < _WINDOW_PUBLISHES:
        return f"{sends} of {_WINDOW_PUBLISHES} publishes reached the broker"
    most = max(broker.notes.get("most_unanswered", {}).values(), default=0)
    if most > _WINDOW:
        return (
            f"{most} acked publishes unanswered on one stream at once; the broker granted a "
            f"per-stream window of {_WINDOW} (FEATURE_STREAM_PUBLISH_WINDOW)"
        )
    return None


def _sends_any(broker: ScriptedBroker) -> int:
    binary = sum(len(getattr(r, "payloads", ())) for r in broker.requests(BINARY_PUBLISH))
    return binary + len(broker.requests("publish"))


def _publish_op(ack: str = "per_message", *, retry: bool = False) -> dict[str, Any]:
    op = {"op": "publish", "stream": "orders", "payload": _b64(b"hello"), "ack": ack}
    return {**op, "retry": True} if retry else op


def _publish_script(handler: Callable[[], Handler]) -> Callable[[Sequence[str]], BrokerScript]:
    """Binary and JSON publishes served by one handler made per run (shared state)."""

    def script(peers: Sequence[str]) -> BrokerScript:
        serve = handler()
        return BrokerScript(_FULL.flags, _FULL.features, {BINARY_PUBLISH: serve, "publish": serve})

    return script


_VALUES = {"k1": b"value-one", "k2": b"value-two"}
_FULL = BrokerScript(KNOWN_FLAGS, _ALL_FEATURES)


def _script(
    handlers: Callable[[], dict[str, Handler]] = dict,
) -> Callable[[Sequence[str]], BrokerScript]:
    """A broker advertising everything; `handlers` is called per run, so no state
    (a held answer, a count) outlives the run it belongs to."""
    return lambda peers: BrokerScript(_FULL.flags, _FULL.features, handlers())


def _refusal_not_resent(
    code: ErrorCode, retry: RetryClass, retry_word: str, what: str, when: str
) -> ClientCase:
    """A case where the client's publish is refused with `code` (class `retry`): the client
    must report it as a refusal and never send it again (E4, §8)."""
    name = code.name.lower()
    return ClientCase(
        f"client.{name}-not-resent",
        f"a publish refused as {name} ({retry_word}) is reported, never sent again",
        "8 Error codes",
        f"A client MUST report a request refused with error code {what} as a refusal and "
        f"MUST NOT resend it{when} (E4, §8).",
        _publish_script(lambda: _refuse_first(code, retry)),
        (_publish_op(retry=True),),
        _judge_refusal_kept(name, retry),
        messages=("publish", "publish_error", "publish_batch", "publish_ack"),
        error_codes=(name,),
        retries=(retry_word,),
    )


CLIENT_CASES: tuple[ClientCase, ...] = (
    ClientCase(
        "client.connect-negotiates",
        "the client authenticates every stream it opens, offering its flags and features",
        "5.1 Connection setup",
        "A client MUST begin every stream with auth carrying its tenant, its token and "
        "client_flags (N1, N2).",
        _script(),
        (),
        _judge_connect,
        messages=("auth", "auth_ok"),
    ),
    ClientCase(
        "client.publish-acked",
        "an acked publish reaches the broker and its ack reaches the application",
        "5.2 Publishing",
        "A client MUST send an acked publish in a layout the broker advertised and report "
        "the broker's ack, with its offset when one was negotiated (P1, P4).",
        _script(lambda: {BINARY_PUBLISH: _ack_publish, "publish": _ack_publish}),
        (_publish_op(),),
        _judge_publish_acked,
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.publish-refused",
        "a refused publish is reported as the broker's refusal, with its code",
        "8 Error codes",
        "A client MUST report a refused acked publish as a refusal carrying the broker's "
        "error code, never as a success (P4, 8).",
        _script(
            lambda: {
                BINARY_PUBLISH: _refuse_publish(ErrorCode.FORBIDDEN, RetryClass.FATAL),
                "publish": _refuse_publish(ErrorCode.FORBIDDEN, RetryClass.FATAL),
            }
        ),
        (_publish_op(),),
        _judge_refused("forbidden"),
        messages=("publish", "publish_error", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.unknown-error-code",
        "a refusal with an error code the client does not know is still a refusal",
        "8 Error codes",
        "A client MUST treat an error code it does not know as a refusal (with the retry "
        "class the broker sent), not as a protocol failure or a success (8).",
        _script(
            lambda: {
                BINARY_PUBLISH: _refuse_publish("conformance_future_code", RetryClass.FATAL),
                "publish": _refuse_publish("conformance_future_code", RetryClass.FATAL),
            }
        ),
        (_publish_op(),),
        _judge_refused(None),
        messages=("publish", "publish_error", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.outcome-unknown-not-resent",
        "a publish refused as outcome_unknown is reported, never sent again by the client",
        "8 Error codes",
        "A client MUST NOT resend on its own a request refused with retry class "
        "outcome_unknown, since it may have been applied; it reports the refusal (8).",
        _script(lambda: {BINARY_PUBLISH: _outcome_unknown(), "publish": _outcome_unknown()}),
        (_publish_op(retry=True),),
        _judge_not_resent,
        messages=("publish", "publish_error", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.conditional-outcome-unknown-not-resent",
        "a conditional write refused as outcome_unknown is reported, never resent blindly",
        "9 Conditional writes",
        "A client MUST NOT resend on its own a publish_if whose answer was lost "
        "(refused outcome_unknown: it may have been applied); it reports the refusal, "
        "so the writer can read at expected_offset instead (C3).",
        _script(lambda: {"publish_if": _conditional_outcome_unknown()}),
        (
            {
                "op": "publish_if",
                "stream": "orders",
                "payload": _b64(_GUARDED),
                "expected_offset": 7,
            },
        ),
        _judge_conditional_not_resent,
        messages=("publish_if", "error"),
        error_codes=("quorum_timeout",),
        retries=("outcome_unknown",),
    ),
    ClientCase(
        "client.retry-resent",
        "a publish refused with retry class retry is sent again by a client with a retry policy",
        "8 Error codes",
        "A client acting on retry classes MAY resend a request refused with retry (nothing "
        "was applied) and reports the answer to the resend; one without a retry policy "
        "reports the refusal with its class (E4).",
        _publish_script(lambda: _refuse_first(ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY)),
        (_publish_op(retry=True),),
        _judge_acted_on(RetryClass.RETRY, resend=True),
        messages=("publish", "publish_error", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.retry-after-waited",
        "a publish refused with retry_after is resent no sooner than retry_after_ms",
        "8 Error codes",
        "A client that resends a request refused with retry_after MUST wait at least the "
        "detail's retry_after_ms first (E4).",
        _publish_script(
            lambda: _refuse_first(
                ErrorCode.OVERLOADED, RetryClass.RETRY_AFTER, retry_after_ms=_RETRY_AFTER_MS
            )
        ),
        (_publish_op(retry=True),),
        _judge_acted_on(RetryClass.RETRY_AFTER, resend=True, wait=_RETRY_AFTER_MS / 1000),
        messages=("publish", "publish_error", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.fatal-not-resent",
        "a publish refused with retry class fatal is reported, never sent again",
        "8 Error codes",
        "A client MUST NOT resend a request refused with retry class fatal, even with its "
        "retry policy on; it reports the refusal with that class (E4).",
        _publish_script(lambda: _refuse_first(ErrorCode.FORBIDDEN, RetryClass.FATAL)),
        (_publish_op(retry=True),),
        _judge_acted_on(RetryClass.FATAL, resend=False),
        messages=("publish", "publish_error", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.survives-stalled-link",
        "an answer held back for 3 s is waited for, not given up on or resent",
        "7 Ack modes and pipelining",
        "A client MUST wait for the answer to an acked publish across a stall shorter "
        "than its request timeout, without resending it (T19, E4).",
        _publish_script(lambda: _stalled_ack),
        (_publish_op(),),
        _judge_stalled,
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.survives-reset-link",
        "after the broker closes the connection mid-request, the next publish succeeds",
        "1 Transport",
        "A client MUST report a request whose connection was closed unanswered as a lost "
        "connection (never as a refusal or a hang), and connect again for the next "
        "request (T19).",
        _publish_script(_reset_first),
        (_publish_op(), _publish_op()),
        _judge_reset,
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.survives-silent-link",
        "after the link goes silent past the idle timeout, the client connects again",
        "1 Transport",
        "A client MUST notice a connection whose link went silent (no datagram either "
        "way, nothing closed) by its QUIC idle timeout, report the request it carried as "
        "a lost connection or a timeout (never a hang or a refusal), and connect again "
        "for the next request once the link is back (T19).",
        _silent_link_script,
        # Before the next publish the kit waits until the link is back (and no longer):
        # the case is about noticing a dead connection, not about connecting during
        # the outage, nor about keeping a new connection alive (client.keepalive-idle).
        (_publish_op(), {"op": "await_link", "seconds": _SILENCE}, _publish_op()),
        _judge_reconnected("silent"),
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
        link=True,
    ),
    ClientCase(
        "client.keepalive-idle",
        "a connection left idle longer than the broker's idle timeout is kept alive",
        "1 Transport",
        "A client MUST keep an idle connection alive (QUIC PINGs within the idle timeout "
        "both ends agreed on) so that a pooled connection or a quiet subscription does "
        "not idle out (T19).",
        lambda peers: BrokerScript(
            _FULL.flags,
            _FULL.features,
            {BINARY_PUBLISH: _ack_publish, "publish": _ack_publish},
            idle_timeout=_IDLE_TIMEOUT,
        ),
        (_publish_op(), {"op": "idle", "seconds": 2.5 * _IDLE_TIMEOUT}, _publish_op()),
        _judge_kept_alive,
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.lagged-resumed",
        "after subscription_lagged the client subscribes again from resume_from",
        "5.3 Subscribing and delivery",
        "A client that offered FEATURE_SUBSCRIPTION_LAGGED and EVENT_BATCH_OFFSETS MUST, "
        "when its event stream ends with subscription_lagged, subscribe again starting at "
        "exactly resume_from, the first offset dropped (S10).",
        _script(
            lambda: {
                "subscribe": _ending_subscribe(
                    lambda sid: SubscriptionLagged(subscription_id=sid, resume_from=_BASE + 2),
                    int(Feature.FEATURE_SUBSCRIPTION_LAGGED),
                )
            }
        ),
        ({"op": "subscribe", "stream": "orders", "count": 4, "timeout": 10},),
        _judge_resumed(Feature.FEATURE_SUBSCRIPTION_LAGGED, _BASE + 2, "resume_from"),
        messages=("subscribe", "subscribed", "event_stream_hello", "subscription_lagged"),
    ),
    ClientCase(
        "client.shard-moved-resumed",
        "after shard_moved the client resumes past what it already has",
        "5.3 Subscribing and delivery",
        "A client that offered FEATURE_SHARD_MOVED and EVENT_BATCH_OFFSETS MUST, when its "
        "event stream ends with shard_moved, subscribe again from max(last delivered + 1, "
        "resume_from): events 10 and 11 delivered and resume_from 11 mean 12 (S11).",
        _script(
            lambda: {
                "subscribe": _ending_subscribe(
                    lambda sid: ShardMoved(subscription_id=sid, resume_from=11, generation=2),
                    int(Feature.FEATURE_SHARD_MOVED),
                )
            }
        ),
        ({"op": "subscribe", "stream": "orders", "count": 4, "timeout": 10},),
        _judge_resumed(Feature.FEATURE_SHARD_MOVED, 12, "max(last delivered + 1, resume_from)"),
        messages=("subscribe", "subscribed", "event_stream_hello", "shard_moved"),
    ),
    ClientCase(
        "client.gap-detected",
        "two events missing between batches are reported as a gap",
        "5.3 Subscribing and delivery",
        "A client reading offsets MUST detect events missing between batches (base_offset "
        "past the last offset + 1) and report how many were lost before the next event "
        "(S8).",
        _script(lambda: {"subscribe": _gapped_subscribe}),
        ({"op": "subscribe", "stream": "orders", "count": 4, "timeout": 10},),
        _judge_gap,
        messages=("subscribe", "subscribed", "event_stream_hello"),
    ),
    ClientCase(
        "client.tolerates-unknown",
        "an unknown message type and an unknown field do not break the client",
        "2 Frame envelope",
        "A client MUST ignore a message type it does not know and fields it does not know, "
        "and go on with the answers it is waiting for (G3, N8).",
        _script(lambda: {BINARY_PUBLISH: _unknown_then_ack(), "publish": _unknown_then_ack()}),
        (_publish_op(),),
        _judge_publish_acked,
        messages=("publish", "publish_ok", "publish_batch", "publish_ack"),
    ),
    ClientCase(
        "client.answers-out-of-order",
        "answers that come back out of order are matched to their requests by request_id",
        "7 Ack modes and pipelining",
        "A client MUST match answers to requests by request_id, not by arrival order (R1).",
        _script(lambda: {"cache_get": _out_of_order_gets(_VALUES)}),
        ({"op": "cache_get", "cache": "primary", "keys": list(_VALUES)},),
        _judge_values(_VALUES),
        messages=("cache_get", "cache_value"),
    ),
    ClientCase(
        "client.no-ungated-request",
        "the client does not send a request the broker did not advertise",
        "6 Negotiation",
        "A client MUST NOT send a request whose feature the broker did not advertise; it "
        "reports the operation as unsupported instead (N6).",
        lambda peers: BrokerScript(
            KNOWN_FLAGS,
            _ALL_FEATURES & ~int(Feature.FEATURE_CACHE_DELETE),
            {"cache_delete": _refuse_ungated},
        ),
        ({"op": "cache_delete", "cache": "primary", "key": "k1"},),
        _judge_ungated,
        messages=("cache_delete",),
    ),
    ClientCase(
        "client.legacy-broker",
        "against a broker that negotiates nothing, the client falls back to JSON",
        "6 Negotiation",
        "A client MUST, when auth is answered with a plain ok (a broker that negotiates "
        "nothing), send only JSON messages (N2, N3).",
        lambda peers: BrokerScript(
            0, 0, {"publish": _ack_publish, "publish_batch": _ack_publish}, legacy=True
        ),
        (_publish_op(),),
        _judge_legacy,
        messages=("auth", "ok", "publish", "publish_ok"),
    ),
    ClientCase(
        "client.not-leader-followed",
        "a subscribe answered with not_leader is sent again to the broker it names",
        "9 Topology and redirects",
        "A client that offered FEATURE_REDIRECT MUST follow not_leader to the broker whose "
        "addr it names and subscribe there (D2).",
        lambda peers: BrokerScript(_FULL.flags, _FULL.features, {"subscribe": _redirect_to(peers)}),
        ({"op": "subscribe", "stream": "orders", "count": 2, "timeout": 10},),
        _judge_followed,
        messages=("subscribe", "not_leader", "subscribed", "event_stream_hello"),
        peers=(_script(lambda: {"subscribe": _subscribe}),),
    ),
    ClientCase(
        "client.subscribe-delivers",
        "a subscription's events reach the application in order",
        "5.3 Subscribing and delivery",
        "A client MUST read a subscription's events from the event stream the broker opens "
        "(after its event_stream_hello) in any layout it offered, in order (S1, 3.4).",
        _script(lambda: {"subscribe": _subscribe}),
        ({"op": "subscribe", "stream": "orders", "count": 2, "timeout": 10},),
        _judge_subscribe,
        messages=("subscribe", "subscribed", "event_stream_hello", "event_batch"),
    ),
    ClientCase(
        "client.json-event-delivered",
        "events sent as single JSON `event` messages reach the application in order",
        "5.3 Subscribing and delivery",
        "A client MUST read events in every encoding a broker may send on an event stream, "
        "the JSON single-event compatibility encoding (`event`) included, in order (S1, G3).",
        _script(lambda: {"subscribe": _json_events}),
        ({"op": "subscribe", "stream": "orders", "count": 2, "timeout": 10},),
        _judge_json_events,
        messages=("subscribe", "subscribed", "event_stream_hello", "event"),
    ),
    ClientCase(
        "client.skipped-not-lost",
        "offsets a batch says it skipped are not reported as lost events",
        "5.3 Subscribing and delivery",
        "A client that offered EVENT_BATCH_SKIPPED MUST count a batch's skipped_before "
        "offsets as holding no event, never as events lost: events 10, 11 then 14, 15 "
        "with skipped_before 2 lose nothing (S8, L2).",
        _script(lambda: {"subscribe": _skipping_subscribe}),
        ({"op": "subscribe", "stream": "orders", "count": 4, "timeout": 10},),
        _judge_skipped,
        messages=("subscribe", "subscribed", "event_stream_hello"),
        layouts=("event_batch_legacy", "event_batch_shared"),
        flags=(0x0822, 0x0824),
    ),
    ClientCase(
        "client.owner-named-refusal",
        "a binary ack naming the owner (0x0290 / 0x0690) is read: followed or reported",
        "3.3 Binary publish ack",
        "A client that offered BINARY_PUBLISH_ACK_OWNER and _CODE MUST read a refusal in "
        "the owner-named ack layout (owner, code and retry class, and detail when offered) "
        "and either publish to the owner it names or report the not_leader refusal (L3, E4).",
        lambda peers: BrokerScript(
            _FULL.flags,
            _FULL.features,
            {BINARY_PUBLISH: _owner_named_refusal(peers), "publish": _owner_named_refusal(peers)},
        ),
        (_publish_op(),),
        _judge_owner_named,
        messages=("publish_batch", "publish_ack", "publish", "publish_error"),
        layouts=("publish_batch", "publish_ack"),
        flags=(0x0290, 0x0690),
        error_codes=("not_leader",),
        retries=("redirect",),
        peers=(_script(lambda: {BINARY_PUBLISH: _ack_publish, "publish": _ack_publish}),),
    ),
    _refusal_not_resent(
        ErrorCode.INTERNAL,
        RetryClass.OUTCOME_UNKNOWN,
        "outcome_unknown",
        "internal (retry class outcome_unknown: it may have been applied)",
        " on its own, even with its retry policy on",
    ),
    _refusal_not_resent(
        ErrorCode.REVOKED,
        RetryClass.FATAL,
        "fatal",
        "revoked (16, the official client's table; a revoked credential, retry class fatal)",
        ", even with its retry policy on",
    ),
    ClientCase(
        "client.stream-publish-window",
        "a client keeps at most publish_window acked publishes unanswered per stream",
        "7 Ack modes and pipelining",
        "A client granted a publish window of 2 per stream (FEATURE_PUBLISH_PIPELINE and "
        "FEATURE_STREAM_PUBLISH_WINDOW advertised) MUST never have more than 2 acked "
        "publishes unanswered on one stream, whatever the application hands it (PL1, PL3).",
        _window_script,
        (
            {
                "op": "publish_many",
                "stream": "orders",
                "payloads": [_b64(f"windowed-{n}".encode()) for n in range(_WINDOW_PUBLISHES)],
            },
        ),
        _judge_window,
        messages=("auth", "auth_ok", "publish", "publish_ok", "publish_batch", "publish_ack"),
        features=("FEATURE_PUBLISH_PIPELINE", "FEATURE_STREAM_PUBLISH_WINDOW"),
    ),
)
