"""qh3 2.1 backend (the default).

qh3 keeps aioquic's Python API but runs packets, recovery and streams in a
native core. Differences handled here: certificates must be loaded from PEM
via ``load_cert_chain`` (certificate objects are refused), Ed25519 is only
offered when ``signature_algorithms`` names it, a batch of datagrams goes in
through ``receive_many_datagrams``, the send backlog is public
(``get_send_buffer_size``, unsent bytes), the peer address is private
(``_remote_addr``), and writes to a closed stream raise ``ValueError``.

The native core extends stream receive windows by itself as it hands data to
Python and has no hook to hold them back, so
``Capabilities.per_stream_receive_credit`` is False: the connection layer
bounds a slow reader by pausing the connection's input instead.

Interop note (qh3 2.1.0 server, aioquic 1.7 client): the server fails to
build its Handshake flight after the first Initial ("packet builder capacity
exhausted" from ``datagrams_to_send``); the handshake completes after loss
recovery, about 1.3 s later. qh3 and the official client are not affected.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Sequence

from qh3 import tls
from qh3.quic import events as qe
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError

from ..config import TransportConfig
from ..events import (
    HandshakeCompleted,
    StreamClosedError,
    TransportEvent,
)
from . import Address, Capabilities, ConnectionAdapter, ServerFactory, translate_event
from ._alpn import AlpnSelection, install_server_hello_hook

__all__ = ["Qh3Adapter", "Qh3ServerFactory", "build_configuration"]

CAPABILITIES = Capabilities(
    per_stream_receive_credit=False,
    batch_receive=True,
    visible_pings=False,
    congestion_control_switch=False,
    configurable_stream_limits=False,
    configurable_signature_algorithms=True,
    backlog_includes_unacked=False,
)


class _AlertNoApplicationProtocol(tls.Alert):
    # qh3 has no class for TLS alert 120; the official client expects this code.
    description = tls.AlertDescription.no_application_protocol


def build_configuration(config: TransportConfig, *, is_client: bool) -> QuicConfiguration:
    """qh3's QuicConfiguration for ``config`` (PEM bytes through load_cert_chain)."""
    qc = QuicConfiguration(
        is_client=is_client,
        max_datagram_size=config.max_datagram_size,
        idle_timeout=config.idle_timeout,
        max_data=config.connection_receive_window,
        max_stream_data=config.stream_receive_window,
    )
    # qh3's client path-MTU probes go past max_datagram_size (1452/1472 B on
    # loopback); off, the configured size is a hard ceiling for both stacks.
    qc.probe_datagram_size = False
    qc.signature_algorithms = [
        int(tls.SignatureAlgorithm[name]) for name in config.signature_algorithms
    ]
    if config.cipher_suites is not None:
        qc.cipher_suites = [tls.CipherSuite[name] for name in config.cipher_suites]
    if is_client:
        if config.ca_pem is None:
            raise ValueError("a client needs ca_pem: peer verification is always on")
        qc.server_name = config.server_name
        qc.verify_mode = ssl.CERT_REQUIRED
        qc.load_verify_locations(cadata=config.ca_pem)
        qc.alpn_protocols = list(config.alpn_protocols) if config.offer_alpn else None
        if config.certificate_chain_pem is not None and config.private_key_pem is not None:
            # Presented when the server sends a CertificateRequest (mutual TLS).
            qc.load_cert_chain(config.certificate_chain_pem, config.private_key_pem)
    else:
        if config.certificate_chain_pem is None or config.private_key_pem is None:
            raise ValueError("a server needs certificate_chain_pem and private_key_pem")
        qc.load_cert_chain(config.certificate_chain_pem, config.private_key_pem)
        install_server_hello_hook(tls.Context, tls.pull_client_hello, _AlertNoApplicationProtocol)
        qc.alpn_protocols = AlpnSelection(config.alpn_protocols, required=config.require_alpn)
    return qc


