"""What a stranger sends the control plane: credentials are checked before a body is
parsed, bodies are bounded in size and nesting depth, and no answer is a traceback
(issue 20, finding 7)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from felix_controlplane.http import MAX_BODY_BYTES, HttpServer, Request, Response

from .support import call, control_plane, fake_idp, setup_tenant

pytestmark = pytest.mark.timeout(60)

DEEP = "[" * 100_000 + "]" * 100_000


async def _raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request over a plain socket (no client library second-guessing it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(10):
            data = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.partition(b"\r\n\r\n")[2]


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_exchange_with_garbage_bearer_and_deep_body_is_401(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        await setup_tenant(plane, idp, "acme")
        status, _ = await call(
            "POST",
            plane.t("acme", "/token/exchange"),
            token="garbage",
            body=None,
            headers={"Content-Type": "application/json"},
        )
        assert status == 401
        # The finding as reported: a 100k-deep body with a garbage bearer.
        port = int(plane.url.rsplit(":", 1)[1])
        head = (
            f"POST /v1/tenants/acme/token/exchange HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer garbage\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(DEEP)}\r\n\r\n"
        ).encode()
        status, raw = await _raw(port, head, DEEP.encode())
        assert status == 401, raw
        assert json.loads(raw)["error"] == "unauthenticated"
        assert b"Traceback" not in raw
    _no_traceback(caplog)


async def test_a_deep_body_from_an_authenticated_caller_is_a_typed_400(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        port = int(plane.url.rsplit(":", 1)[1])
        for path, token in (
            ("/v1/tenants/acme/token/exchange", idp.token("alice")),
            ("/v1/tenants/acme/namespaces/ns/streams", admin),
        ):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Length: {len(DEEP)}\r\n\r\n"
            ).encode()
            status, raw = await _raw(port, head, DEEP.encode())
            answer = json.loads(raw)
            assert (status, answer["error"]) == (400, "bad_request"), raw
            assert "deeper than" in answer["message"]
        # Shallow nesting passes the bound: the definition itself is then judged.
        status, answer = await call(
            "POST",
            plane.t("acme", "/namespaces/ns/streams"),
            token=admin,
            body={"name": "s", "retention": {"max_age_ms": [[[1]]]}},
        )
        assert (status, answer["error"]) == (400, "invalid_definition")
    _no_traceback(caplog)


async def test_a_stranger_s_deep_body_to_an_admin_path_is_401(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        await plane.bootstrap("acme")
        port = int(plane.url.rsplit(":", 1)[1])
        head = (
            f"POST /v1/tenants/acme/namespaces HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer x.y.z\r\nContent-Length: {len(DEEP)}\r\n\r\n"
        ).encode()
        status, raw = await _raw(port, head, DEEP.encode())
        assert status == 401 and json.loads(raw)["error"] == "unauthenticated"


async def test_an_oversized_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        port = int(plane.url.rsplit(":", 1)[1])
        # The length alone decides: nothing of the body is sent, the answer comes anyway.
        head = (
            f"POST /v1/tenants/acme/namespaces HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
        ).encode()
        status, raw = await _raw(port, head)
        assert status == 413 and json.loads(raw)["error"] == "bad_request"
        chunked = (
            b"POST /v1/tenants/acme/namespaces HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        assert (await _raw(port, chunked))[0] == 400


async def test_a_failing_handler_answers_a_typed_500_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug with a secret in its message")

    server = HttpServer(broken)
    await server.start("127.0.0.1", 0)
    try:
        status, raw = await _raw(server.port, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await server.close()
    assert status == 500
    assert json.loads(raw) == {"error": "internal", "message": "internal error"}
    # Logged once for the operator, with the request it failed on.
    failures = [r for r in caplog.records if r.exc_info]
    assert len(failures) == 1 and "GET /x" in failures[0].getMessage()


async def test_a_slow_request_head_is_answered_408(tmp_path: Path) -> None:
    server = HttpServer(lambda request: asyncio.sleep(0, Response(200)), read_timeout=0.3)
    await server.start("127.0.0.1", 0)
    try:
        status, raw = await _raw(server.port, b"POST /x HTTP/1.1\r\nHost: x\r\n")
    finally:
        await server.close()
    assert status == 408 and json.loads(raw)["error"] == "bad_request"


async def test_garbage_on_the_socket_never_stops_the_listener(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    async with control_plane(tmp_path) as plane:
        port = int(plane.url.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()

        async def send(raw: bytes) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(raw)
                writer.write_eof()
                async with asyncio.timeout(10):
                    data = await reader.read()
            finally:
                writer.close()
            # An answer (400, 404, 413, 431, ...) or a closed connection; never a 5xx.
            assert not data.startswith(b"HTTP/1.1 5"), data[:200]

        heads = st.one_of(
            st.binary(max_size=300),
            st.builds(
                lambda m, p, h: f"{m} {p} HTTP/1.1\r\nHost: x\r\n{h}\r\n".encode(errors="replace"),
                st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "X"]),
                st.sampled_from(["/", "/v1/tenants/acme", "/v1/catalog/changes?since=x", "//"]),
                st.text(max_size=80),
            ),
        )

        @settings(
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(raw=heads)
        def one(raw: bytes) -> None:
            asyncio.run_coroutine_threadsafe(send(raw), loop).result(timeout=30)

        await asyncio.to_thread(one)
        status, body = await call("GET", f"{plane.url}/v1/tenants/acme/.well-known/jwks.json")
        assert status == 404 and body["error"] == "not_found"  # still serving
    _no_traceback(caplog)
