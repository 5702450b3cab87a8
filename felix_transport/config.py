"""Transport configuration shared by both QUIC backends.

:class:`TransportConfig` is stack-neutral; :func:`build_quic_configuration`
turns it into the selected stack's ``QuicConfiguration`` (the stacks are
imported lazily so that using one never imports the other).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "DEFAULT_SIGNATURE_ALGORITHMS",
    "FELIX_ALPN",
    "Impl",
    "TransportConfig",
    "build_quic_configuration",
    "default_impl",
]

Impl = Literal["qh3", "aioquic"]

FELIX_ALPN = "felix/1"

# ECDSA first (what certs.py issues by default), Ed25519 next: qh3 only offers
# Ed25519 when the list names it, and the official client's leaves may use it.
DEFAULT_SIGNATURE_ALGORITHMS: tuple[str, ...] = (
    "ECDSA_SECP256R1_SHA256",
    "ED25519",
    "ECDSA_SECP384R1_SHA384",
    "RSA_PSS_RSAE_SHA256",
    "RSA_PKCS1_SHA256",
)

# aioquic encodes frame lengths in two bytes in places; above this it fails.
_AIOQUIC_MAX_DATAGRAM = 16 * 1024
_QH3_MAX_DATAGRAM = 65_000
_MIN_DATAGRAM = 1200  # RFC 9000 section 14: every QUIC path must carry 1200 bytes.


def default_impl() -> Impl:
    """The backend named by ``FELIX_QUIC_IMPL`` (``qh3`` when unset)."""
    value = os.environ.get("FELIX_QUIC_IMPL", "qh3").strip().lower() or "qh3"
    if value not in ("qh3", "aioquic"):
        raise ValueError(f"FELIX_QUIC_IMPL must be 'qh3' or 'aioquic', not {value!r}")
    return "qh3" if value == "qh3" else "aioquic"


@dataclass(frozen=True)
class TransportConfig:
    """Everything the transport needs for one endpoint (server or client).

    Server side: ``certificate_chain_pem`` (leaf first, then the CA) and
    ``private_key_pem``. Client side: ``ca_pem``; peer verification is always
    on and cannot be switched off.

    Mutual TLS: a server with ``client_ca_pem`` requests a client certificate
    and completes the handshake only for a client that presents one signed by
    that CA (aioquic only: qh3 2.1's server cannot request client certificates,
    so a qh3 server configuration with ``client_ca_pem`` is refused). A client
    with ``certificate_chain_pem`` / ``private_key_pem`` presents them when the
    server asks (both stacks). ``Connection.peer_certificate`` then names the
    other side's verified leaf, both ways.

    ALPN: a server selects ``felix/1`` (any of ``alpn_protocols``) when the
    client offers it and negotiates nothing when the client offers nothing,
    decided per connection; ``require_alpn`` refuses clients offering none. A
    client offers ``alpn_protocols`` only when ``offer_alpn`` is set, and then
    aborts if the server selects none.

    Flow control: ``stream_receive_window`` is both the per-stream QUIC credit
    and the most the transport buffers for a reader that does not read (see
    ``felix_transport.connection``). ``send_high_watermark`` /
    ``send_low_watermark`` bound each stream's send backlog: ``Stream.write``
    waits above the high mark until the backlog falls below the low mark.

    Before authentication (server side, when ``preauth_stream_window`` is set):
    a new connection is *untrusted* until the application calls
    ``Connection.trust()`` (the broker does when the connection's first stream
    authenticates). Until then each stream buffers at most
    ``preauth_stream_window`` bytes, the connection's streams together at most
    ``preauth_connection_budget``, and all untrusted connections of the server
    together at most ``preauth_global_budget``; at a bound the connection's
    input pauses (see ``felix_transport.connection``). None (the default)
    trusts every connection from the start. Clients always trust their server.
    """

    impl: Impl = field(default_factory=default_impl)
    certificate_chain_pem: bytes | None = None
    private_key_pem: bytes | None = None
    ca_pem: bytes | None = None
    client_ca_pem: bytes | None = None
    server_name: str = "localhost"
    alpn_protocols: tuple[str, ...] = (FELIX_ALPN,)
    offer_alpn: bool = False
    require_alpn: bool = False
    # 1350 fits common tunnels and IPv6 paths; raise it on loopback only.
    max_datagram_size: int = 1350
    # The official client idles out after 6 s and PINGs every 2 s.
    idle_timeout: float = 6.0
    keepalive_interval: float | None = None
    connection_receive_window: int = 16 * 1024 * 1024
    stream_receive_window: int = 1024 * 1024
    max_streams_bidi: int = 1024
    max_streams_uni: int = 1024
    send_high_watermark: int = 1024 * 1024
    send_low_watermark: int = 256 * 1024
    cipher_suites: tuple[str, ...] | None = None
    signature_algorithms: tuple[str, ...] = DEFAULT_SIGNATURE_ALGORITHMS
    socket_buffer_size: int = 4 * 1024 * 1024
    max_datagrams_per_wakeup: int = 64
    # Linux UDP segmentation offload on send and receive (felix_transport.udp):
    # off, or refused by the kernel, means one system call per datagram.
    udp_gso: bool = True
    udp_gro: bool = True
    preauth_stream_window: int | None = None
    preauth_connection_budget: int = 256 * 1024
    preauth_global_budget: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.impl not in ("qh3", "aioquic"):
            raise ValueError(f"impl must be 'qh3' or 'aioquic', not {self.impl!r}")
        limit = _AIOQUIC_MAX_DATAGRAM if self.impl == "aioquic" else _QH3_MAX_DATAGRAM
        if not _MIN_DATAGRAM <= self.max_datagram_size <= limit:
            raise ValueError(
                f"max_datagram_size must be within {_MIN_DATAGRAM}..{limit} for {self.impl}"
            )
        if self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        if self.keepalive_interval is not None and self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be positive")
        if self.stream_receive_window < 4096:
            raise ValueError("stream_receive_window must be at least 4096 bytes")
        if self.connection_receive_window < self.stream_receive_window:
            raise ValueError("connection_receive_window must be >= stream_receive_window")
        if not 0 < self.send_low_watermark <= self.send_high_watermark:
            raise ValueError("need 0 < send_low_watermark <= send_high_watermark")
        if self.preauth_stream_window is not None:
            if not 4096 <= self.preauth_stream_window <= self.stream_receive_window:
                raise ValueError("preauth_stream_window must be within 4096..stream_receive_window")
            if self.preauth_connection_budget < self.preauth_stream_window:
                raise ValueError("preauth_connection_budget must be >= preauth_stream_window")
            if self.preauth_global_budget < self.preauth_connection_budget:
                raise ValueError("preauth_global_budget must be >= preauth_connection_budget")
        if self.max_streams_bidi < 1 or self.max_streams_uni < 1:
            raise ValueError("max_streams_bidi and max_streams_uni must be >= 1")
        if (self.offer_alpn or self.require_alpn) and not self.alpn_protocols:
            raise ValueError("offer_alpn/require_alpn need at least one ALPN protocol")
        if (self.certificate_chain_pem is None) != (self.private_key_pem is None):
            raise ValueError("certificate_chain_pem and private_key_pem go together")
        if self.client_ca_pem is not None and self.impl == "qh3":
            raise ValueError(
                "client_ca_pem (mutual TLS) needs impl='aioquic' on the server side: "
                "qh3 2.1 cannot request client certificates"
            )

    @classmethod
    def server(
        cls,
        certificate_chain_pem: bytes,
        private_key_pem: bytes,
        **options: Any,
    ) -> TransportConfig:
        """A server configuration; ``certificate_chain_pem`` is leaf PEM + CA PEM."""
        return cls(
            certificate_chain_pem=certificate_chain_pem,
            private_key_pem=private_key_pem,
            **options,
        )

    @classmethod
    def client(cls, ca_pem: bytes, **options: Any) -> TransportConfig:
        """A client configuration trusting the CA certificates in ``ca_pem`` (pass
        ``certificate_chain_pem`` and ``private_key_pem`` to present a certificate)."""
        return cls(ca_pem=ca_pem, **options)

    def with_impl(self, impl: Impl) -> TransportConfig:
        """The same settings on the other backend."""
        return replace(self, impl=impl)


def build_quic_configuration(config: TransportConfig, *, is_client: bool) -> Any:
    """The selected stack's ``QuicConfiguration`` for ``config``.

    Typed ``Any`` because the two stacks' classes are unrelated types; each
    backend module returns its own precise type.
    """
    if config.impl == "qh3":
        from .backends import _qh3

        return _qh3.build_configuration(config, is_client=is_client)
    from .backends import _aioquic

    return _aioquic.build_configuration(config, is_client=is_client)
