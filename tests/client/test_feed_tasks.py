"""A subscription hands out the events a read brought without a task per event:
the sharded feed makes a task (and a wait) per read of a shard, not per item."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import felix_client

pytestmark = pytest.mark.timeout(60)


async def test_events_of_one_read_need_no_task_each(
    client: felix_client.Client, felix_fixture: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = felix_fixture["memory_stream"]
    loop = asyncio.get_running_loop()
    reads: list[str] = []
    real = loop.create_task

    def counting(coro: Any, **kw: Any) -> Any:
        name = kw.get("name") or ""
        if name.startswith("felix-subscription"):
            reads.append(name)
        return real(coro, **kw)

    async with client.subscribe(stream) as sub:
        monkeypatch.setattr(loop, "create_task", counting)
        payloads = [b"e%d" % i for i in range(64)]
        await client.publish_batch(stream, payloads)  # one frame of 64 events
        got = [await sub.next(timeout=5) for _ in range(64)]
    assert [e.payload for e in got] == payloads  # in order, none lost or repeated
    # One task per read of the stream (a frame may arrive over a few reads), not 64.
    assert 1 <= len(reads) <= 8, len(reads)
