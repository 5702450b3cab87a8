"""aioquic 1.7 backend.

aioquic grows a stream's receive window from what has *arrived*
(``receiver.highest_offset``), not from what the application has read, so a
peer can fill memory behind a slow reader. :class:`_CreditedConnection`
replaces the private ``_write_stream_limits`` so that MAX_STREAM_DATA only
advances to ``bytes read by the application + stream_receive_window``.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

from aioquic import tls
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import MAX_STREAM_DATA_FRAME_CAPACITY, QuicConnection
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ..config import TransportConfig
from ..events import (
    HandshakeCompleted,
    StreamClosedError,
    TransportEvent,
)
from . import Address, Capabilities, ConnectionAdapter, ServerFactory, translate_event
from ._alpn import AlpnSelection, install_server_hello_hook

__all__ = ["AioquicAdapter", "AioquicServerFactory", "build_configuration"]

CAPABILITIES = Capabilities(
    per_stream_receive_credit=True,
    batch_receive=False,
    visible_pings=True,
    congestion_control_switch=True,
    configurable_stream_limits=True,
    configurable_signature_algorithms=False,
    backlog_includes_unacked=True,
)


def build_configuration(config: TransportConfig, *, is_client: bool) -> QuicConfiguration:
    """aioquic's QuicConfiguration for ``config`` (certificate objects are accepted)."""
    qc = QuicConfiguration(
        is_client=is_client,
        max_datagram_size=config.max_datagram_size,
        idle_timeout=config.idle_timeout,
        max_data=config.connection_receive_window,
        max_stream_data=config.stream_receive_window,
    )
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
            _load_chain(qc, config.certificate_chain_pem, config.private_key_pem)
    else:
        if config.certificate_chain_pem is None or config.private_key_pem is None:
            raise ValueError("a server needs certificate_chain_pem and private_key_pem")
        _load_chain(qc, config.certificate_chain_pem, config.private_key_pem)
        install_server_hello_hook(
            tls.Context, tls.pull_client_hello, tls.AlertNoApplicationProtocol
        )
        qc.alpn_protocols = AlpnSelection(config.alpn_protocols, required=config.require_alpn)
    return qc


def _load_chain(qc: QuicConfiguration, chain_pem: bytes, key_pem: bytes) -> None:
    chain = x509.load_pem_x509_certificates(chain_pem)
    qc.certificate = chain[0]
    qc.certificate_chain = chain[1:]
    qc.private_key = serialization.load_pem_private_key(key_pem, None)


def _require_client_certificate(context: tls.Context, client_ca_pem: bytes) -> None:
    """Make one server handshake request a client certificate and verify it.

    aioquic 1.7 sends a CertificateRequest only under the private
    ``_request_client_certificate`` flag, accepts an empty Certificate (no client
    authentication) and checks only the CertificateVerify signature. The two
    per-instance wrappers refuse an empty Certificate (certificate_required) and
    verify the chain against ``client_ca_pem`` after the signature check
    (bad_certificate), before the handshake can finish.
    """
    context._request_client_certificate = True
    handle_certificate = context._server_handle_certificate
    handle_verify = context._server_handle_certificate_verify

    def _server_handle_certificate(input_buf: Any) -> None:
        start = input_buf.tell()
        if not tls.pull_certificate(input_buf).certificates:
            raise _AlertCertificateRequired("a client certificate is required")
        input_buf.seek(start)
        handle_certificate(input_buf)

    def _server_handle_certificate_verify(input_buf: Any) -> None:
        handle_verify(input_buf)
        certificate = context._peer_certificate
        if certificate is None:  # _server_handle_certificate saw one; cannot happen
            raise _AlertCertificateRequired("no client certificate")
        tls.verify_certificate(
            certificate=certificate,
            chain=context._peer_certificate_chain,
            cadata=client_ca_pem,
        )

    # Instance attributes win over the class's methods (the state machine calls
    # them through self).
    context._server_handle_certificate = _server_handle_certificate  # type: ignore[method-assign]
    context._server_handle_certificate_verify = _server_handle_certificate_verify  # type: ignore[method-assign]


