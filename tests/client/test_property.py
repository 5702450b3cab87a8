"""Property: publishes from several tasks, interleaved at random, reach every
subscriber exactly once, in the shard's one order, each task's in its own order.
Run on the durable stream, where offsets also let us check order and gaps."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import connect_client

# One publish: how many records, whether acked, and how often to yield before it.
operation = st.tuples(
    st.integers(min_value=1, max_value=4),
    st.sampled_from(["per_message", "none"]),
    st.integers(min_value=0, max_value=2),
)
plans = st.lists(st.lists(operation, min_size=1, max_size=6), min_size=2, max_size=4)


@pytest.mark.timeout(180)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=plans)
def test_interleaved_publishes_arrive_once_in_shard_order(
    felix_fixture: dict[str, Any], plan: list[list[tuple[int, str, int]]]
) -> None:
    asyncio.run(_bounded(_run(felix_fixture, plan), 60))


async def _run(doc: dict[str, Any], plan: list[list[tuple[int, str, int]]]) -> None:
    stream = doc["durable_stream"]
    async with await connect_client(doc) as publisher, await connect_client(doc) as reader:
        subs = [await reader.subscribe(stream), await reader.subscribe(stream)]
        try:

            async def run_task(task: int, ops: list[tuple[int, str, int]]) -> list[bytes]:
                sent: list[bytes] = []
                for n, (count, ack, yields) in enumerate(ops):
                    for _ in range(yields):
                        await asyncio.sleep(0)
                    records = [b"t%d-%d-%d" % (task, n, i) for i in range(count)]
                    if count == 1:
                        await publisher.publish(stream, records[0], ack=ack)
                    else:
                        await publisher.publish_batch(
                            stream, records, ack="per_batch" if ack != "none" else "none"
                        )
                    sent += records
                return sent

            sent = await asyncio.gather(*(run_task(t, ops) for t, ops in enumerate(plan)))
            total = sum(len(s) for s in sent)
            events = [[await sub.next(timeout=10) for _ in range(total)] for sub in subs]
            received = [[e.payload for e in got] for got in events]
            for got in events:
                offsets = [e.offset for e in got]
                assert offsets == list(range(offsets[0], offsets[0] + total))  # no gap
            for sub in subs:
                with pytest.raises(TimeoutError):
                    await sub.next(timeout=0.05)  # nothing more than was sent
        finally:
            for sub in subs:
                await sub.aclose()
    # The shard has one order, and every subscriber sees it.
    assert received[0] == received[1]
    # Exactly once.
    assert sorted(received[0]) == sorted(r for s in sent for r in s)
    # Each task's records keep the order the task published them in.
    for task, records in enumerate(sent):
        mine = [r for r in received[0] if r.startswith(b"t%d-" % task)]
        assert mine == records


async def _bounded(run: Coroutine[Any, Any, None], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        await run
