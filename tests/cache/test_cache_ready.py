"""Cache puts answered from the stream's reader (the dispatcher's ready path) when
nothing has to be waited for, over real QUIC: no task per put, every put written
to the cache log before its answer; under on_commit each put still waits for its
fsync in a task of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.cache.shard import CacheShard
from felix_broker.session.context import ConnectionState
from felix_wire.codec import encode_frame
from felix_wire.messages import AuthOk, CacheGet, CacheOk, CachePut, CacheValue

from ..support.wire import NS, TENANT, WireClient
from .harness import CACHE, cache_broker

pytestmark = pytest.mark.timeout(60)


def _count_request_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []
    real = ConnectionState.spawn_request

    async def counting(self: ConnectionState, coro: Any, kind: str, io: Any) -> None:
        started.append(kind)
        await real(self, coro, kind, io)

    monkeypatch.setattr(ConnectionState, "spawn_request", counting)
    return started


def _shard(broker: Broker) -> CacheShard:
    assert broker.cache is not None
    spec = broker.config.catalog.cache(TENANT, NS, CACHE)
    assert spec is not None
    return broker.cache.shard(spec, 0)


def _put(key: str, value: bytes, rid: int) -> bytes:
    return encode_frame(
        CachePut(tenant_id=TENANT, namespace=NS, cache=CACHE, key=key, value=value, request_id=rid)
    )


@pytest.mark.parametrize("durable", [True, False], ids=["log-backed", "in-memory"])
async def test_puts_without_a_wait_take_no_task_and_are_written_before_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    async with cache_broker(tmp_path, durable=durable, durable_fsync_mode="periodic") as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        started = _count_request_tasks(monkeypatch)
        shard = _shard(broker)
        log = shard.log
        before = log.next_offset if log is not None else 0
        await stream.send(b"".join(_put(f"k{i}", b"v%d" % i, i + 1) for i in range(32)))
        answered = set()
        for _ in range(32):
            answer = await stream.recv()
            assert isinstance(answer, CacheOk), answer
            if log is not None:
                # Written to the cache log (the page cache, as periodic promises) first.
                assert log.next_offset - before >= answer.request_id
            answered.add(answer.request_id)
        assert answered == set(range(1, 33))
        assert started == [], started
        await stream.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache=CACHE, key="k31", request_id=99)
        )
        value = await stream.recv()
        assert isinstance(value, CacheValue) and value.value == b"v31", value


async def test_under_on_commit_a_put_waits_for_its_fsync_in_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cache_broker(tmp_path, durable_fsync_mode="on_commit") as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        started = _count_request_tasks(monkeypatch)
        log = _shard(broker).log
        assert log is not None
        for rid in range(1, 5):
            await stream.send(_put("k", b"v%d" % rid, rid))
            answer = await stream.recv()
            assert isinstance(answer, CacheOk), answer
            assert log.durable_offset == log.next_offset  # synced before the answer
        assert started == ["cache_put"] * 4
