"""A deliberately small HTTP/1.1 server on asyncio streams (one request per connection).

Bounded request head and body and a read timeout, so an unauthenticated peer
cannot hold memory or a connection for long. Handlers get a :class:`Request`
and return a :class:`Response`; JSON in and out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["HttpServer", "Request", "Response"]

_log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
READ_TIMEOUT = 10.0

_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(slots=True)
class Request:
    method: str
    path: str  # percent-decoded
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return _BadJson


class _BadJsonType:
    pass


_BadJson = _BadJsonType()


@dataclass(slots=True)
class Response:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        payload = b"" if self.body is None else json.dumps(self.body).encode()
        lines = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}"]
        headers = {
            "Content-Length": str(len(payload)),
            "Connection": "close",
            "Cache-Control": "no-store",
        }
        if payload:
            headers["Content-Type"] = "application/json"
        headers.update(self.headers)
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


Handler = Callable[[Request], Awaitable[Response]]


def error(status: int, code: str, message: str) -> Response:
    return Response(status, {"error": code, "message": message})


class HttpServer:
    def __init__(self, handler: Handler, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._handler = handler
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._serve, host, port, ssl=self._ssl, limit=MAX_HEAD_BYTES
        )

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _read(self, reader: asyncio.StreamReader, peer: str) -> Request | Response:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        except asyncio.LimitOverrunError:
            return error(431, "bad_request", "request head too large")
        except (asyncio.IncompleteReadError, TimeoutError):
            return error(400, "bad_request", "incomplete request")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return error(400, "bad_request", "malformed request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                return error(400, "bad_request", "malformed header")
            headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            return error(400, "bad_request", "chunked bodies are not accepted")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return error(400, "bad_request", "bad Content-Length")
        if length < 0 or length > MAX_BODY_BYTES:
            return error(413, "bad_request", "request body too large")
        try:
            body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT)
        except (asyncio.IncompleteReadError, TimeoutError):
            return error(400, "bad_request", "incomplete body")
        target = urlsplit(parts[1])
        query = {k: v[-1] for k, v in parse_qs(target.query).items()}
        return Request(parts[0], unquote(target.path), query, headers, body, peer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else ""
        try:
            request = await self._read(reader, peer)
            if isinstance(request, Response):
                response = request
            else:
                try:
                    response = await self._handler(request)
                except Exception:
                    _log.exception("handler failed for %s %s", request.method, request.path)
                    response = error(500, "internal", "internal error")
            writer.write(response.encode())
            await writer.drain()
        except (ConnectionError, ssl.SSLError) as exc:
            _log.debug("client %s went away: %s", peer, exc)
        except asyncio.CancelledError:
            # Shutdown cancels a waiting long poll: the connection simply ends. This
            # task is the connection's own (not awaited by anyone), so nothing is lost
            # by ending it here instead of asyncio logging the cancellation as an error.
            _log.debug("request from %s cancelled at shutdown", peer)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
