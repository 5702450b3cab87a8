"""The protocol core of one client-opened stream, without I/O (sans-IO).

A `Session` is fed the bytes the broker sent on one bidirectional stream and
returns events; it builds the bytes the client sends. It owns:

- the stream's state machine (auth first, exactly once), as a table;
- negotiation: the client's offer, the broker's answer (`auth_ok` or a plain
  `ok`), and the gates of every request, checked before any byte is built;
- the choice between a binary publish frame and its JSON fallback, from the
  frame flags the broker advertised;
- request correlation: answers carrying a `request_id` are matched by it; the
  few answers the protocol sends without one (`subscribed`, `error`,
  `subscribe_cursor_error`, ...) are matched by position.

The asyncio adapter (`_channel.py`) writes what this returns and resolves the
futures its events name. Everything here runs in tests without a socket.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from felix_wire.binary import AckStatus, BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.errors import BrokerError, NotLeaderError, broker_error
from felix_wire.features import Capabilities, Feature
from felix_wire.flags import Flag
from felix_wire.frame import HEADER_SIZE, MAX_FRAME_BYTES, FrameReader
from felix_wire.gating import (
    FIELD_GATES,
    MESSAGE_GATES,
    REQUEST_ANSWERS,
    client_auth,
    server_capabilities,
)
from felix_wire.messages import (
    AckMode,
    AuthOk,
    Error,
    ErrorDetail,
    Message,
    NotLeader,
    Ok,
    Publish,
    PublishBatch,
    PublishError,
    PublishIdempotent,
    PublishOk,
    SubscribeCursorError,
    Unknown,
    Unsupported,
)
from felix_wire.wire_errors import WireError

from .errors import (
    CursorError,
    NotSupportedByBrokerError,
    PayloadTooLargeError,
    ProtocolViolationError,
)

__all__ = [
    "DEFAULT_OFFER",
    "Answered",
    "AuthRefused",
    "Authenticated",
    "Closed",
    "Offer",
    "Refused",
    "Session",
    "SessionEvent",
    "SessionState",
    "Unsolicited",
    "message_type",
]


@dataclass(frozen=True, slots=True)
class Offer:
    """What the client announces in `auth`: frame flags it reads and features it implements."""

    flags: int
    features: int


# Every layout and modifier this client decodes or sends (idempotent frames are
# sent by `producer.Producer`).
_OFFERED_FLAGS = int(
    Flag.BINARY_PUBLISH_IDEMPOTENT
    | Flag.BINARY_PUBLISH_BATCH
    | Flag.BINARY_EVENT_BATCH
    | Flag.BINARY_EVENT_BATCH_SHARED
    | Flag.BINARY_PUBLISH_ACKED
    | Flag.BINARY_PUBLISH_ACK
    | Flag.EVENT_BATCH_OFFSETS
    | Flag.BINARY_PUBLISH_KEYED
    | Flag.BINARY_PUBLISH_ACK_OWNER
    | Flag.BINARY_PUBLISH_ACK_CODE
    | Flag.BINARY_PUBLISH_ACK_DETAIL
    | Flag.EVENT_BATCH_SKIPPED
    | Flag.BINARY_PUBLISH_ACK_OFFSET
    | Flag.EVENT_BATCH_PUBLISHER
    | Flag.EVENT_BATCH_TIMESTAMPS
)
# Client-direction features: what the broker may send us. FEATURE_REDIRECT: the
# client follows `not_leader` (the client's `_follow`); FEATURE_SHARD_MOVED: its
# feeds resume after `shard_moved`; the owner hint flag is in the flags above.
_OFFERED_FEATURES = int(
    Feature.FEATURE_REDIRECT
    | Feature.FEATURE_ERROR_CODES
    | Feature.FEATURE_SHARD_MOVED
    | Feature.FEATURE_UNSUPPORTED
    | Feature.FEATURE_PUBLISH_PIPELINE
    | Feature.FEATURE_SUBSCRIPTION_LAGGED
    | Feature.FEATURE_CACHE_CONDITIONAL
    | Feature.FEATURE_GROUP_SKIPPED
    | Feature.FEATURE_GROUP_PUBLISHER
    | Feature.FEATURE_RECORD_TIMESTAMPS
    # The client decodes publish_refused (the idempotent producer's and the
    # conditional writes' typed refusals); without it they come as plain errors.
    | Feature.FEATURE_IDEMPOTENT_PRODUCER
    # A reused sequence with other payloads is refused, not silently dropped.
    | Feature.FEATURE_SEQUENCE_REUSED
    # An extended-word bit: offering it sets the marker, so the broker sends its
    # own extended word (where FEATURE_INSPECT is advertised).
    | Feature.FEATURE_INSPECT
)
DEFAULT_OFFER = Offer(_OFFERED_FLAGS, _OFFERED_FEATURES)


class SessionState(enum.Enum):
    AWAIT_AUTH = "await_auth"
    OPEN = "open"
    CLOSED = "closed"


class _Input(enum.Enum):
    AUTH_ANSWER = "auth_answer"  # auth_ok / ok
    AUTH_REFUSAL = "auth_refusal"  # error before auth completed
    ANSWER = "answer"  # anything after auth


class _Action(enum.Enum):
    ACCEPT_AUTH = "accept_auth"
    REFUSE_AUTH = "refuse_auth"
    ROUTE = "route"
    VIOLATION = "violation"


# (state, input) -> action. A broker answers auth before anything else on the
# stream (T5), so an answer before auth, or an auth answer after it, is a
# protocol violation; a CLOSED session reads nothing more.
_TRANSITIONS: dict[tuple[SessionState, _Input], _Action] = {
    (SessionState.AWAIT_AUTH, _Input.AUTH_ANSWER): _Action.ACCEPT_AUTH,
    (SessionState.AWAIT_AUTH, _Input.AUTH_REFUSAL): _Action.REFUSE_AUTH,
    (SessionState.AWAIT_AUTH, _Input.ANSWER): _Action.VIOLATION,
    (SessionState.OPEN, _Input.AUTH_ANSWER): _Action.VIOLATION,
    (SessionState.OPEN, _Input.AUTH_REFUSAL): _Action.ROUTE,
    (SessionState.OPEN, _Input.ANSWER): _Action.ROUTE,
}


# -- events --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The broker accepted the stream's auth; `capabilities` is what it advertised."""

    capabilities: Capabilities
    publish_window: int | None