class Qh3Adapter(ConnectionAdapter):
    """qh3 QuicConnection behind the common adapter interface."""

    impl = "qh3"
    capabilities = CAPABILITIES

    def __init__(self, quic: QuicConnection) -> None:
        self._quic = quic
        self._alpn: str | None = None

    @classmethod
    def client(cls, config: TransportConfig) -> Qh3Adapter:
        return cls(QuicConnection(configuration=build_configuration(config, is_client=True)))

    def connect(self, addr: Address, now: float) -> None:
        self._quic.connect(addr, now=now)

    def receive_datagrams(self, datagrams: Sequence[bytes], addr: Address, now: float) -> None:
        if len(datagrams) == 1:
            self._quic.receive_datagram(datagrams[0], addr, now=now)
        else:
            self._quic.receive_many_datagrams(list(datagrams), addr, now=now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]:
        return self._quic.datagrams_to_send(now=now)

    def get_timer(self) -> float | None:
        return self._quic.get_timer()

    def handle_timer(self, now: float) -> None:
        self._quic.handle_timer(now=now)

    def next_event(self) -> TransportEvent | None:
        while (event := self._quic.next_event()) is not None:
            ours = translate_event(event, qe)
            if ours is not None:
                if isinstance(ours, HandshakeCompleted):
                    self._alpn = ours.alpn_protocol
                return ours
        return None

    def open_stream(self, *, unidirectional: bool) -> int:
        # get_next_available_stream_id only peeks: two opens before any write would
        # get the same id. qh3 2.1's _open_stream allocates (pinned version; private).
        stream_id: int = self._quic._open_stream(is_unidirectional=unidirectional)
        return stream_id

    def send(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        try:
            self._quic.send_stream_data(stream_id, data, end_stream)
        except ValueError as exc:
            # qh3 reports writes after FIN / RESET_STREAM / STOP_SENDING this way.
            raise StreamClosedError(stream_id, str(exc)) from exc
        except QuicConnectionError as exc:
            # ...and writes on a connection its native core already closed this way.
            raise StreamClosedError(stream_id, f"connection closed: {exc}") from exc

    # Once the native core is closing (the peer's CONNECTION_CLOSE arrived; our
    # ConnectionTerminated follows after draining) it refuses every frame with
    # QuicConnectionError. Nothing can reach the peer any more, so ending a stream
    # or pinging is then a no-op rather than an error.

    def reset(self, stream_id: int, error_code: int) -> None:
        with contextlib.suppress(QuicConnectionError):
            self._quic.reset_stream(stream_id, error_code)

    def stop_sending(self, stream_id: int, error_code: int) -> None:
        with contextlib.suppress(QuicConnectionError):
            self._quic.stop_stream(stream_id, error_code)

    def close(self, error_code: int, reason_phrase: str, *, transport: bool = False) -> None:
        # A frame type (PADDING, 0) marks the close as transport-level.
        self._quic.close(
            error_code=error_code,
            frame_type=0 if transport else None,
            reason_phrase=reason_phrase,
        )

    def ping(self) -> None:
        with contextlib.suppress(QuicConnectionError):
            self._quic.send_ping(0)

    def peer_idle_timeout(self) -> float | None:
        # qh3 keeps the peer's transport parameters (milliseconds), privately.
        parameters = getattr(self._quic, "_applied_transport_parameters", None)
        value = getattr(parameters, "max_idle_timeout", None)
        return value / 1000 if value else None

    def send_backlog(self, stream_id: int) -> int:
        return self._quic.get_send_buffer_size(stream_id)

    def consumed(self, stream_id: int, total: int) -> bool:
        return False

    def set_receive_limits(self, stream_window: int, connection_budget: int | None) -> None:
        # The native core grants credit on its own; see Capabilities.
        return None

    def forget_stream(self, stream_id: int) -> None:
        return None

    @property
    def peer_address(self) -> Address | None:
        # qh3 has no public accessor; _remote_addr is set on connect/first datagram.
        return self._quic._remote_addr

    @property
    def alpn_protocol(self) -> str | None:
        return self._alpn

    @property
    def peer_certificate_der(self) -> bytes | None:
        context = getattr(self._quic, "tls", None)
        cert = getattr(context, "_peer_certificate", None)
        return None if cert is None else bytes(cert.public_bytes())

    @property
    def initial_connection_ids(self) -> Sequence[bytes]:
        return [self._quic.host_cid]


class Qh3ServerFactory(ServerFactory):
    """Server adapters sharing one qh3 configuration."""

    def __init__(self, config: TransportConfig) -> None:
        self._qc = build_configuration(config, is_client=False)

    def create(self, original_destination_cid: bytes) -> ConnectionAdapter:
        return Qh3Adapter(
            QuicConnection(
                configuration=self._qc,
                original_destination_connection_id=original_destination_cid,
            )
        )
