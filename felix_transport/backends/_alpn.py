"""Per-connection ALPN selection for both stacks.

Neither stack can answer both kinds of Felix client from one static
``alpn_protocols`` list: ``None`` aborts a client that offers ``felix/1``, and
``["felix/1"]`` refuses the default client, which offers no ALPN at all. So the
server configuration carries an :class:`AlpnSelection` (a ``list`` subclass the
stacks pass through untouched to ``tls.Context._alpn_protocols``) and a wrapper
around ``tls.Context._server_handle_hello`` peeks at the ClientHello, then
narrows ``_alpn_protocols`` for this one handshake before the stack negotiates.

The wrapper is installed once per stack and is inert for any context whose
``_alpn_protocols`` is not an :class:`AlpnSelection`, so other users of the same
stack in this process are unaffected. ``_server_handle_hello`` is private: the
hook is pinned to aioquic 1.7 (three positional buffers) and qh3 2.1 (four);
``*buffers`` absorbs that difference.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["AlpnSelection", "install_server_hello_hook"]

_installed: set[int] = set()
_lock = threading.Lock()


class AlpnSelection(list[str]):
    """The protocols a server may select; ``required`` refuses clients offering none."""

    def __init__(self, protocols: Iterable[str], *, required: bool) -> None:
        super().__init__(protocols)
        self.required = required


def install_server_hello_hook(
    context_cls: type[Any],
    pull_client_hello: Callable[[Any], Any],
    no_alpn_alert: Callable[[str], Exception],
) -> None:
    """Wrap ``context_cls._server_handle_hello`` once (idempotent, thread-safe)."""
    with _lock:
        if id(context_cls) in _installed:
            return
        original = context_cls._server_handle_hello

        @functools.wraps(original)
        def _server_handle_hello(self: Any, input_buf: Any, *buffers: Any) -> None:
            selection = self._alpn_protocols
            if isinstance(selection, AlpnSelection):
                # Peek without consuming: the original parses the same bytes.
                start = input_buf.tell()
                offered = pull_client_hello(input_buf).alpn_protocols
                input_buf.seek(start)
                if offered:
                    # The stack negotiates and raises its own alert if nothing matches.
                    self._alpn_protocols = list(selection)
                elif selection.required:
                    raise no_alpn_alert("client offered no ALPN protocol")
                else:
                    self._alpn_protocols = None
            original(self, input_buf, *buffers)

        context_cls._server_handle_hello = _server_handle_hello
        _installed.add(id(context_cls))
