"""Transport events and errors shared by both QUIC backends.

The adapters in :mod:`felix_transport.backends` translate each stack's own
event objects into these, so nothing above the transport ever sees an aioquic
or qh3 type.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONNECTION_REFUSED",
    "INTERNAL_ERROR",
    "NO_ERROR",
    "ConnectionClosedError",
    "ConnectionIdIssued",
    "ConnectionIdRetired",
    "ConnectionTerminated",
    "HandshakeCompleted",
    "StopSendingReceived",
    "StreamClosedError",
    "StreamDataReceived",
    "StreamReset",
    "TransportEvent",
]

# QUIC transport error codes (RFC 9000 section 20.1) this package itself uses.
NO_ERROR = 0x0
INTERNAL_ERROR = 0x1
CONNECTION_REFUSED = 0x2


@dataclass(frozen=True, slots=True)
class StreamDataReceived:
    """Contiguous bytes arrived on a stream; ``end_stream`` marks the peer's FIN."""

    stream_id: int
    data: bytes
    end_stream: bool


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The peer abandoned its sending side of a stream (RESET_STREAM)."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class StopSendingReceived:
    """The peer asked us to stop sending on a stream (STOP_SENDING)."""

    stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class HandshakeCompleted:
    """The TLS handshake finished; ``alpn_protocol`` is None when none was negotiated."""

    alpn_protocol: str | None


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """The connection is gone (peer close, local close, idle timeout or error)."""

    error_code: int
    reason_phrase: str


@dataclass(frozen=True, slots=True)
class ConnectionIdIssued:
    """The local endpoint issued a connection id: the server loop routes it to us."""

    connection_id: bytes


@dataclass(frozen=True, slots=True)
class ConnectionIdRetired:
    """A local connection id was retired: the server loop stops routing it."""

    connection_id: bytes


TransportEvent = (
    StreamDataReceived
    | StreamReset
    | StopSendingReceived
    | HandshakeCompleted
    | ConnectionTerminated
    | ConnectionIdIssued
    | ConnectionIdRetired
)


class StreamClosedError(Exception):
    """A stream can no longer be used in the requested direction.

    Raised for writes after FIN, after a local reset or after the peer's
    STOP_SENDING (aioquic reports these as ``RuntimeError``, qh3 as
    ``ValueError``), for reads after the peer's RESET_STREAM, and for any
    stream operation once the connection is terminated. ``error_code`` is the
    peer's code when the peer caused it, else None.
    """

    def __init__(self, stream_id: int, message: str, error_code: int | None = None) -> None:
        super().__init__(f"stream {stream_id}: {message}")
        self.stream_id = stream_id
        self.error_code = error_code


class ConnectionClosedError(ConnectionError):
    """A connection-level operation failed because the connection is (or got) closed.

    Raised by ``connect()`` when the handshake fails and by ``open_*_stream()`` /
    ``accept_stream()`` after termination. Carries the CONNECTION_CLOSE code and
    reason when known.
    """

    def __init__(self, error_code: int | None, reason_phrase: str) -> None:
        detail = reason_phrase or "connection closed"
        code = "" if error_code is None else f" (error {error_code:#x})"
        super().__init__(f"{detail}{code}")
        self.error_code = error_code
        self.reason_phrase = reason_phrase