@dataclass(frozen=True, slots=True)
class AuthRefused:
    """The broker refused the auth; the stream is over."""

    error: BrokerError


@dataclass(frozen=True, slots=True)
class Answered:
    """The answer to request `request_id`."""

    request_id: int
    answer: Message | PublishAckFrame


@dataclass(frozen=True, slots=True)
class Refused:
    """Request `request_id` was refused (or answered with something it cannot take)."""

    request_id: int
    error: Exception


@dataclass(frozen=True, slots=True)
class Unsolicited:
    """A frame that answers nothing outstanding (logged by the adapter, then dropped)."""

    value: object


@dataclass(frozen=True, slots=True)
class Closed:
    """The stream is over; `lost` are the requests left without an answer."""

    lost: tuple[int, ...]
    error: Exception | None


SessionEvent = Authenticated | AuthRefused | Answered | Refused | Unsolicited | Closed

# Publishes are answered by request_id, always; they never take an answer
# without one, so positional matching skips them.
_PUBLISH_TYPES = frozenset({"publish", "publish_batch", "publish_idempotent"})
# Answers the protocol sends without a request_id, and the requests they can answer.
_CURSOR_REQUESTS = frozenset({"subscribe", "cache_watch", "stream_read"})


def message_type(message: Message) -> str:
    """The wire `type` of a message struct."""
    return str(type(message).__struct_config__.tag)


def _carries_request_id(message: Message) -> bool:
    return "request_id" in type(message).__struct_fields__


def _detail_dict(detail: ErrorDetail | None) -> dict[str, Any] | None:
    if detail is None:
        return None
    out: dict[str, Any] = {}
    if detail.reason is not None:
        out["reason"] = detail.reason
    if detail.retry_after_ms is not None:
        out["retry_after_ms"] = detail.retry_after_ms
    return out


