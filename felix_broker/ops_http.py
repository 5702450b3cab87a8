"""The broker's plain-HTTP listener: health, metrics and backup offsets (§11).

On the shared aiohttp server of :mod:`felix_common.http`: one request per
connection (``Connection: close``), no request bodies, a bounded request head,
a deadline for sending it (408) and a bounded number of connections (503
``busy``), because the listener has no authentication and must not become a way
to hold broker memory. Everything on it is read-only: GET (and HEAD, which HTTP
requires wherever GET is served) are answered, anything else is 405.

=========================  ===================================================
``/live``                  200 ``ok`` while the process runs
``/ready``                 200 ``ok``; 503 ``not ready`` before the broker is
                           ready; 503 ``draining`` once shutdown started
``/metrics``               Prometheus text from the broker's own registry
``/backup/offsets``        JSON from a provider: the broker's committed log
                           offsets (felix_broker/app.py); a fleet member's
                           lists only what it leads, with generations and
                           ``skipped`` reasons (felix_broker/fleet/backup.py);
                           with no provider ``{"node_id": "", "shards": [],
                           "skipped": []}``
``/replication/halted``    JSON list of this broker's halted replicas, each a
                           ``ReplicationHalt`` (spec/fleet.yaml: shard, node,
                           generation, progress, reason, suggested_action;
                           felix_broker/replication/inspect.py); ``[]`` when
                           none halted, and always for a standalone broker
=========================  ===================================================
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from felix_broker.metrics import CONTENT_TYPE, BrokerMetrics
from felix_common.http import HttpServer

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


def _answer(
    status: int, content_type: str, body: bytes, extra: Mapping[str, str] | None = None
) -> web.Response:
    headers = {"Content-Type": content_type, "Cache-Control": "no-store", **(extra or {})}
    return web.Response(status=status, body=body, headers=headers)


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
        self._server = HttpServer(
            self._handle,
            max_connections=max_connections,
            max_head_bytes=max_request_bytes,
            head_timeout=read_timeout,
            shutdown_grace=0.0,  # every answer is immediate; nothing worth waiting for
            on_busy=lambda: _answer(503, _TEXT, b"busy"),
            on_head_too_large=lambda: _answer(431, _TEXT, b"request too large"),
        )
        self._started = False

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0 picks a free one; see :attr:`port`)."""
        if self._started:
            raise RuntimeError("the HTTP listener is already started")
        await self._server.start(host, port)
        self._started = True
        _log.info("HTTP listener on %s:%d", host, self.port)

    @property
    def port(self) -> int:
        """The TCP port actually bound."""
        if not self._started:
            raise RuntimeError("the HTTP listener is not started")
        return self._server.port

    async def close(self) -> None:
        """Stop listening and end the connections still open."""
        if self._started:
            self._started = False
            await self._server.close()

    async def __aenter__(self) -> HttpListener:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _answer(
                405,
                _TEXT,
                b"method not allowed; this listener is read-only",
                {"Allow": "GET, HEAD"},
            )
        try:
            status, content_type, body = await self._route(request.path)
        except _HttpError as exc:
            status, content_type, body = exc.status, _TEXT, str(exc).encode()
        return _answer(status, content_type, body)

    async def _route(self, path: str) -> tuple[int, str, bytes]:
        if path == "/live":
            return 200, _TEXT, b"ok"
        if path == "/ready":
            state = self._health.state
            if state is HealthState.READY:
                if self._health.failed_logs():
                    return 503, _TEXT, b"log failed"
                return 200, _TEXT, b"ok"
            text = b"draining" if state is HealthState.DRAINING else b"not ready"
            return 503, _TEXT, text
        if path == "/metrics":
            return 200, CONTENT_TYPE, self._metrics.exposition()
        if path == "/backup/offsets":
            return 200, _JSON, await self._json_from(self._backup_offsets)
        if path == "/replication/halted":
            return 200, _JSON, await self._json_from(self._replication_halted)
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
