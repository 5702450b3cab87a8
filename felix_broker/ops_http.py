"""The broker's plain-HTTP listener: health, metrics and backup offsets (facts §11).

A deliberately tiny HTTP/1.1 server on asyncio streams: one request per
connection (``Connection: close``), no request bodies, a bounded request head
and a read timeout, because the listener has no authentication and must not
become a way to hold broker memory. Everything on it is read-only: GET (and
HEAD, which HTTP requires wherever GET is served) are answered, anything else
is 405.

=========================  ===================================================
``/live``                  200 ``ok`` while the process runs
``/ready``                 200 ``ok``; 503 ``not ready`` before the broker is
                           ready; 503 ``draining`` once shutdown started
``/metrics``               Prometheus text from the broker's own registry
``/backup/offsets``        JSON from a provider; a standalone broker answers
                           ``{"node_id": "", "shards": [], "skipped": []}``
``/replication/halted``    JSON list; a standalone broker replicates nothing,
                           so ``[]`` (the shape is unspecified, facts §14)
=========================  ===================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from felix_broker.metrics import CONTENT_TYPE, BrokerMetrics

__all__ = [
    "BackupOffsetsProvider",
    "Health",
    "HealthState",
    "HttpListener",
    "ReplicationHaltedProvider",
    "standalone_backup_offsets",
    "standalone_replication_halted",
]

_log = logging.getLogger(__name__)

BackupOffsetsProvider = Callable[[], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
ReplicationHaltedProvider = Callable[[], Sequence[Any] | Awaitable[Sequence[Any]]]

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HealthState(enum.Enum):
    """Where the broker is in its life, as ``/ready`` reports it."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"


class Health:
    """Readiness the broker flips: starting -> ready -> draining (never back)."""

    def __init__(self) -> None:
        self.state = HealthState.STARTING
        # How many logs are in the failed state (set by the broker): while any is,
        # ``/ready`` answers 503 so an orchestrator stops sending traffic.
        self.failed_logs: Callable[[], int] = lambda: 0

    def mark_ready(self) -> None:
        """The broker serves clients; ``/ready`` answers ``ok``. Ignored once draining."""
        if self.state is HealthState.STARTING:
            self.state = HealthState.READY

    def mark_draining(self) -> None:
        """Shutdown started; ``/ready`` answers 503 ``draining`` from now on."""
        self.state = HealthState.DRAINING


def standalone_backup_offsets() -> dict[str, Any]:
    """The ``/backup/offsets`` answer of a broker that leads no cluster shards."""
    return {"node_id": "", "shards": [], "skipped": []}


def standalone_replication_halted() -> list[Any]:
    """The ``/replication/halted`` answer of a broker with no replicas."""
    return []


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpListener:
    """The metrics/health/backup HTTP listener of one broker."""

    def __init__(
        self,
        *,
        metrics: BrokerMetrics,
        health: Health,
        backup_offsets: BackupOffsetsProvider = standalone_backup_offsets,
        replication_halted: ReplicationHaltedProvider = standalone_replication_halted,
        max_request_bytes: int = 8192,
        read_timeout: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._backup_offsets = backup_offsets
        self._replication_halted = replication_halted
        self._max_request_bytes = max_request_bytes
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""
        if self._server is not None:
            raise RuntimeError("the HTTP listener is already started")
        self._server = await asyncio.start_server(
            self._on_connection, host, port, limit=self._max_request_bytes
        )
        _log.info("HTTP listener on %s:%d", host, self.port)

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP listener is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening and end the connections still open."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await server.wait_closed()

    async def __aenter__(self) -> HttpListener:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        busy = len(self._tasks) >= self._max_connections
        self._tasks.add(task)
        try:
            if busy:
                await self._send(writer, 503, _TEXT, b"busy", head_only=False)
            else:
                await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # The peer went away; nothing to answer.
        except asyncio.CancelledError:
            # close() ends idle connections by cancelling their handlers. Python
            # 3.11's StreamReaderProtocol then calls exception() on the cancelled
            # task and logs "Exception in callback" (fixed in 3.12): end normally.
            if task.cancelling() == 0:
                raise
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._read_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await self._send(writer, 408, _TEXT, b"request timeout", head_only=False)
            return
        except asyncio.LimitOverrunError:
            await self._send(writer, 431, _TEXT, b"request too large", head_only=False)
            return
        except asyncio.IncompleteReadError:
            return
        try:
            path = self._parse_request_line(head)
            status, content_type, body, extra = await self._route(path)
        except _HttpError as exc:
            status, content_type, body, extra = exc.status, _TEXT, str(exc).encode(), {}
            if status == 405:
                extra = {"Allow": "GET, HEAD"}
        await self._send(
            writer, status, content_type, body, head_only=head.startswith(b"HEAD "), extra=extra
        )

    @staticmethod
    def _parse_request_line(head: bytes) -> str:
        """The path of a GET or HEAD request line, without its query."""
        line = head.split(b"\r\n", 1)[0]
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise _HttpError(400, "bad request line")
        try:
            method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise _HttpError(400, "bad request line") from None
        if method not in ("GET", "HEAD"):
            raise _HttpError(405, "method not allowed; this listener is read-only")
        return target.split("?", 1)[0]

    async def _route(self, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        if path == "/live":
            return 200, _TEXT, b"ok", {}
        if path == "/ready":
            state = self._health.state
            if state is HealthState.READY:
                if self._health.failed_logs():
                    return 503, _TEXT, b"log failed", {}
                return 200, _TEXT, b"ok", {}
            text = b"draining" if state is HealthState.DRAINING else b"not ready"
            return 503, _TEXT, text, {}
        if path == "/metrics":
            return 200, CONTENT_TYPE, self._metrics.exposition(), {}
        if path == "/backup/offsets":
            return 200, _JSON, await self._json_from(self._backup_offsets), {}
        if path == "/replication/halted":
            return 200, _JSON, await self._json_from(self._replication_halted), {}
        raise _HttpError(404, "not found")

    @staticmethod
    async def _json_from(provider: Callable[[], Any]) -> bytes:
        try:
            result = provider()
            if inspect.isawaitable(result):
                result = await result
            return json.dumps(result, separators=(",", ":")).encode()
        except Exception:
            # The provider belongs to another part of the broker; its failure
            # is an answer here, never a crash of the listener.
            _log.exception("HTTP provider %r failed", provider)
            raise _HttpError(500, "internal error") from None

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        body: bytes,
        *,
        head_only: bool,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        headers = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
            "Connection: close",
            *(f"{name}: {value}" for name, value in (extra or {}).items()),
        ]
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("ascii"))
        if not head_only:
            writer.write(body)
        await writer.drain()
