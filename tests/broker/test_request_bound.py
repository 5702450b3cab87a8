"""Requests that run as their own tasks are bounded per connection
(max_inflight_requests_per_conn): at the bound the stream carrying the next one is
not read until one finishes, so the client is held back by flow control."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_wire.messages import AuthOk, CacheGet, CacheValue, GroupPoll, GroupRecords

from ..fleet.harness import THROUGH_LEADER
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

POLL = {"tenant_id": TENANT, "namespace": NS, "stream": "log", "shard": 0, "group": "g"}


async def _answers(tmp: Path, bound: int, polls: int = 3, topology: str = "one") -> list[str]:
    """`polls` long polls on an empty shard, then a cache get, all on one stream:
    the order their answers arrive in."""
    async with running_broker(
        tmp, topology=topology, max_inflight_requests_per_conn=bound
    ) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        for rid in range(1, polls + 1):
            await stream.send(GroupPoll(**POLL, max_records=1, wait_ms=400, request_id=rid))
        await stream.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=9)
        )
        order: list[str] = []
        for _ in range(polls + 1):
            answer = await stream.recv(timeout=5)
            assert isinstance(answer, GroupRecords | CacheValue), answer
            order.append("get" if isinstance(answer, CacheValue) else f"poll{answer.request_id}")
        client.close()
        return order


# Group polls are answered not_leader at a non-owner (tests/fleet/test_cluster.py), so
# the bound is shown where they are served: one broker and a fleet's owner.
@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_at_the_bound_the_next_request_waits_for_a_slot(
    tmp_path: Path, topology: str
) -> None:
    order = await _answers(tmp_path, bound=2, topology=topology)
    # Two polls hold both slots: the third poll, and the get behind it on the same
    # stream, are read only once one of them is answered.
    assert order.index("get") >= 2, order


# Standalone: the same per-connection bound as the test above, which runs in a fleet.
async def test_under_the_bound_a_fast_request_passes_slow_ones(tmp_path: Path) -> None:
    order = await _answers(tmp_path, bound=16)
    assert order[0] == "get", order


# Standalone: the same per-connection bound as the first test, which runs in a fleet.
async def test_a_get_answered_without_a_task_still_waits_at_the_bound(tmp_path: Path) -> None:
    # Two polls hold both slots; the get behind them is read, but even though its
    # answer is ready at once (the no-task path) it waits for a slot like any
    # other request instead of slipping past the bound.
    order = await _answers(tmp_path, bound=2, polls=2)
    assert order.index("get") >= 1, order
