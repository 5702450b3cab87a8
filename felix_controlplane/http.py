"""The control plane's requests and answers, served by the shared aiohttp stack.

Handlers get a :class:`Request` and return a :class:`Response`; JSON in and out.
:class:`HttpServer` adapts them to :class:`felix_common.http.HttpServer` and adds
what a JSON API on a public port needs before any handler runs:

* a body is at most ``max_body_bytes`` (413 from the ``Content-Length``, before
  reading), never chunked (400), and read within ``read_timeout`` (408);
* the body is only read, not parsed: a handler checks the caller's credentials
  first and then asks :meth:`Request.json`, which bounds the nesting depth
  before decoding (400 ``bad_request``);
* a handler that fails unexpectedly is logged once, with its traceback, and
  answered 500 ``{"error": "internal", ...}``: never a traceback to the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from felix_common import http, safejson

__all__ = ["MAX_BODY_BYTES", "MAX_JSON_DEPTH", "HttpServer", "Request", "Response", "error"]

_log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
READ_TIMEOUT = 10.0


class BadJson(ValueError):
    """The body is not JSON, or nests deeper than :data:`MAX_JSON_DEPTH`."""


@dataclass(slots=True)
class Request:
    method: str
    path: str  # percent-decoded
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str

    def json(self) -> Any:
        """The body as JSON (None if empty); raise :class:`BadJson`. Call it only
        after the caller's credentials are checked."""
        if not self.body:
            return None
        try:
            return safejson.loads(self.body, max_depth=MAX_JSON_DEPTH)
        except safejson.JsonTooDeep as exc:
            raise BadJson(str(exc)) from None
        except ValueError:
            raise BadJson("the body is not valid JSON") from None


@dataclass(slots=True)
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def to_aiohttp(self) -> web.Response:
        headers = {"Cache-Control": "no-store", **self.headers}
        if self.body is None:
            return web.Response(status=self.status, headers=headers)
        payload = json.dumps(self.body).encode()
        headers.setdefault("Content-Type", "application/json")
        return web.Response(status=self.status, body=payload, headers=headers)


Handler = Callable[[Request], Awaitable[Response]]


def error(status: int, code: str, message: str) -> Response:
    return Response(status, {"error": code, "message": message})


class HttpServer:
    """One control-plane listener (public or admin): ``start``, :attr:`port`, ``close``."""

    def __init__(
        self,
        handler: Handler,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        read_timeout: float = READ_TIMEOUT,
        max_connections: int = 256,
    ) -> None:
        self._handler = handler
        self._max_body = max_body_bytes
        self._read_timeout = read_timeout
        self._server = http.HttpServer(
            self._serve,
            ssl_context=ssl_context,
            max_connections=max_connections,
            max_head_bytes=MAX_HEAD_BYTES,
            head_timeout=read_timeout,
            on_busy=lambda: error(503, "busy", "too many connections").to_aiohttp(),
            on_head_too_large=lambda: error(
                431, "bad_request", "request head too large"
            ).to_aiohttp(),
            timeout_answer=(
                "application/json",
                json.dumps({"error": "bad_request", "message": "incomplete request"}).encode(),
            ),
        )

    async def start(self, host: str, port: int) -> None:
        await self._server.start(host, port)

    @property
    def port(self) -> int:
        return self._server.port

    async def close(self) -> None:
        await self._server.close()

    async def _serve(self, raw: web.BaseRequest) -> web.StreamResponse:
        request = await self._read(raw)
        if isinstance(request, Response):
            return request.to_aiohttp()
        try:
            response = await self._handler(request)
        except BadJson as exc:
            response = error(400, "bad_request", str(exc))
        except Exception:
            _log.exception("handler failed for %s %s", request.method, request.path)
            response = error(500, "internal", "internal error")
        return response.to_aiohttp()

    async def _read(self, raw: web.BaseRequest) -> Request | Response:
        if "Transfer-Encoding" in raw.headers:
            return error(400, "bad_request", "chunked bodies are not accepted")
        length = raw.content_length or 0
        if length > self._max_body:
            return error(413, "bad_request", "request body too large")
        try:
            async with asyncio.timeout(self._read_timeout):
                body = await raw.content.readexactly(length) if length else b""
        except TimeoutError:
            return error(408, "bad_request", "incomplete body")
        except asyncio.IncompleteReadError:
            return error(400, "bad_request", "incomplete body")
        query = {key: raw.query.getall(key)[-1] for key in raw.query}
        headers = {name.lower(): value for name, value in raw.headers.items()}
        return Request(raw.method, raw.path, query, headers, body, raw.remote or "")
