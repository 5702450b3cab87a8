"""A publish pass hands each durable shard's batches to the OS in one write, keeps
every batch as its own stored batch, and fails only what the write failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.metrics import BrokerMetrics
from felix_broker.storage import LogStore, StorageError
from felix_broker.storage import segment as segment_module
from felix_broker.streams.engine import Engine, PublishRequest

pytestmark = pytest.mark.timeout(60)

SPEC = StreamSpec("t1", "default", "log", durable=True)


async def _engine(root: Path) -> tuple[Engine, LogStore]:
    config = load_config(environ={}, overrides={"data_dir": str(root)})
    store = LogStore(root / "durable")
    await store.recover_all()
    return Engine(StaticCatalog([SPEC], []), config, BrokerMetrics(), store), store


async def test_a_pass_of_many_publishes_is_one_write_and_each_stays_its_own_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, store = await _engine(tmp_path)
    shard = engine.shard(SPEC, 0)
    await (await engine.publish(PublishRequest(shard, [b"first"], None), acked=True))
    writes: list[int] = []
    write = segment_module._write_pieces

    def counting(fd: int, pieces: list[bytes], position: int, size: int) -> None:
        writes.append(size)
        write(fd, pieces, position, size)

    monkeypatch.setattr(segment_module, "_write_pieces", counting)
    # Queued before the worker runs: one pass takes them all.
    futures = [
        await engine.publish(PublishRequest(shard, [b"p%d-a" % i, b"p%d-b" % i], None), acked=True)
        for i in range(32)
    ]
    bases = await asyncio.gather(*futures)
    assert bases == list(range(1, 65, 2))
    assert len(writes) <= 2, writes  # 32 before this change
    assert shard.log is not None and shard.log.next_offset == 65
    records = shard.log.read(1, max_records=64, max_bytes=1 << 20)
    assert [r.payload for r in records] == [
        b"p%d-%s" % (i, s) for i in range(32) for s in (b"a", b"b")
    ]
    assert [r.offset for r in records] == list(range(1, 65))
    engine.close()
    await store.aclose()
    # And after a restart the batches are there, in order.
    engine, store = await _engine(tmp_path)
    again = engine.shard(SPEC, 0)
    assert again.next_offset == 65
    assert again.log is not None
    assert [r.payload for r in again.log.read(0, max_records=3, max_bytes=1 << 20)] == [
        b"first",
        b"p0-a",
        b"p0-b",
    ]
    engine.close()
    await store.aclose()


async def test_a_failed_pass_write_fails_its_publishes_and_delivers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, store = await _engine(tmp_path)
    shard = engine.shard(SPEC, 0)
    await (await engine.publish(PublishRequest(shard, [b"kept"], None), acked=True))

    def full(fd: int, pieces: list[bytes], position: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segment_module, "_write_pieces", full)
    futures = [
        await engine.publish(PublishRequest(shard, [b"lost %d" % i], None), acked=True)
        for i in range(8)
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, StorageError) for r in results), results
    assert shard.next_offset == 1  # no offset taken by what was not written
    assert shard.flush() == []  # nothing pending for delivery
    assert shard._pending == []
    engine.close()
    await store.aclose()


async def test_a_payload_the_log_refuses_fails_alone_in_its_pass(tmp_path: Path) -> None:
    engine, store = await _engine(tmp_path)
    shard = engine.shard(SPEC, 0)
    futures = [
        await engine.publish(PublishRequest(shard, [b"a"], None), acked=True),
        await engine.publish(PublishRequest(shard, [], None), acked=True),  # refused
        await engine.publish(PublishRequest(shard, [b"b"], None), acked=True),
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert results[0] == 0 and results[2] == 1
    assert isinstance(results[1], ValueError)
    engine.close()
    await store.aclose()
