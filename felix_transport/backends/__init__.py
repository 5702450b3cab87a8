"""Sans-IO connection adapters: one interface over aioquic and qh3.

An adapter wraps one stack ``QuicConnection``: it is fed datagrams and timer
ticks, hands back datagrams to send, and yields :mod:`felix_transport.events`
instead of stack events. It never touches a socket or an event loop; the
asyncio layer in :mod:`felix_transport.connection` drives it.

What one stack cannot do is reported in :class:`Capabilities` rather than
emulated silently.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import Impl, TransportConfig
from ..events import (
    ConnectionIdIssued,
    ConnectionIdRetired,
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
    TransportEvent,
)

__all__ = [
    "Address",
    "Capabilities",
    "ConnectionAdapter",
    "ServerFactory",
    "create_client_adapter",
    "server_factory",
]

Address = tuple[Any, ...]


@dataclass(frozen=True)
class Capabilities:
    """What a backend really does, so callers need not guess.

    - ``per_stream_receive_credit``: MAX_STREAM_DATA follows application reads
      (aioquic, through a private hook). qh3's native core extends the window
      as soon as data is handed to Python; the connection layer then falls back
      to pausing the whole connection's input while a stream is over its bound.
    - ``batch_receive``: a whole batch of datagrams is fed in one call.
    - ``visible_pings``: PING acknowledgements surface as events.
    - ``congestion_control_switch``: the algorithm can be chosen.
    - ``configurable_stream_limits``: ``max_streams_bidi/uni`` are applied
      (qh3 advertises a fixed 100 bidi / 103 uni, raised as streams close).
    - ``configurable_signature_algorithms``: ``signature_algorithms`` applies
      (aioquic always offers its full list, Ed25519 included).
    - ``backlog_includes_unacked``: ``send_backlog`` counts sent-but-unacked
      bytes too (aioquic) rather than unsent bytes only (qh3).
    """

    per_stream_receive_credit: bool
    batch_receive: bool
    visible_pings: bool
    congestion_control_switch: bool
    configurable_stream_limits: bool
    configurable_signature_algorithms: bool
    backlog_includes_unacked: bool


class ConnectionAdapter(abc.ABC):
    """One QUIC connection of either stack, sans IO."""

    impl: Impl
    capabilities: Capabilities

    @abc.abstractmethod
    def connect(self, addr: Address, now: float) -> None:
        """Start the client handshake towards ``addr``."""

    @abc.abstractmethod
    def receive_datagrams(self, datagrams: Sequence[bytes], addr: Address, now: float) -> None:
        """Feed datagrams that arrived together from ``addr``."""

    @abc.abstractmethod
    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        """Datagrams ready for the wire now."""

    @abc.abstractmethod
    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must next run (loop clock), or None."""

    @abc.abstractmethod
    def handle_timer(self, now: float) -> None:
        """Run the stack's loss-detection / idle / ack timers."""

    @abc.abstractmethod
    def next_event(self) -> TransportEvent | None:
        """The next mapped event, or None when the queue is empty."""

    @abc.abstractmethod
    def open_stream(self, *, unidirectional: bool) -> int:
        """Allocate the next local stream id (no frame is sent until data is)."""

    @abc.abstractmethod
    def send(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        """Queue data (and FIN); raises StreamClosedError if the stream cannot send."""

    @abc.abstractmethod
    def reset(self, stream_id: int, error_code: int) -> None:
        """Send RESET_STREAM."""

    @abc.abstractmethod
    def stop_sending(self, stream_id: int, error_code: int) -> None:
        """Send STOP_SENDING."""

    @abc.abstractmethod
    def close(self, error_code: int, reason_phrase: str, *, transport: bool = False) -> None:
        """Send CONNECTION_CLOSE; ConnectionTerminated follows after draining.

        ``transport`` sends a transport-level close (frame 0x1c) so that a
        transport code such as CONNECTION_REFUSED survives in the Initial
        space, where an application close is rewritten to APPLICATION_ERROR
        (RFC 9000 section 10.2.3).
        """

    @abc.abstractmethod
    def ping(self) -> None:
        """Queue an ack-eliciting PING (keep-alive)."""

    @abc.abstractmethod
    def peer_idle_timeout(self) -> float | None:
        """The peer's max_idle_timeout transport parameter in seconds (None: it
        sent none, or the handshake has not brought it yet)."""

    @abc.abstractmethod
    def send_backlog(self, stream_id: int) -> int:
        """Bytes the stack still holds for ``stream_id`` (see Capabilities)."""

    @abc.abstractmethod
    def consumed(self, stream_id: int, total: int) -> bool:
        """The application has read ``total`` bytes of the stream in all.

        Returns True when this opens enough credit that a MAX_STREAM_DATA
        should go out now (the caller then transmits). Backends without
        per-stream credit return False.
        """

    @abc.abstractmethod
    def set_receive_limits(self, stream_window: int, connection_budget: int | None) -> None:
        """Credit the peer ``stream_window`` bytes per stream beyond what was read and,
        with ``connection_budget``, at most that many bytes beyond what was read on all
        streams together (None: the stack's own connection window). Backends without
        per-stream credit ignore this; the connection layer pauses input instead."""

    @abc.abstractmethod
    def forget_stream(self, stream_id: int) -> None:
        """Drop per-stream bookkeeping once the stream is finished both ways."""

    @property
    @abc.abstractmethod
    def peer_address(self) -> Address | None:
        """The peer's current address."""

    @property
    @abc.abstractmethod
    def alpn_protocol(self) -> str | None:
        """The negotiated ALPN protocol, None when none was."""

    @property
    @abc.abstractmethod
    def peer_certificate_der(self) -> bytes | None:
        """The peer's leaf certificate (DER) once the handshake has seen one: the
        server's on a client, a verified client certificate on a mutual-TLS server."""

    @property
    @abc.abstractmethod
    def initial_connection_ids(self) -> Sequence[bytes]:
        """Local connection ids to route to this connection from the start."""


class ServerFactory(abc.ABC):
    """Makes server-side adapters sharing one stack configuration."""

    @abc.abstractmethod
    def create(self, original_destination_cid: bytes) -> ConnectionAdapter:
        """A server adapter for a client Initial addressed to ``original_destination_cid``."""


def create_client_adapter(config: TransportConfig) -> ConnectionAdapter:
    """A client adapter for ``config.impl``."""
    if config.impl == "qh3":
        from . import _qh3

        return _qh3.Qh3Adapter.client(config)
    from . import _aioquic

    return _aioquic.AioquicAdapter.client(config)


def server_factory(config: TransportConfig) -> ServerFactory:
    """A server adapter factory for ``config.impl`` (validates the certificate now)."""
    if config.certificate_chain_pem is None or config.private_key_pem is None:
        raise ValueError("a server needs certificate_chain_pem and private_key_pem")
    if config.impl == "qh3":
        from . import _qh3

        return _qh3.Qh3ServerFactory(config)
    from . import _aioquic

    return _aioquic.AioquicServerFactory(config)


def translate_event(event: object, stack_events: Any) -> TransportEvent | None:
    """One stack event as ours, or None for events Felix does not use.

    Both stacks define the same event classes with the same fields (qh3 forked
    aioquic), so one translation serves both; `stack_events` is the stack's
    `quic.events` module. ProtocolNegotiated duplicates HandshakeCompleted, and
    PING acks and DATAGRAM frames are not used by Felix.
    """
    qe = stack_events
    if isinstance(event, qe.StreamDataReceived):
        return StreamDataReceived(event.stream_id, event.data, event.end_stream)
    if isinstance(event, qe.StreamReset):
        return StreamReset(event.stream_id, event.error_code)
    if isinstance(event, qe.StopSendingReceived):
        return StopSendingReceived(event.stream_id, event.error_code)
    if isinstance(event, qe.HandshakeCompleted):
        return HandshakeCompleted(event.alpn_protocol)
    if isinstance(event, qe.ConnectionTerminated):
        return ConnectionTerminated(event.error_code, event.reason_phrase)
    if isinstance(event, qe.ConnectionIdIssued):
        return ConnectionIdIssued(event.connection_id)
    if isinstance(event, qe.ConnectionIdRetired):
        return ConnectionIdRetired(event.connection_id)
    return None
