"""QUIC + TLS 1.3 transport for Felix over qh3 (default) or aioquic.

Layout:

- :mod:`.certs` - a development CA and CA=False leaves both stacks and the
  official client accept.
- :mod:`.config` - :class:`TransportConfig` (stack-neutral) and the builder of
  each stack's ``QuicConfiguration``; ``impl`` or ``FELIX_QUIC_IMPL`` picks the
  stack.
- :mod:`.events` - our event types and the one :class:`StreamClosedError`.
- :mod:`.backends` - sans-IO adapters, one per stack, behind one interface,
  with :class:`~.backends.Capabilities` for what a stack cannot do; per-
  connection ALPN is a hook on the TLS server-hello handling.
- :mod:`.connection` - async :class:`Connection` / :class:`Stream` with
  send watermarks and bounded receive buffering.
- :mod:`.endpoint` - our own batched asyncio datagram loop: :func:`serve`,
  :func:`connect`, :class:`Server`.

This is the only package of the project that imports qh3 or aioquic.

``__version__`` is the suite's one version (the installed distribution's, from
pyproject.toml): every console script reports it, and this package is the one
all of them stand on.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("felix-suite")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

from .backends import Capabilities, ConnectionAdapter
from .certs import CertKeyPair, generate_ca, generate_leaf
from .config import FELIX_ALPN, Impl, TransportConfig, build_quic_configuration, default_impl
from .connection import Connection, Stream
from .endpoint import Server, connect, serve
from .events import (
    CONNECTION_REFUSED,
    INTERNAL_ERROR,
    NO_ERROR,
    ConnectionClosedError,
    ConnectionTerminated,
    HandshakeCompleted,
    StopSendingReceived,
    StreamClosedError,
    StreamDataReceived,
    StreamReset,
    TransportEvent,
)

__all__ = [
    "CONNECTION_REFUSED",
    "FELIX_ALPN",
    "INTERNAL_ERROR",
    "NO_ERROR",
    "Capabilities",
    "CertKeyPair",
    "Connection",
    "ConnectionAdapter",
    "ConnectionClosedError",
    "ConnectionTerminated",
    "HandshakeCompleted",
    "Impl",
    "Server",
    "StopSendingReceived",
    "Stream",
    "StreamClosedError",
    "StreamDataReceived",
    "StreamReset",
    "TransportConfig",
    "TransportEvent",
    "__version__",
    "build_quic_configuration",
    "connect",
    "default_impl",
    "generate_ca",
    "generate_leaf",
    "serve",
]