class _AlertCertificateRequired(tls.Alert):
    description = tls.AlertDescription.certificate_required


class _CreditedConnection(QuicConnection):
    """A QuicConnection whose MAX_STREAM_DATA (and, with a connection budget,
    MAX_DATA) follows application reads."""

    def __init__(
        self,
        *,
        window: int,
        connection_budget: int | None = None,
        client_ca_pem: bytes | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.felix_window = window
        self.felix_connection_budget = connection_budget
        self.felix_consumed: dict[int, int] = {}
        self.felix_consumed_total = 0
        self.felix_client_ca = client_ca_pem

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        # Private hook (aioquic 1.7). aioquic doubles MAX_DATA once half of it has
        # *arrived*; under a budget it instead follows reads, in half-budget steps.
        budget = self.felix_connection_budget
        if budget is None:
            super()._write_connection_limits(builder, space)
            return
        max_data = self._local_max_data
        target = self.felix_consumed_total + budget
        if target - max_data.value >= budget // 2:
            max_data.value = target
        used = max_data.used
        max_data.used = 0  # keeps the stock doubling from firing
        try:
            super()._write_connection_limits(builder, space)
        finally:
            max_data.used = used

    def _initialize(self, peer_cid: bytes) -> None:
        # Private hook (aioquic 1.7): the TLS context is created here.
        super()._initialize(peer_cid)
        if self.felix_client_ca is not None:
            _require_client_certificate(self.tls, self.felix_client_ca)

    def _write_stream_limits(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream
    ) -> None:
        # Private hook (aioquic 1.7): called for every stream while building each
        # 1-RTT packet. Zero means a locally opened uni stream, which never receives.
        stream_id = stream.stream_id
        if stream_id is None:  # only aioquic's placeholder streams lack an id
            return
        if stream.max_stream_data_local:
            target = self.felix_consumed.get(stream_id, 0) + self.felix_window
            # Update in half-window steps so reads do not cost a frame each.
            if target - stream.max_stream_data_local >= self.felix_window // 2:
                stream.max_stream_data_local = target
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local


class AioquicAdapter(ConnectionAdapter):
    """aioquic QuicConnection behind the common adapter interface."""

    impl = "aioquic"
    capabilities = CAPABILITIES

    def __init__(self, quic: _CreditedConnection, config: TransportConfig) -> None:
        self._quic = quic
        self._connection_window = config.connection_receive_window
        self._alpn: str | None = None
        # Stream-count limits are private Limit objects; set before any
        # transport parameters are serialised (at connect / first datagram).
        for limit, value in (
            (quic._local_max_streams_bidi, config.max_streams_bidi),
            (quic._local_max_streams_uni, config.max_streams_uni),
        ):
            limit.value = limit.sent = value

    @classmethod
    def client(cls, config: TransportConfig) -> AioquicAdapter:
        qc = build_configuration(config, is_client=True)
        quic = _CreditedConnection(window=config.stream_receive_window, configuration=qc)
        return cls(quic, config)

    def connect(self, addr: Address, now: float) -> None:
        self._quic.connect(addr, now=now)

    def receive_datagrams(self, datagrams: Sequence[bytes], addr: Address, now: float) -> None:
        receive = self._quic.receive_datagram
        for data in datagrams:
            receive(data, addr, now=now)

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
        # get the same id. Creating the stream now advances the counter (aioquic 1.7,
        # pinned; the method is private).
        stream_id = self._quic.get_next_available_stream_id(is_unidirectional=unidirectional)
        self._quic._get_or_create_stream_for_send(stream_id)
        return stream_id

    def send(self, stream_id: int, data: bytes, *, end_stream: bool = False) -> None:
        try:
            self._quic.send_stream_data(stream_id, data, end_stream)
        except (RuntimeError, ValueError) as exc:
            # aioquic: RuntimeError after FIN/reset, ValueError once discarded.
            raise StreamClosedError(stream_id, str(exc)) from exc

    def reset(self, stream_id: int, error_code: int) -> None:
        self._quic.reset_stream(stream_id, error_code)

    def stop_sending(self, stream_id: int, error_code: int) -> None:
        self._quic.stop_stream(stream_id, error_code)

    def close(self, error_code: int, reason_phrase: str, *, transport: bool = False) -> None:
        # A frame type (PADDING, 0) marks the close as transport-level.
        self._quic.close(
            error_code=error_code,
            frame_type=0 if transport else None,
            reason_phrase=reason_phrase,
        )

    def ping(self) -> None:
        self._quic.send_ping(0)

    def peer_idle_timeout(self) -> float | None:
        # aioquic keeps the peer's value in seconds, privately.
        value = getattr(self._quic, "_remote_max_idle_timeout", None)
        return float(value) if value else None

    def send_backlog(self, stream_id: int) -> int:
        stream = self._quic._streams.get(stream_id)
        if stream is None:
            return 0
        # Private sender fields: the buffer spans the first unacked offset to
        # the last written one, i.e. unsent plus in-flight bytes.
        sender = stream.sender
        return sender._buffer_stop - sender._buffer_start

    def consumed(self, stream_id: int, total: int) -> bool:
        quic = self._quic
        quic.felix_consumed_total += total - quic.felix_consumed.get(stream_id, 0)
        quic.felix_consumed[stream_id] = total
        budget = quic.felix_connection_budget
        if budget is not None:
            sent_data: int = quic._local_max_data.sent
            if quic.felix_consumed_total + budget - sent_data >= budget // 2:
                return True
        stream = quic._streams.get(stream_id)
        if stream is None or not stream.max_stream_data_local:
            return False
        window = quic.felix_window
        sent: int = stream.max_stream_data_local_sent
        return total + window - sent >= window // 2

    def set_receive_limits(self, stream_window: int, connection_budget: int | None) -> None:
        quic = self._quic
        quic.felix_window = stream_window
        if connection_budget is None and quic.felix_connection_budget is not None:
            # Back to the stock window, at least the configured size beyond reads.
            max_data = quic._local_max_data
            max_data.value = max(
                max_data.value, quic.felix_consumed_total + self._connection_window
            )
        quic.felix_connection_budget = connection_budget

    def forget_stream(self, stream_id: int) -> None:
        # The stream's bytes stay counted in felix_consumed_total, which is what
        # MAX_DATA is measured against.
        self._quic.felix_consumed.pop(stream_id, None)

    @property
    def peer_address(self) -> Address | None:
        return self._quic.get_peer_address()

    @property
    def alpn_protocol(self) -> str | None:
        return self._alpn

    @property
    def peer_certificate_der(self) -> bytes | None:
        context = getattr(self._quic, "tls", None)
        cert = getattr(context, "_peer_certificate", None)
        return None if cert is None else cert.public_bytes(serialization.Encoding.DER)

    @property
    def initial_connection_ids(self) -> Sequence[bytes]:
        return [self._quic.host_cid]


class AioquicServerFactory(ServerFactory):
    """Server adapters sharing one aioquic configuration."""

    def __init__(self, config: TransportConfig) -> None:
        self._config = config
        self._qc = build_configuration(config, is_client=False)
        self._window = config.stream_receive_window
        self._budget: int | None = None
        if config.preauth_stream_window is not None:
            # Connections start untrusted: the transport parameters carry the
            # pre-authentication credit; Connection.trust() raises it.
            self._window = self._qc.max_stream_data = config.preauth_stream_window
            self._budget = self._qc.max_data = config.preauth_connection_budget

    def create(self, original_destination_cid: bytes) -> ConnectionAdapter:
        quic = _CreditedConnection(
            window=self._window,
            connection_budget=self._budget,
            client_ca_pem=self._config.client_ca_pem,
            configuration=self._qc,
            original_destination_connection_id=original_destination_cid,
        )
        return AioquicAdapter(quic, self._config)
