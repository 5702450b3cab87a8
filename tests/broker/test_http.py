"""The metrics/health HTTP listener over a real socket on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from felix_broker.metrics import LATENCY_BUCKETS, BrokerMetrics, build_version
from felix_broker.ops_http import Health, HttpListener

pytestmark = pytest.mark.timeout(20)


async def _request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(5):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    return status, headers, body


async def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return await _request(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


@pytest.fixture
async def health() -> Health:
    return Health()


@pytest.fixture
async def metrics() -> BrokerMetrics:
    return BrokerMetrics()


@pytest.fixture
async def listener(health: Health, metrics: BrokerMetrics) -> AsyncIterator[HttpListener]:
    server = HttpListener(metrics=metrics, health=health, read_timeout=0.5)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


async def test_live(listener: HttpListener) -> None:
    status, headers, body = await _get(listener.port, "/live")
    assert (status, body) == (200, b"ok")
    assert headers["content-length"] == "2"
    assert headers["connection"] == "close"


async def test_ready_lifecycle(listener: HttpListener, health: Health) -> None:
    assert (await _get(listener.port, "/ready"))[::2] == (503, b"not ready")
    health.mark_ready()
    assert (await _get(listener.port, "/ready"))[::2] == (200, b"ok")
    health.mark_draining()
    assert (await _get(listener.port, "/ready"))[::2] == (503, b"draining")
    health.mark_ready()  # draining is final
    assert (await _get(listener.port, "/ready"))[::2] == (503, b"draining")
    assert (await _get(listener.port, "/live"))[::2] == (200, b"ok")


async def test_metrics(listener: HttpListener, metrics: BrokerMetrics) -> None:
    metrics.json_publishes.labels(frame="publish_batch").inc()
    metrics.tenant_publish_queue_full.labels(tenant="t1").inc(2)
    metrics.publishes.inc(5)
    metrics.auth_failures.labels(reason="exp").inc()
    status, headers, body = await _get(listener.port, "/metrics?x=1")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    text = body.decode()
    assert 'felix_stream_json_publishes_total{frame="publish_batch"} 1.0' in text
    assert 'felix_tenant_publish_queue_full_total{tenant="t1"} 2.0' in text
    assert "felix_stream_published_records_total 5.0" in text
    assert 'felix_auth_failures_total{reason="exp"} 1.0' in text
    assert "felix_stream_subscriber_queue_batches 0.0" in text
    assert "python_gc" not in text  # a dedicated registry, not the global one


def _series(text: str) -> list[str]:
    return [line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"]


async def test_metric_names_follow_one_scheme(metrics: BrokerMetrics) -> None:
    metrics.request_timer("cache_get").observe(0.0001)
    metrics.tenant_publish_queue_full.labels(tenant="t1").inc()
    metrics.json_publishes.labels(frame="publish").inc()
    metrics.auth_failures.labels(reason="exp").inc()
    metrics.group_requests.labels(type="group_ack", outcome="ok").inc()
    names = set(_series(metrics.exposition().decode()))
    assert names, "the registry exports series"
    areas = [
        "connections",
        "auth",
        "task",
        "request",
        "stream",
        "storage",
        "group",
        "cache",
        "tenant",
        "build",
    ]
    for name in names:
        assert name.startswith(tuple(f"felix_{area}_" for area in areas)), name
    assert "felix_tenant_publish_queue_full_total" in names  # the name the protocol documents


async def test_build_info(metrics: BrokerMetrics) -> None:
    text = metrics.exposition().decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("felix_build_info{")]
    assert line.endswith(" 1.0")
    assert f'version="{build_version()}"' in line
    assert 'python="' in line


async def test_latency_histograms_are_in_seconds(metrics: BrokerMetrics) -> None:
    metrics.request_timer("cache_get").observe(40e-6)
    metrics.request_timer("cache_get").observe(3.0)
    metrics.publish_ack_seconds.observe(0.002)
    metrics.fsync_seconds.observe(0.01)
    metrics.group_poll_ack_seconds.observe(0.5)
    text = metrics.exposition().decode()
    assert 'felix_request_seconds_bucket{le="2.5e-05",type="cache_get"} 0.0' in text
    assert 'felix_request_seconds_bucket{le="5e-05",type="cache_get"} 1.0' in text
    assert 'felix_request_seconds_bucket{le="5.0",type="cache_get"} 2.0' in text
    assert 'felix_request_seconds_count{type="cache_get"} 2.0' in text
    for name in (
        "felix_stream_publish_ack_seconds",
        "felix_storage_fsync_seconds",
        "felix_group_poll_ack_seconds",
    ):
        assert f"{name}_count 1.0" in text
        assert f'{name}_bucket{{le="10.0"}} 1.0' in text
    assert LATENCY_BUCKETS[0] < 100e-6 and LATENCY_BUCKETS[-1] >= 1.0
    assert metrics.request_timer("cache_get") is metrics.request_timer("cache_get")


async def test_two_brokers_have_separate_metrics() -> None:
    first, second = BrokerMetrics(), BrokerMetrics()
    first.publishes.inc()
    assert b"felix_stream_published_records_total 1.0" in first.exposition()
    assert b"felix_stream_published_records_total 0.0" in second.exposition()


async def test_backup_offsets_standalone(listener: HttpListener) -> None:
    status, headers, body = await _get(listener.port, "/backup/offsets")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"node_id": "", "shards": [], "skipped": []}
    status, _, body = await _get(listener.port, "/replication/halted")
    assert (status, json.loads(body)) == (200, [])


async def test_backup_offsets_from_provider(health: Health, metrics: BrokerMetrics) -> None:
    answer: dict[str, Any] = {
        "node_id": "broker-1",
        "shards": [{"tenant_id": "t1", "namespace": "ns", "name": "orders", "shard": 0,
                    "kind": "stream", "generation": 7, "logs": {"records": 12}}],
        "skipped": [],
    }  # fmt: skip

    async def provider() -> dict[str, Any]:
        return answer

    async with HttpListener(metrics=metrics, health=health, backup_offsets=provider) as server:
        await server.start("127.0.0.1", 0)
        status, _, body = await _get(server.port, "/backup/offsets")
        assert (status, json.loads(body)) == (200, answer)


async def test_failing_provider_answers_500(health: Health, metrics: BrokerMetrics) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("storage offline")

    async with HttpListener(metrics=metrics, health=health, backup_offsets=broken) as server:
        await server.start("127.0.0.1", 0)
        assert (await _get(server.port, "/backup/offsets"))[0] == 500
        assert (await _get(server.port, "/live"))[0] == 200  # still serving


async def test_not_found(listener: HttpListener) -> None:
    status, _, _ = await _get(listener.port, "/admin")
    assert status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_read_only(listener: HttpListener, method: str) -> None:
    status, headers, _ = await _get(listener.port, "/live", method)
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


async def test_head_has_no_body(listener: HttpListener) -> None:
    status, headers, body = await _get(listener.port, "/live", "HEAD")
    assert (status, body) == (200, b"")
    assert headers["content-length"] == "2"


async def test_bad_request_line(listener: HttpListener) -> None:
    assert (await _request(listener.port, b"GARBAGE\r\n\r\n"))[0] == 400


async def test_request_too_large(listener: HttpListener) -> None:
    raw = b"GET /live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert (await _request(listener.port, raw))[0] == 431


async def test_read_timeout(listener: HttpListener) -> None:
    # An incomplete head: the listener gives up after its read timeout.
    status, _, _ = await _request(listener.port, b"GET /live HTTP/1.1\r\n")
    assert status == 408


async def test_close_ends_idle_connections(health: Health, metrics: BrokerMetrics) -> None:
    server = HttpListener(metrics=metrics, health=health, read_timeout=30)
    await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        await server.close()
        assert await reader.read() == b""
    writer.close()


async def test_port_before_start_is_an_error(health: Health, metrics: BrokerMetrics) -> None:
    with pytest.raises(RuntimeError):
        _ = HttpListener(metrics=metrics, health=health).port


async def test_connections_past_the_bound_are_answered_busy(
    health: Health, metrics: BrokerMetrics
) -> None:
    async with HttpListener(metrics=metrics, health=health, max_connections=2) as server:
        await server.start("127.0.0.1", 0)
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        try:
            status, _, body = await _get(server.port, "/live")
            assert (status, body) == (503, b"busy")
        finally:
            for _, writer in idle:
                writer.close()
        async with asyncio.timeout(5):
            while (await _get(server.port, "/live"))[0] != 200:
                await asyncio.sleep(0.02)  # the idle connections' ends reach the server


async def test_malformed_requests_leave_no_traceback_in_the_log(
    listener: HttpListener, caplog: pytest.LogCaptureFixture
) -> None:
    for raw in (b"GARBAGE\r\n\r\n", b"GET /live HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00\xa5\r\n\r\n"):
        assert (await _request(listener.port, raw))[0] == 400
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