def _ack_error(ack: PublishAckFrame) -> BrokerError:
    detail: dict[str, Any] = {}
    # An empty reason and a zero wait mean "not given" (§3.3).
    if ack.reason:
        detail["reason"] = ack.reason
    if ack.retry_after_ms:
        detail["retry_after_ms"] = ack.retry_after_ms
    return broker_error(
        ack.message,
        ack.code,
        int(ack.retry) if ack.retry is not None else None,
        detail or None,
        ack.request_id,
    )


class Session:
    """The client side of one authenticated stream.

    Call `auth_frame(token)` once and send it; feed every chunk read from the
    stream to `receive` and the end of the stream to `end_of_stream`. Build
    requests with `request` and publishes with `publish`; both raise
    `NotSupportedByBrokerError` before building anything the broker did not
    advertise.
    """

    def __init__(
        self,
        tenant_id: str,
        *,
        offer: Offer = DEFAULT_OFFER,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.tenant_id = tenant_id
        self.offer = offer
        self.state = SessionState.AWAIT_AUTH
        self.capabilities: Capabilities | None = None
        self.publish_window: int | None = None
        self._reader = FrameReader(max_payload=max_frame_bytes)
        self._next_id = 1
        # Outstanding requests, oldest first: request_id -> request type.
        self._keyed: dict[int, str] = {}
        # Requests whose answers carry no request_id, in the order they were sent.
        self._unkeyed: deque[tuple[int, str]] = deque()
        self._auth_sent = False

    # -- state -----------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self._keyed) + len(self._unkeyed)

    @property
    def closed(self) -> bool:
        return self.state is SessionState.CLOSED

    def auth_frame(self, token: str) -> bytes:
        """The stream's first frame: tenant, token, and the client's offer."""
        if self._auth_sent:
            raise RuntimeError("auth is sent exactly once per stream")
        self._auth_sent = True
        auth = client_auth(
            self.tenant_id,
            token,
            client_flags=self.offer.flags,
            client_features=self.offer.features,
        )
        return encode_frame(auth)

    def _peer(self) -> Capabilities:
        if self.state is not SessionState.OPEN or self.capabilities is None:
            raise RuntimeError("the stream is not authenticated")
        return self.capabilities

    # -- requests --------------------------------------------------------------------

    def check(self, message: Message) -> None:
        """Raise NotSupportedByBrokerError unless the broker advertised what `message`
        needs: its own gate, and the gate of every optional field it sets."""
        check_supported(message, self._peer())

    def request(self, build: Callable[[int], Message]) -> tuple[int, bytes]:
        """Assign a request id, build the message with it, check its gates, and
        return the id and the frame bytes. Messages without a `request_id` field
        are correlated by position instead."""
        peer = self._peer()
        request_id = self._take_id()
        message = build(request_id)
        check_supported(message, peer)
        kind = message_type(message)
        if kind not in REQUEST_ANSWERS:
            raise ValueError(f"{kind} is not a request that gets an answer")
        if _carries_request_id(message) and getattr(message, "request_id", None) != request_id:
            raise ValueError("build() must use the request id it is given")
        frame = _fitting(encode_frame(message), kind)
        if _carries_request_id(message):
            self._keyed[request_id] = kind
        else:
            self._unkeyed.append((request_id, kind))
        return request_id, frame

    def publish(
        self,
        *,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        ack: AckMode,
        single: bool,
    ) -> tuple[int | None, bytes]:
        """A publish, as a binary frame when the broker advertised the flags it
        needs, otherwise as the JSON compatibility message. Returns the request id
        (None when unacked: nothing will answer) and the frame bytes."""
        peer = self._peer()
        size = sum(len(p) for p in payloads)
        if size > MAX_FRAME_BYTES:
            raise PayloadTooLargeError("a publish payload", size, MAX_FRAME_BYTES)
        acked = ack is not AckMode.NONE
        needed = Flag.BINARY_PUBLISH_BATCH
        if acked:
            needed |= Flag.BINARY_PUBLISH_ACKED
        if key is not None:
            needed |= Flag.BINARY_PUBLISH_KEYED
        request_id = self._take_id() if acked else None
        frame: bytes
        if peer.has(flags=int(needed)):
            mode = None
            if acked:
                mode = (
                    BinaryAckMode.PER_MESSAGE
                    if ack is AckMode.PER_MESSAGE
                    else BinaryAckMode.PER_BATCH
                )
            frame = encode_frame(
                PublishBatchFrame(
                    request_id=request_id,
                    ack_mode=mode,
                    key=key,
                    tenant_id=self.tenant_id,
                    namespace=namespace,
                    stream=stream,
                    payloads=payloads,
                )
            )
            kind = "publish_batch"
        elif single and len(payloads) == 1:
            # JSON publish knows none|per_message (§5.2).
            frame = encode_frame(
                Publish(
                    tenant_id=self.tenant_id,
                    namespace=namespace,
                    stream=stream,
                    payload=payloads[0],
                    key=key,
                    request_id=request_id,
                    ack=AckMode.PER_MESSAGE if acked else None,
                )
            )
            kind = "publish"
        else:
            # JSON publish_batch knows none|per_batch; one answer for the batch.
            frame = encode_frame(
                PublishBatch(
                    tenant_id=self.tenant_id,
                    namespace=namespace,
                    stream=stream,
                    payloads=payloads,
                    key=key,
                    request_id=request_id,
                    ack=AckMode.PER_BATCH if acked else None,
                )
            )
            kind = "publish_batch"
        frame = _fitting(frame, "a publish")
        if request_id is not None:
            self._keyed[request_id] = kind
        return request_id, frame

    def publish_idempotent(
        self,
        *,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        producer_id: int,
        sequence: int,
    ) -> tuple[int, bytes]:
        """Batch `sequence` of idempotent producer `producer_id`: the binary frame
        (flag 0x0100 on an acked batch) when the broker reads it, else JSON
        `publish_idempotent`. Always answered in JSON (publish_ok / publish_error /
        publish_refused), matched by the returned request id."""
        peer = self._peer()
        request_id = self._take_id()
        message = PublishIdempotent(
            tenant_id=self.tenant_id,
            namespace=namespace,
            stream=stream,
            payloads=payloads,
            key=key,
            request_id=request_id,
            producer_id=producer_id,
            sequence=sequence,
        )
        check_supported(message, peer)
        needed = Flag.BINARY_PUBLISH_BATCH | Flag.BINARY_PUBLISH_ACKED
        needed |= Flag.BINARY_PUBLISH_IDEMPOTENT
        if key is not None:
            needed |= Flag.BINARY_PUBLISH_KEYED
        if peer.has(flags=int(needed)):
            frame = encode_frame(
                PublishBatchFrame(
                    request_id=request_id,
                    ack_mode=BinaryAckMode.PER_BATCH,
                    producer_id=producer_id,
                    sequence=sequence,
                    key=key,
                    tenant_id=self.tenant_id,
                    namespace=namespace,
                    stream=stream,
                    payloads=payloads,
                )
            )
        else:
            frame = encode_frame(message)
        frame = _fitting(frame, "an idempotent publish")
        self._keyed[request_id] = "publish_idempotent"
        return request_id, frame

    def forget(self, request_id: int) -> None:
        """Stop waiting for a keyed request's answer (its caller gave up). Positional
        requests stay queued: their answer still takes their place."""
        self._keyed.pop(request_id, None)

    def _take_id(self) -> int:
        request_id = self._next_id
        self._next_id += 1
        return request_id

    # -- input -----------------------------------------------------------------------

    def receive(self, data: bytes) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        if self.closed:
            return out
        try:
            frames = self._reader.feed(data)
            for frame in frames:
                if self.closed:
                    break
                self._frame(decode_payload(frame.flags, frame.payload), out)
        except WireError as exc:
            self._close(out, ProtocolViolationError(f"undecodable frame from broker: {exc}"))
        return out

    def end_of_stream(self) -> list[SessionEvent]:
        """The broker finished its side of the stream."""
        out: list[SessionEvent] = []
        if not self.closed:
            error: Exception | None = None
            try:
                self._reader.close()
            except WireError as exc:
                error = ProtocolViolationError(f"stream ended inside a frame: {exc}")
            self._close(out, error)
        return out

    def abort(self, error: Exception) -> list[SessionEvent]:
        """The stream failed underneath (reset, connection lost)."""
        out: list[SessionEvent] = []
        if not self.closed:
            self._close(out, error)
        return out

    def _frame(self, value: object, out: list[SessionEvent]) -> None:
        if isinstance(value, AuthOk | Ok):
            kind = _Input.AUTH_ANSWER
        elif isinstance(value, Error) and self.state is SessionState.AWAIT_AUTH:
            kind = _Input.AUTH_REFUSAL
        else:
            kind = _Input.ANSWER
        action = _TRANSITIONS[(self.state, kind)]
        if action is _Action.ACCEPT_AUTH:
            assert isinstance(value, AuthOk | Ok)
            self._accept_auth(value, out)
        elif action is _Action.REFUSE_AUTH:
            assert isinstance(value, Error)
            error = broker_error(
                value.message, value.code, value.retry, _detail_dict(value.detail), None
            )
            out.append(AuthRefused(error))
            self._close(out, error)
        elif action is _Action.ROUTE:
            self._route(value, out)
        else:
            name = type(value).__name__
            self._close(out, ProtocolViolationError(f"unexpected {name} in state {self.state}"))

    def _accept_auth(self, answer: AuthOk | Ok, out: list[SessionEvent]) -> None:
        caps = server_capabilities(answer)
        window = None
        # A window without the feature bit reads as no window (PL1).
        if (
            isinstance(answer, AuthOk)
            and answer.publish_window
            and caps.has_feature(Feature.FEATURE_PUBLISH_PIPELINE)
            and self.offer.features & Feature.FEATURE_PUBLISH_PIPELINE
        ):
            window = answer.publish_window
        self.capabilities = caps
        self.publish_window = window
        self.state = SessionState.OPEN
        out.append(Authenticated(caps, window))

    def _route(self, value: object, out: list[SessionEvent]) -> None:
        if isinstance(value, PublishAckFrame):
            self._answer_keyed(value.request_id, value, out, error=self._ack_outcome(value))
        elif isinstance(value, PublishOk):
            self._answer_keyed(value.request_id, value, out)
        elif isinstance(value, PublishError):
            error = broker_error(
                value.message,
                value.code,
                value.retry,
                _detail_dict(value.detail),
                value.request_id,
            )
            self._answer_keyed(value.request_id, value, out, error=error)
        elif isinstance(value, Error):
            error = broker_error(
                value.message, value.code, value.retry, _detail_dict(value.detail), None
            )
            self._answer_positional(value, out, error=error, accept=None)
        elif isinstance(value, Unsupported):
            self._unsupported(value, out)
        elif isinstance(value, SubscribeCursorError):
            cursor = CursorError(str(value.reason), value.requested, value.available)
            self._answer_positional(value, out, error=cursor, accept=_CURSOR_REQUESTS)
        elif isinstance(value, NotLeader):
            error = NotLeaderError(
                f"not the leader; the owner is {value.node_id} at {value.addr or 'unknown'}",
                detail={
                    "node_id": value.node_id,
                    "addr": value.addr,
                    "generation": value.generation,
                },
            )
            self._answer_positional(value, out, error=error, accept=None)
        elif isinstance(value, Unknown) or not hasattr(type(value), "__struct_config__"):
            # An unknown message type (a newer broker) or a broker-to-client binary
            # layout on a request stream: nothing here can take it.
            out.append(Unsolicited(value))
        else:
            message: Any = value
            request_id = getattr(message, "request_id", None)
            if request_id is not None:
                self._answer_keyed(request_id, message, out)
            else:
                self._answer_unkeyed(message, out)

    @staticmethod
    def _ack_outcome(ack: PublishAckFrame) -> BrokerError | None:
        return None if ack.status is AckStatus.OK else _ack_error(ack)

    def _answer_keyed(
        self,
        request_id: int,
        value: Message | PublishAckFrame,
        out: list[SessionEvent],
        *,
        error: Exception | None = None,
    ) -> None:
        kind = self._keyed.pop(request_id, None)
        if kind is None:
            out.append(Unsolicited(value))
            return
        if error is not None:
            out.append(Refused(request_id, error))
            return
        answer_type = "publish_ack" if isinstance(value, PublishAckFrame) else message_type(value)
        allowed = REQUEST_ANSWERS.get(kind, ())
        if kind in _PUBLISH_TYPES:
            allowed = (*allowed, "publish_ack")
        if answer_type not in allowed:
            out.append(
                Refused(request_id, ProtocolViolationError(f"{kind} answered with {answer_type}"))
            )
            return
        out.append(Answered(request_id, value))

    def _answer_unkeyed(self, message: Message, out: list[SessionEvent]) -> None:
        answer_type = message_type(message)
        if self._unkeyed and answer_type in REQUEST_ANSWERS.get(self._unkeyed[0][1], ()):
            request_id, _kind = self._unkeyed.popleft()
            out.append(Answered(request_id, message))
        else:
            out.append(Unsolicited(message))

    def _answer_positional(
        self,
        value: Message,
        out: list[SessionEvent],
        *,
        error: Exception,
        accept: frozenset[str] | None,
    ) -> None:
        """An answer without a request_id refuses the oldest request that can take
        it: positional requests first (their answers never carry an id), then the
        oldest keyed request that is not a publish (a publish refusal always comes
        as publish_error or a binary ack, with its id)."""
        if self._unkeyed and (accept is None or self._unkeyed[0][1] in accept):
            request_id, _kind = self._unkeyed.popleft()
            out.append(Refused(request_id, error))
            return
        for request_id, kind in self._keyed.items():
            if kind not in _PUBLISH_TYPES and (accept is None or kind in accept):
                del self._keyed[request_id]
                out.append(Refused(request_id, error))
                return
        out.append(Unsolicited(value))

    def _unsupported(self, value: Unsupported, out: list[SessionEvent]) -> None:
        error = NotSupportedByBrokerError(value.request_type)
        if value.request_id is not None and value.request_id in self._keyed:
            del self._keyed[value.request_id]
            out.append(Refused(value.request_id, error))
            return
        # Brokers that do not echo the id: the oldest request of that type.
        for request_id, kind in self._keyed.items():
            if kind == value.request_type:
                del self._keyed[request_id]
                out.append(Refused(request_id, error))
                return
        for index, (request_id, kind) in enumerate(self._unkeyed):
            if kind == value.request_type:
                del self._unkeyed[index]
                out.append(Refused(request_id, error))
                return
        out.append(Unsolicited(value))

    def _close(self, out: list[SessionEvent], error: Exception | None) -> None:
        lost = tuple(self._keyed) + tuple(request_id for request_id, _ in self._unkeyed)
        self._keyed.clear()
        self._unkeyed.clear()
        self.state = SessionState.CLOSED
        out.append(Closed(lost, error))


def _fitting(frame: bytes, what: str) -> bytes:
    """`frame`, unless its payload is over the protocol's frame limit (the broker
    would reset the stream): then PayloadTooLargeError, before anything is sent."""
    size = len(frame) - HEADER_SIZE
    if size > MAX_FRAME_BYTES:
        raise PayloadTooLargeError(f"{what} frame", size, MAX_FRAME_BYTES)
    return frame


def check_supported(message: Message, peer: Capabilities) -> None:
    """Raise NotSupportedByBrokerError unless `peer` advertised what `message` needs,
    including the gate of every optional field it sets (a field the broker would
    ignore must not be sent silently: the caller asked for its effect)."""
    kind = message_type(message)
    gate = MESSAGE_GATES.get(kind)
    if gate is not None and not peer.has(gate.flags, gate.features):
        raise NotSupportedByBrokerError(kind, gate.names)
    for field_gate in FIELD_GATES.get(kind, ()):
        if getattr(message, field_gate.attr) != field_gate.absent and not peer.has(
            field_gate.flags, field_gate.features
        ):
            raise NotSupportedByBrokerError(f"{kind}.{field_gate.attr}", field_gate.names)
