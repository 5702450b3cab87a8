"""The protocol core of one client stream, without I/O (sans-IO).

Fed the bytes of a client stream (`receive`) and its end (`end_of_stream`), it
returns what to do next: frames to send, requests for the broker to execute,
whether the stream has authenticated, and whether to end the stream. It owns:

- the stream's state machine (auth first, exactly one auth), as a table;
- the frame limits (the pre-auth cap until auth succeeds, then max_frame_bytes);
- negotiation: what the client announced in its auth, and the auth answer;
- the shaping of every answer to what the client announced (no flag, message or
  field it did not offer ever leaves).

The QUIC adapter (`session/quic.py`) hands the requests to the dispatch table; handlers ask the
core to build their answers (`message`, `error`, `publish_answer`).
"""

from __future__ import annotations

import contextlib
import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from felix_common.tokens import Principal
from felix_wire import encode_frame
from felix_wire.binary import AckStatus, PublishAckFrame, PublishBatchFrame, decode_publish_batch
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import Capabilities, Feature
from felix_wire.flags import Flag, layout_of
from felix_wire.frame import FrameReader
from felix_wire.gating import auth_answer, client_capabilities, shape_for_peer
from felix_wire.messages import (
    BROKER_TO_CLIENT,
    Auth,
    Error,
    ErrorDetail,
    Message,
    Publish,
    PublishBatch,
    PublishError,
    PublishOk,
    Unknown,
    Unsupported,
    decode_message,
)
from felix_wire.wire_errors import (
    FlagError,
    FrameError,
    MalformedJsonError,
    MessageFieldError,
    NotNegotiatedError,
    PayloadDecodeError,
)

__all__ = [
    "AuthRefusedError",
    "Authenticated",
    "Dispatch",
    "End",
    "Output",
    "Send",
    "State",
    "StreamProtocol",
]

_U64 = struct.Struct(">Q")


class State(enum.Enum):
    AWAIT_AUTH = "await_auth"
    OPEN = "open"
    CLOSED = "closed"


class _Input(enum.Enum):
    AUTH = "auth"
    REQUEST = "request"  # a client-to-broker JSON message other than auth
    PUBLISH_FRAME = "publish_frame"  # a binary publish batch
    ANSWER_TYPE = "answer_type"  # a broker-to-client message type sent by a client
    UNKNOWN_TYPE = "unknown_type"


class _Action(enum.Enum):
    AUTHENTICATE = "authenticate"
    REFUSE_UNAUTHENTICATED = "refuse_unauthenticated"
    SECOND_AUTH = "second_auth"
    DISPATCH = "dispatch"
    UNEXPECTED_TYPE = "unexpected_type"
    UNKNOWN_TYPE = "unknown_type"


# (state, input) -> action. Anything not in the table cannot happen: a CLOSED
# stream reads nothing more.
_TRANSITIONS: dict[tuple[State, _Input], _Action] = {
    # Every client stream authenticates on its own, first (T5).
    (State.AWAIT_AUTH, _Input.AUTH): _Action.AUTHENTICATE,
    (State.AWAIT_AUTH, _Input.REQUEST): _Action.REFUSE_UNAUTHENTICATED,
    (State.AWAIT_AUTH, _Input.PUBLISH_FRAME): _Action.REFUSE_UNAUTHENTICATED,
    (State.AWAIT_AUTH, _Input.ANSWER_TYPE): _Action.REFUSE_UNAUTHENTICATED,
    (State.AWAIT_AUTH, _Input.UNKNOWN_TYPE): _Action.REFUSE_UNAUTHENTICATED,
    # Exactly one auth per stream: a second one is invalid_request, the stream goes on.
    (State.OPEN, _Input.AUTH): _Action.SECOND_AUTH,
    (State.OPEN, _Input.REQUEST): _Action.DISPATCH,
    (State.OPEN, _Input.PUBLISH_FRAME): _Action.DISPATCH,
    # A broker message from a client: invalid_request, then the stream is closed (N9).
    (State.OPEN, _Input.ANSWER_TYPE): _Action.UNEXPECTED_TYPE,
    # Unknown type: unsupported when both sides negotiated it, else the stream closes (N8).
    (State.OPEN, _Input.UNKNOWN_TYPE): _Action.UNKNOWN_TYPE,
}


