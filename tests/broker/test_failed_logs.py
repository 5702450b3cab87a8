"""A log in the failed state turns /ready to 503 and is counted in /metrics
(issue 20, finding 8), with a real broker, real files and a real failing fsync."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from felix_wire.messages import AckMode, Publish, PublishError, PublishOk

from ..storage.fakes import CountingFsync
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def failed_gauge(metrics: bytes) -> float:
    for line in metrics.decode().splitlines():
        if line.startswith("felix_storage_failed_logs "):
            return float(line.split()[1])
    raise AssertionError("felix_storage_failed_logs is not exported")


async def test_a_failed_log_makes_the_broker_unready(tmp_path: Path) -> None:
    async with running_broker(
        tmp_path, durable_fsync_mode="on_commit", ack_on_commit=True
    ) as broker:
        assert broker.store is not None
        port = broker.http_port
        status, _ = await asyncio.to_thread(get, port, "/ready")
        assert status == 200
        fsync = CountingFsync()
        broker.store._fsync = fsync  # logs opened from now on sync through it
        client = await WireClient.connect(broker)
        control, _ = await client.authed()
        publish = Publish(
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            payload=b"a",
            request_id=1,
            ack=AckMode.PER_MESSAGE,
        )
        await control.send(publish)
        assert isinstance(await control.recv(), PublishOk)
        fsync.fail = True  # the disk goes bad (EIO on fsync)
        await control.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="log",
                payload=b"b",
                request_id=2,
                ack=AckMode.PER_MESSAGE,
            )
        )
        assert isinstance(await control.recv(), PublishError)
        status, body = await asyncio.to_thread(get, port, "/ready")
        assert (status, body) == (503, b"log failed")
        status, metrics = await asyncio.to_thread(get, port, "/metrics")
        assert status == 200 and failed_gauge(metrics) == 1.0
        # In-memory streams are still served while the orchestrator drains us.
        await control.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="orders",
                payload=b"c",
                request_id=3,
                ack=AckMode.PER_MESSAGE,
            )
        )
        assert await control.recv() == PublishOk(request_id=3)
        client.close()
