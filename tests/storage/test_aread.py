"""Log.aread: the same records as Log.read, read on a worker thread through
descriptors of its own, so retention and close meanwhile do not disturb it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from felix_broker.storage import FsyncMode, Log, LogConfig, Retention
from felix_broker.storage.format import Record
from felix_broker.storage.segment import Segment

SMALL = LogConfig(segment_bytes=256, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)


def _filled(tmp: Path) -> Log:
    log = Log.open(tmp / "log", SMALL)
    for i in range(60):
        log.append([f"record-{i:03}".encode() * 3], timestamp_us=1_000 + i)
    assert log.segment_count > 4
    return log


async def test_aread_matches_read(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    try:
        for start, records, size, end in (
            (0, 100, 10**6, None),
            (7, 5, 10**6, 30),
            (13, 100, 90, None),
        ):
            expected = log.read(start, max_records=records, max_bytes=size, end=end)
            got = await log.aread(start, max_records=records, max_bytes=size, end=end)
            assert got == expected and got
    finally:
        log.close()


async def test_aread_survives_retention_and_close_meanwhile(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    expected = log.read(0, max_records=1000, max_bytes=10**6)
    reading = asyncio.create_task(log.aread(0, max_records=1000, max_bytes=10**6))
    await asyncio.sleep(0)  # the read has taken its descriptors
    assert log.apply_retention(Retention(max_age_us=0), now_us=10**9) > 0
    log.close()
    assert await reading == expected


async def test_aread_reads_off_the_event_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[int] = set()
    records_from = Segment.records_from

    def traced(self: Segment, fd: int, offset: int, end: int | None = None) -> Iterator[Record]:
        threads.add(threading.get_ident())
        return records_from(self, fd, offset, end)

    monkeypatch.setattr(Segment, "records_from", traced)
    log = _filled(tmp_path)
    try:
        await log.aread(0, max_records=1000, max_bytes=10**6)
    finally:
        log.close()
    assert threads and threading.get_ident() not in threads
