"""The one HTTP server stack of the broker and the control plane, on aiohttp.

:class:`HttpServer` is aiohttp's low-level server (one handler for every request:
both users have their own small route tables) with the bounds an unauthenticated
listener needs, stated here once:

* **connections**: at most ``max_connections`` open; a request on a connection
  beyond that is answered by ``on_busy`` (503) without running the handler;
* **request head**: at most ``max_head_bytes`` of request line and headers, else
  431 (a single line or field past aiohttp's own 64 KiB parser limit is 400);
* **time to send the head**: a connection that has not sent a whole request head
  within ``head_timeout`` seconds is answered 408 and closed (slow clients
  cannot hold a connection open);
* **one request per connection** (``Connection: close``), so the head deadline
  covers a connection's whole idle life;
* **unread bodies**: after answering a request whose body it did not read (a
  refusal), the server reads and discards what the client still sends for up to
  ``linger`` seconds, so the client sees the answer instead of a reset;
* **shutdown**: :meth:`HttpServer.close` stops listening, gives requests in
  progress ``shutdown_grace`` seconds, then cancels them (a long poll ends).

Bodies are the handler's business (it knows whether it wants one and how big).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

__all__ = ["BodyTooLarge", "Handler", "HttpServer", "read_bounded"]

_log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
"""Answers one request (never raises for a client's mistake)."""

_PARSER_LIMIT = 64 * 1024  # aiohttp's own per-line limit; max_head_bytes is checked below it
_REASONS = {408: "Request Timeout"}


class BodyTooLarge(ValueError):
    """An HTTP answer (or request) body over the reader's limit."""


async def read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes:
    """All of a body, refusing it with :class:`BodyTooLarge` past ``limit`` bytes
    (read in chunks, so at most ``limit`` plus one chunk is ever held)."""
    body = bytearray()
    async for chunk in content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"a body larger than {limit} bytes")
    return bytes(body)


class _Connection(RequestHandler):
    """aiohttp's connection protocol plus the deadline for the first request head."""

    def __init__(self, owner: HttpServer, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._owner = owner
        self._head_deadline: asyncio.TimerHandle | None = None
        self.request_started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_deadline = asyncio.get_running_loop().call_later(
            self._owner.head_timeout, self._head_too_slow, transport
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        self.cancel_head_deadline()
        super().connection_lost(exc)

    def cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        # A malformed request is the client's mistake, answered 400 by aiohttp: no
        # traceback in the server's log for it. Anything else is a bug of ours.
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            _log.debug("refused a malformed request: %s", exc)
        else:
            super().log_exception(*args, **kwargs)

    def _head_too_slow(self, transport: asyncio.BaseTransport) -> None:
        self._head_deadline = None
        if self.request_started or transport.is_closing():
            return
        content_type, body = self._owner.timeout_answer
        head = (
            f"HTTP/1.1 408 {_REASONS[408]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(head.encode("ascii") + body)
        transport.close()


class _Server(web.Server):
    def __init__(self, owner: HttpServer, handler: Handler, **kwargs: Any) -> None:
        super().__init__(handler, handler_cancellation=True, **kwargs)
        self._owner = owner

    def __call__(self) -> RequestHandler:
        return _Connection(self._owner, self, loop=self._loop, **self._kwargs)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, headers={"Cache-Control": "no-store"})


def _busy() -> web.StreamResponse:
    return _text(503, "busy")


def _head_too_large() -> web.StreamResponse:
    return _text(431, "request too large")


class HttpServer:
    """One listener: ``start(host, port)``, :attr:`port`, ``close()``."""

    def __init__(
        self,
        handler: Handler,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 256,
        max_head_bytes: int = 16 * 1024,
        head_timeout: float = 10.0,
        shutdown_grace: float = 1.0,
        linger: float = 2.0,
        on_busy: Callable[[], web.StreamResponse] = _busy,
        on_head_too_large: Callable[[], web.StreamResponse] = _head_too_large,
        timeout_answer: tuple[str, bytes] = ("text/plain; charset=utf-8", b"request timeout"),
    ) -> None:
        if max_connections < 1 or max_head_bytes < 64 or head_timeout <= 0:
            raise ValueError("max_connections >= 1, max_head_bytes >= 64, head_timeout > 0")
        self._handler = handler
        self._ssl = ssl_context
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self.head_timeout = head_timeout
        self._grace = shutdown_grace
        self._linger = linger
        self._on_busy = on_busy
        self._on_head_too_large = on_head_too_large
        self.timeout_answer = timeout_answer
        self._server: _Server | None = None
        self._runner: web.ServerRunner | None = None
        self._port: int | None = None

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""
        if self._runner is not None:
            raise RuntimeError("the HTTP listener is already started")
        self._server = _Server(
            self,
            self._serve,
            max_line_size=_PARSER_LIMIT,
            max_field_size=_PARSER_LIMIT,
            keepalive_timeout=2 * self.head_timeout,  # a backstop; the head deadline is first
            lingering_time=self._linger,
            access_log=None,
        )
        runner = web.ServerRunner(self._server, shutdown_timeout=self._grace)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=self._ssl, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses
        self._port = int(addresses[0][1])

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        if self._port is None:
            raise RuntimeError("the HTTP listener is not started")
        return self._port

    async def close(self) -> None:
        """Stop listening and end the connections still open (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, _Connection):
            connection.request_started = True
            connection.cancel_head_deadline()
        assert self._server is not None
        if len(self._server.connections) > self.max_connections:
            response = self._on_busy()
        elif _head_size(request) > self.max_head_bytes:
            response = self._on_head_too_large()
        else:
            response = await self._handler(request)
        response.force_close()
        return response


def _head_size(request: web.BaseRequest) -> int:
    line = len(request.method) + len(request.raw_path) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in request.raw_headers)
