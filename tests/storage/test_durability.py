"""fsync modes, group commit and the failed state, with real (counting, failing) fsyncs."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from felix_broker.storage import FsyncMode, Log, LogClosedError, LogConfig, LogFailedError
from tests.storage.fakes import CountingFsync

pytestmark = pytest.mark.timeout(30)


def open_log(path: Path, mode: FsyncMode, fsync: CountingFsync, **options: int) -> Log:
    log = Log.open(path, LogConfig(fsync_mode=mode, **options), fsync=fsync)
    fsync.calls = 0  # opening syncs once; count only what follows
    return log


async def test_on_commit_concurrent_waiters_share_fsyncs(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)

    async def publish(i: int) -> int:
        base = log.append([f"record {i}".encode()], timestamp_us=i)
        await log.wait_durable(base)
        return base

    bases = await asyncio.gather(*(publish(i) for i in range(50)))
    assert sorted(bases) == list(range(50))
    assert 1 <= fsync.calls < 50
    assert log.durable_offset == 50
    await log.aclose()


async def test_waiters_arriving_during_a_round_join_the_next(tmp_path: Path) -> None:
    fsync = CountingFsync(delay=0.02)
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)

    async def publish(i: int) -> None:
        await asyncio.sleep((i % 5) * 0.005)  # five waves, overlapping the slow fsyncs
        await log.wait_durable(log.append([b"x"], timestamp_us=i))

    await asyncio.gather(*(publish(i) for i in range(100)))
    assert fsync.calls <= 10
    assert log.durable_offset == 100
    await log.aclose()


async def test_on_commit_readers_see_only_durable_records(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    base = log.append([b"a", b"b"], timestamp_us=5)
    assert (log.next_offset, log.durable_offset, log.readable_offset) == (2, 0, 0)
    assert log.read(0, max_records=10, max_bytes=100) == []
    assert log.offset_for_time(0) is None
    await log.wait_durable(base + 1)
    assert [r.payload for r in log.read(0, max_records=10, max_bytes=100)] == [b"a", b"b"]
    assert log.offset_for_time(0) == 0
    with pytest.raises(ValueError):
        await log.wait_durable(2)
    await log.aclose()


async def test_on_commit_roll_syncs_the_sealed_segment(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync, segment_bytes=200)
    log.append([b"x" * 100], timestamp_us=1)
    log.append([b"y" * 100], timestamp_us=2)  # rolls: the first segment is synced now
    assert fsync.calls >= 1
    assert log.durable_offset == 1
    await log.wait_durable(1)
    assert log.durable_offset == 2
    await log.aclose()


async def test_none_never_syncs(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = Log.open(tmp_path, LogConfig(fsync_mode=FsyncMode.NONE, segment_bytes=200), fsync=fsync)
    for i in range(10):
        await log.wait_durable(log.append([b"z" * 100], timestamp_us=i))
    await log.sync()
    assert log.durable_offset == log.readable_offset == 10
    await log.aclose()
    assert fsync.calls == 0


async def test_periodic_acknowledges_at_once_and_syncs_on_demand(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.PERIODIC, fsync)
    base = log.append([b"p"], timestamp_us=1)
    await log.wait_durable(base)
    assert fsync.calls == 0
    assert log.durable_offset == 0
    assert log.readable_offset == 1
    assert log.needs_sync
    await log.sync()
    assert fsync.calls == 1
    assert log.durable_offset == 1
    assert not log.needs_sync
    log.append([b"q"], timestamp_us=2)
    log.close()  # close syncs what is pending
    assert fsync.calls == 2


async def test_failed_fsync_stops_the_log_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    await log.wait_durable(log.append([b"safe"], timestamp_us=1))
    fsync.fail = True
    base = log.append([b"doomed"], timestamp_us=2)
    with caplog.at_level(logging.ERROR), pytest.raises(LogFailedError):
        await log.wait_durable(base)
    assert log.failed
    assert any(r.levelno == logging.ERROR and "fsync" in r.getMessage() for r in caplog.records)
    fsync.fail = False  # even a working disk is not trusted again without a reopen
    with pytest.raises(LogFailedError):
        log.append([b"later"], timestamp_us=3)
    with pytest.raises(LogFailedError):
        await log.wait_durable(0)
    with pytest.raises(LogFailedError):
        await log.sync()
    assert log.durable_offset == 1
    await log.aclose()
    with pytest.raises(LogClosedError):
        log.append([b"x"], timestamp_us=4)

    reopened = Log.open(tmp_path, LogConfig(fsync_mode=FsyncMode.ON_COMMIT), fsync=fsync)
    assert reopened.next_offset == 2  # the write reached the OS; reopening rescanned it
    await reopened.wait_durable(reopened.append([b"again"], timestamp_us=5))
    await reopened.aclose()


async def test_every_waiter_of_a_failed_round_fails(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    fsync.fail = True
    waits = [log.wait_durable(log.append([b"w"], timestamp_us=i)) for i in range(10)]
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, LogFailedError) for r in results)
    await log.aclose()


async def test_failed_fsync_in_periodic_mode(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.PERIODIC, fsync)
    log.append([b"a"], timestamp_us=1)
    fsync.fail = True
    with pytest.raises(LogFailedError):
        await log.sync()
    with pytest.raises(LogFailedError):
        log.append([b"b"], timestamp_us=2)
    log.close()


async def test_failed_fsync_when_sealing_a_segment(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync, segment_bytes=200)
    log.append([b"x" * 100], timestamp_us=1)
    fsync.fail = True
    with pytest.raises(LogFailedError):
        log.append([b"y" * 100], timestamp_us=2)
    assert log.failed
    log.close()


async def test_failed_fsync_on_close_is_reported(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.PERIODIC, fsync)
    log.append([b"a"], timestamp_us=1)
    fsync.fail = True
    with pytest.raises(LogFailedError):
        log.close()
    assert log.closed


async def test_a_cancelled_waiter_does_not_cancel_the_shared_round(tmp_path: Path) -> None:
    fsync = CountingFsync(delay=0.05)
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    first = asyncio.ensure_future(log.wait_durable(log.append([b"a"], timestamp_us=1)))
    second = asyncio.ensure_future(log.wait_durable(log.append([b"b"], timestamp_us=2)))
    await asyncio.sleep(0.01)
    first.cancel()
    await second
    assert first.cancelled()
    assert log.durable_offset == 2
    await log.aclose()


async def test_fsync_runs_off_the_event_loop(tmp_path: Path) -> None:
    fsync = CountingFsync(delay=0.2)
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    await log.wait_durable(log.append([b"a"], timestamp_us=1))
    task.cancel()
    assert ticks >= 5  # the loop kept running during the 200 ms fsync
    await log.aclose()


async def test_failed_write_stops_the_log(tmp_path: Path) -> None:
    fsync = CountingFsync()
    log = open_log(tmp_path, FsyncMode.ON_COMMIT, fsync)
    await log.wait_durable(log.append([b"kept"], timestamp_us=1))
    # Swap the active segment's descriptor for a read-only one: the next write
    # fails with a real EBADF, as a write to a broken disk would fail.
    active_fd = log._segments[-1].fd
    assert active_fd is not None
    read_only = os.open(tmp_path / f"{0:020d}.log", os.O_RDONLY)
    os.dup2(read_only, active_fd)
    os.close(read_only)
    with pytest.raises(LogFailedError):
        log.append([b"lost"], timestamp_us=2)
    assert log.failed
    with pytest.raises(LogFailedError):
        await log.wait_durable(0)
    await log.aclose()
    reopened = Log.open(tmp_path, LogConfig(fsync_mode=FsyncMode.ON_COMMIT))
    assert [r.payload for r in reopened.read(0, max_records=10, max_bytes=100)] == [b"kept"]
    reopened.close()
