"""LogStore: one log per shard folder, recovery at start, background fsync and retention."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.storage import (
    CorruptionError,
    FsyncMode,
    LogConfig,
    LogStore,
    Retention,
    ShardKey,
    ShardOffsets,
)
from tests.storage.fakes import CountingFsync

pytestmark = pytest.mark.timeout(30)

KEY = ShardKey("t1", "default", "orders", 0)


async def test_logs_live_in_shard_folders_and_recover(tmp_path: Path) -> None:
    store = LogStore(tmp_path, config=LogConfig(fsync_mode=FsyncMode.ON_COMMIT))
    assert await store.recover_all() == []
    assert store.ready
    other = ShardKey("t1", ".ns", "orders", 3)
    log = store.open_log(KEY)
    assert store.open_log(KEY) is log
    await log.wait_durable(log.append([b"a", b"b"], timestamp_us=1))
    store.open_log(other).append([b"c"], timestamp_us=1)
    assert (tmp_path / "t1" / "default" / "orders" / "0" / f"{0:020d}.log").is_file()
    assert store.offsets()[KEY] == ShardOffsets(start=0, durable=2, next=2)
    await store.aclose()
    assert not store.ready

    (tmp_path / "t1" / "default" / "orders" / "not-a-shard").mkdir()
    (tmp_path / "stray-file").write_text("ignored")
    again = LogStore(tmp_path, config=LogConfig(fsync_mode=FsyncMode.ON_COMMIT))
    assert await again.recover_all() == [other, KEY]  # sorted: "." before "d"
    assert again.offsets() == {
        KEY: ShardOffsets(0, 2, 2),
        other: ShardOffsets(0, 1, 1),  # closing synced the unsynced record
    }
    recovered = again.get(KEY)
    assert recovered is not None
    assert recovered.append([b"d"], timestamp_us=2) == 2
    await again.aclose()


async def test_recover_all_reports_a_corrupt_shard(tmp_path: Path) -> None:
    store = LogStore(tmp_path, config=LogConfig(fsync_mode=FsyncMode.NONE))
    log = store.open_log(KEY)
    log.append([b"x" * 50] * 3, timestamp_us=1)
    log.append([b"y" * 50], timestamp_us=2)  # valid data after the damage: not a torn tail
    await store.aclose()
    segment = tmp_path / "t1" / "default" / "orders" / "0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[20 + 70] ^= 1  # a payload byte of the first batch
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as info:
        await LogStore(tmp_path).recover_all()
    assert info.value.path == segment


@pytest.mark.parametrize(
    "names",
    [("..", "n", "s"), ("t", ".", "s"), ("t", "n", "a/b"), ("t", "", "s"), ("x" * 129, "n", "s")],
)
def test_shard_keys_refuse_unsafe_names(names: tuple[str, str, str]) -> None:
    with pytest.raises(ValueError):
        ShardKey(*names, 0)


def test_shard_keys_refuse_negative_shards() -> None:
    with pytest.raises(ValueError):
        ShardKey("t", "n", "s", -1)


async def test_background_fsync_and_retention(tmp_path: Path) -> None:
    fsync = CountingFsync()
    now = 10_000_000
    store = LogStore(
        tmp_path,
        config=LogConfig(fsync_mode=FsyncMode.PERIODIC, fsync_interval=0.02, segment_bytes=310),
        retention_interval=0.02,
        fsync=fsync,
        clock_us=lambda: now,
    )
    await store.recover_all()
    log = store.open_log(KEY, retention=Retention(max_age_us=1_000_000))
    for i in range(20):
        log.append([b"r" * 100], timestamp_us=now - 5_000_000 + i)
    log.append([b"fresh"], timestamp_us=now)
    assert log.durable_offset < log.next_offset
    store.start()
    async with asyncio.timeout(5):
        while log.durable_offset < log.next_offset or log.start_offset == 0:
            await asyncio.sleep(0.01)
    assert log.segment_count == 1
    assert store.offsets()[KEY] == ShardOffsets(20, 21, 21)
    await store.aclose()


async def test_set_retention_by_size(tmp_path: Path) -> None:
    store = LogStore(tmp_path, config=LogConfig(fsync_mode=FsyncMode.NONE, segment_bytes=300))
    log = store.open_log(KEY)
    for i in range(20):
        log.append([b"r" * 100], timestamp_us=i)
    assert store.apply_retention() == 0  # no policy: keep everything
    store.set_retention(KEY, Retention(max_bytes=1000))
    assert store.apply_retention() > 0
    assert log.size_bytes <= 1000
    await store.aclose()