@dataclass(frozen=True, slots=True)
class Send:
    """Write these frame bytes on the stream."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Execute this request (a JSON message or a binary publish batch)."""

    request: Message | PublishBatchFrame


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The stream's auth succeeded (raise limits, count it for the auth timeout)."""

    principal: Principal


@dataclass(frozen=True, slots=True)
class End:
    """End the stream: `reset` abandons it (RESET_STREAM + STOP_SENDING), otherwise
    FIN after what was sent, and stop reading."""

    reset: bool = False


Output = Send | Dispatch | Authenticated | End


class AuthRefusedError(Exception):
    """Raised by the authenticator: the auth is answered with this code and message."""

    def __init__(self, code: ErrorCode, message: str, check: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.check = check


Authenticator = Callable[[Auth], Principal]


class StreamProtocol:
    """The protocol state of one client stream.

    `server_flags` / `server_features` are what this broker advertises;
    `publish_only` marks a client-opened unidirectional stream, which carries
    only auth and publishes and on which nothing is ever answered (T7).
    """

    def __init__(
        self,
        *,
        authenticate: Authenticator,
        server_flags: int,
        server_features: int,
        publish_window: int,
        preauth_max_frame_bytes: int,
        max_frame_bytes: int,
        publish_only: bool = False,
    ) -> None:
        self._authenticate = authenticate
        self.server_flags = server_flags
        self.server_features = server_features
        self.publish_window = publish_window
        self._max_frame_bytes = max_frame_bytes
        self._reader = FrameReader(max_payload=preauth_max_frame_bytes)
        self.publish_only = publish_only
        self.state = State.AWAIT_AUTH
        # Until auth says otherwise the client is an original v1 peer (N2).
        self.client = Capabilities()
        self.principal: Principal | None = None
        # The bearer token the stream authenticated with: a fleet member forwards it
        # with the stream's forwarded requests, for the owner to verify again.
        self.token: str | None = None

    # -- input -------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Output]:
        out: list[Output] = []
        if self.state is State.CLOSED:
            return out
        try:
            frames = self._reader.feed(data)
        except FrameError:
            # A bad header (magic, version, or a length over the cap) ends the stream
            # on the header alone; nothing after it can be framed.
            self._close(out, reset=True)
            return out
        for frame in frames:
            if self.closed:
                break
            self._frame(frame.flags, frame.payload, out)
        return out

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def end_of_stream(self) -> list[Output]:
        """The client finished its side: a partial frame is dropped, the stream ends."""
        out: list[Output] = []
        if self.state is not State.CLOSED:
            with contextlib.suppress(FrameError):
                self._reader.close()
            self._close(out, reset=False)
        return out

    def _frame(self, flags: int, payload: bytes, out: list[Output]) -> None:
        try:
            layout = layout_of(flags)
        except FlagError:
            self._bad_flags(out)
            return
        if layout is None:
            self._json(payload, out)
        elif layout == "publish_batch":
            self._binary_publish(flags, payload, out)
        else:
            # A broker-to-client layout arriving at the broker (U7): refused
            # like an unknown flag - per frame, not fatal.
            self._bad_flags(out)

    def _bad_flags(self, out: list[Output]) -> None:
        if self.state is State.AWAIT_AUTH:
            self._refuse_unauthenticated(out)
            return
        # Per-frame error: the frame's bytes were consumed, reading goes on (F3).
        self._send(out, self.error(ErrorCode.INVALID_REQUEST, "unsupported frame flags"))

    def _json(self, payload: bytes, out: list[Output]) -> None:
        try:
            message = decode_message(payload)
        except (MalformedJsonError, MessageFieldError) as exc:
            # A known type that fails to decode is fatal for the stream (F4, N10).
            if self.state is State.AWAIT_AUTH:
                self._refuse_unauthenticated(out)
            else:
                self._send(out, self.error(ErrorCode.INVALID_REQUEST, f"malformed message: {exc}"))
                self._close(out, reset=False)
            return
        if isinstance(message, Unknown):
            kind = _Input.UNKNOWN_TYPE
        elif isinstance(message, Auth):
            kind = _Input.AUTH
        elif type(message).__struct_config__.tag in BROKER_TO_CLIENT:
            kind = _Input.ANSWER_TYPE
        else:
            kind = _Input.REQUEST
        self._step(kind, message, out)

    def _binary_publish(self, flags: int, payload: bytes, out: list[Output]) -> None:
        if self.state is State.AWAIT_AUTH:
            self._refuse_unauthenticated(out)
            return
        if flags & ~self.server_flags:
            # A layout the broker did not advertise (e.g. idempotent publishes).
            self._send(out, self.error(ErrorCode.INVALID_REQUEST, "unsupported frame flags"))
            return
        try:
            batch = decode_publish_batch(flags, payload)
        except PayloadDecodeError as exc:
            # request_id sits at payload offset 0 of every acked frame, so a malformed
            # acked body is still answered, correlated (A8).
            if flags & Flag.BINARY_PUBLISH_ACKED and len(payload) >= _U64.size:
                (request_id,) = _U64.unpack_from(payload, 0)
                self._send(
                    out,
                    self.publish_answer(
                        request_id,
                        # Idempotent frames are always answered in JSON (A4).
                        binary=not flags & Flag.BINARY_PUBLISH_IDEMPOTENT,
                        error=(ErrorCode.INVALID_REQUEST, f"malformed publish: {exc}"),
                    ),
                )
            else:
                self._send(out, self.error(ErrorCode.INVALID_REQUEST, f"malformed publish: {exc}"))
            return
        self._step(_Input.PUBLISH_FRAME, batch, out)

    def _step(
        self, kind: _Input, item: Message | PublishBatchFrame | Unknown, out: list[Output]
    ) -> None:
        action = _TRANSITIONS[(self.state, kind)]
        if action is _Action.AUTHENTICATE:
            assert isinstance(item, Auth)
            self._auth(item, out)
        elif action is _Action.REFUSE_UNAUTHENTICATED:
            self._refuse_unauthenticated(out)
        elif action is _Action.SECOND_AUTH:
            self._send(
                out, self.error(ErrorCode.INVALID_REQUEST, "this stream is already authenticated")
            )
        elif action is _Action.DISPATCH:
            assert not isinstance(item, Unknown)
            if self.publish_only and not isinstance(
                item, PublishBatchFrame | Publish | PublishBatch
            ):
                # A publish-only stream carries nothing else; anything else closes it (T7).
                self._close(out, reset=True)
                return
            out.append(Dispatch(item))
        elif action is _Action.UNEXPECTED_TYPE:
            self._send(out, self.error(ErrorCode.INVALID_REQUEST, "unexpected message type"))
            self._close(out, reset=False)
        else:
            assert isinstance(item, Unknown)
            out.extend(self.unknown_request(item))

    def unknown_request(self, request: Unknown) -> list[Output]:
        """Answer `unsupported` when both sides negotiated it; otherwise close (N8)."""
        out: list[Output] = []
        if self.negotiated(Feature.FEATURE_UNSUPPORTED):
            answer = Unsupported(request_type=request.type, request_id=request.request_id)
            if request.type == "extension":
                name = request.raw.get("name")
                answer.extension = name if isinstance(name, str) else None
            self._send(out, self.message(answer))
        else:
            self._close(out, reset=False)
        return out

    def negotiated(self, feature: int) -> bool:
        """Both sides announced `feature`."""
        return bool(self.server_features & feature) and self.client.has_feature(feature)

    # -- auth --------------------------------------------------------------------

    def _auth(self, auth: Auth, out: list[Output]) -> None:
        # The client's offer is read first, so even a refusal is shaped to it (§8).
        self.client = client_capabilities(auth)
        try:
            principal = self._authenticate(auth)
        except AuthRefusedError as exc:
            self._send(out, self.error(exc.code, exc.message))
            self._close(out, reset=False)
            return
        self.principal = principal
        self.token = auth.token
        self.state = State.OPEN
        self._reader.max_payload = self._max_frame_bytes
        out.append(Authenticated(principal))
        answer = auth_answer(
            auth,
            server_flags=self.server_flags,
            server_features=self.server_features,
            publish_window=self.publish_window,
        )
        self._send(out, encode_frame(answer))

    def _refuse_unauthenticated(self, out: list[Output]) -> None:
        self._send(out, self.error(ErrorCode.UNAUTHENTICATED, "authenticate first: send auth"))
        self._close(out, reset=False)

    # -- answers -----------------------------------------------------------------

    def message(self, message: Message) -> bytes:
        """A message shaped to what the client announced, as frame bytes.

        Raises NotNegotiatedError for a message the client cannot be sent.
        """
        return encode_frame(shape_for_peer(message, self.client))

    def may_send(self, message: Message) -> bool:
        try:
            shape_for_peer(message, self.client)
        except NotNegotiatedError:
            return False
        return True

    def error(
        self,
        code: ErrorCode,
        message: str,
        *,
        retry: RetryClass | None = None,
        detail: ErrorDetail | None = None,
    ) -> bytes:
        """An `error` frame; code, retry and detail reach only FEATURE_ERROR_CODES offerers."""
        retry = retry or code.default_retry
        return self.message(Error(message=message, code=code.wire, retry=retry.wire, detail=detail))

    def publish_answer(
        self,
        request_id: int,
        *,
        binary: bool,
        offset: int | None = None,
        error: tuple[ErrorCode, str] | None = None,
        retry: RetryClass | None = None,
        detail: ErrorDetail | None = None,
        owner: tuple[str, str, int] | None = None,
    ) -> bytes:
        """The answer to one acked publish.

        `owner` (node id, client address or "", generation) names the shard owner
        of a forwarded batch: appended to a binary ack for a client that offered
        BINARY_PUBLISH_ACK_OWNER, never to JSON.

        A binary publisher that offered BINARY_PUBLISH_ACK gets a binary ack with
        exactly the modifiers it offered; everyone else gets publish_ok /
        publish_error. The offset is sent only to a client that offered
        BINARY_PUBLISH_ACK_OFFSET (shaping drops it from publish_ok otherwise).
        """
        code, text = error if error is not None else (None, "")
        if code is not None:
            retry = retry or code.default_retry
        if binary and self.client.has(Flag.BINARY_PUBLISH_ACK):
            ack = self._binary_ack(request_id, offset, code, text, retry, detail)
            if owner is not None and self.client.has(Flag.BINARY_PUBLISH_ACK_OWNER):
                ack.node_id, ack.addr, ack.generation = owner
            return encode_frame(ack)
        if code is None:
            return self.message(PublishOk(request_id=request_id, offset=offset))
        assert retry is not None
        return self.message(
            PublishError(
                request_id=request_id, message=text, code=code.wire, retry=retry.wire, detail=detail
            )
        )

    def _binary_ack(
        self,
        request_id: int,
        offset: int | None,
        code: ErrorCode | None,
        text: str,
        retry: RetryClass | None,
        detail: ErrorDetail | None,
    ) -> PublishAckFrame:
        client = self.client
        if code is None:
            with_offset = offset is not None and client.has(Flag.BINARY_PUBLISH_ACK_OFFSET)
            return PublishAckFrame(
                status=AckStatus.OK,
                request_id=request_id,
                message="",
                offset=offset if with_offset else None,
            )
        ack: dict[str, Any] = {"status": AckStatus.ERROR, "request_id": request_id, "message": text}
        if client.has(Flag.BINARY_PUBLISH_ACK_CODE):
            ack["code"] = int(code)
            ack["retry"] = retry
            if detail is not None and client.has(Flag.BINARY_PUBLISH_ACK_DETAIL):
                ack["reason"] = detail.reason
                ack["retry_after_ms"] = detail.retry_after_ms
        return PublishAckFrame(**ack)

    # -- helpers -----------------------------------------------------------------

    def _send(self, out: list[Output], data: bytes) -> None:
        # Nothing is ever answered on a publish-only unidirectional stream (T7).
        if not self.publish_only:
            out.append(Send(data))

    def _close(self, out: list[Output], *, reset: bool) -> None:
        self.state = State.CLOSED
        out.append(End(reset=reset))
