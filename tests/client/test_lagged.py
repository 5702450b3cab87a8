"""A subscriber that falls behind on a durable stream is told where to resume
(subscription_lagged) and the client resumes there: no record is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ..conftest import start_fixture_broker, stop_fixture_broker
from .conftest import connect_client

pytestmark = pytest.mark.timeout(90)


async def test_lagged_subscription_resumes_without_loss(tmp_path: Path) -> None:
    # One queued batch per subscriber and one event per batch: a reader that does not
    # keep up overflows at once.
    process, doc = start_fixture_broker(
        tmp_path, ("FELIX_SUB_QUEUE_CAPACITY", "1"), ("FELIX_EVENT_BATCH_MAX_EVENTS", "1")
    )
    try:
        async with asyncio.timeout(60):
            await _run(doc)
    finally:
        stop_fixture_broker(process)


async def _run(doc: dict[str, Any]) -> None:
    stream = doc["durable_stream"]
    total = 400
    async with await connect_client(doc) as publisher, await connect_client(doc) as reader:
        sub = await reader.subscribe(stream, start="earliest", shard=0)
        payloads = [b"r%04d" % i + b"." * 2000 for i in range(total)]
        for i in range(0, total, 50):
            await publisher.publish_batch(stream, payloads[i : i + 50])
        got = []
        while len(got) < total:
            event = await sub.next(timeout=20)
            got.append((event.offset, event.payload))
            if len(got) % 50 == 0:
                await asyncio.sleep(0.05)  # fall behind on purpose
        await sub.aclose()
    assert [offset for offset, _ in got] == list(range(total))
    assert [payload for _, payload in got] == payloads
    assert sub.resumes >= 1, "the subscriber never lagged: the test did not test anything"
