"""Appends, reads, restarts, time lookups and retention on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_broker.storage import (
    FsyncMode,
    Log,
    LogClosedError,
    LogConfig,
    OffsetOutOfRangeError,
    PrincipalTooLongError,
    Record,
    Retention,
)

SMALL = LogConfig(segment_bytes=256, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)


def read_all(log: Log) -> list[Record]:
    return log.read(log.start_offset, max_records=1_000_000, max_bytes=1 << 40)


def test_empty_log(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "log", SMALL)
    assert (log.start_offset, log.next_offset, log.durable_offset) == (0, 0, 0)
    assert read_all(log) == []
    assert log.offset_for_time(0) is None
    log.close()


def test_append_read_restart_round_trip(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    assert log.append([b"a", b"bb"], timestamp_us=10, publisher="alice") == 0
    assert log.append([b"c" * 300], timestamp_us=20) == 2
    assert log.append([b"d"], timestamp_us=30, publisher="") == 3
    expected = [
        Record(0, 10, "alice", b"a"),
        Record(1, 10, "alice", b"bb"),
        Record(2, 20, None, b"c" * 300),
        Record(3, 30, "", b"d"),
    ]
    assert read_all(log) == expected
    assert log.segment_count > 1
    log.close()
    with pytest.raises(LogClosedError):
        log.append([b"x"], timestamp_us=1)

    reopened = Log.open(tmp_path, SMALL)
    assert read_all(reopened) == expected
    assert reopened.next_offset == 4
    assert reopened.append([b"e"], timestamp_us=40) == 4
    reopened.close()
    again = Log.open(tmp_path, SMALL)
    assert [r.offset for r in read_all(again)] == [0, 1, 2, 3, 4]
    again.close()


def test_many_segments_and_reads_from_every_offset(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    payloads = [bytes([i]) * (i % 37) for i in range(200)]
    for i in range(0, 200, 7):
        log.append(payloads[i : i + 7], timestamp_us=i)
    assert log.segment_count > 10
    for start in range(0, 201, 3):
        got = log.read(start, max_records=5, max_bytes=1 << 20)
        assert [r.offset for r in got] == list(range(start, min(start + 5, 200)))
        assert [r.payload for r in got] == payloads[start : start + 5]
    log.close()


def test_reads_inside_big_batches_go_to_the_record_and_stay_right(tmp_path: Path) -> None:
    log = Log.open(tmp_path)
    payloads = [b"%d" % i * (1 + i % 5) for i in range(1500)]
    for i in range(0, 1500, 500):  # three batches of 500 records
        log.append(payloads[i : i + 500], timestamp_us=i)
    # Every offset twice (the second time from the remembered batch tables), with
    # reads ending inside a batch, at its end and past it.
    for _ in range(2):
        for start in range(0, 1500, 7):
            for count in (1, 32, 600):
                got = log.read(start, max_records=count, max_bytes=1 << 20)
                want = list(range(start, min(start + count, 1500)))
                assert [r.offset for r in got] == want
                assert [r.payload for r in got] == payloads[start : start + count]
                assert {r.timestamp_us for r in got} <= {0, 500, 1000}
    log.close()


def test_read_budgets_and_end(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    log.append([b"x" * 10] * 10, timestamp_us=1)
    assert len(log.read(0, max_records=3, max_bytes=1000)) == 3
    assert len(log.read(0, max_records=100, max_bytes=25)) == 2
    # A single record over the byte budget still comes back, alone.
    assert [r.offset for r in log.read(4, max_records=100, max_bytes=1)] == [4]
    assert [r.offset for r in log.read(2, max_records=100, max_bytes=1000, end=5)] == [2, 3, 4]
    assert log.read(10, max_records=1, max_bytes=1) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, max_records=1, max_bytes=1)
    with pytest.raises(ValueError):
        log.read(0, max_records=0, max_bytes=1)
    log.close()


def test_append_refuses_bad_input(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    with pytest.raises(PrincipalTooLongError):
        log.append([b"x"], timestamp_us=1, publisher="p" * 256)
    with pytest.raises(ValueError):
        log.append([], timestamp_us=1)
    assert log.next_offset == 0
    log.append([b"x"], timestamp_us=1, publisher="p" * 255)
    assert read_all(log)[0].publisher == "p" * 255
    log.close()


def test_timestamps_never_go_backwards(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    log.append([b"a"], timestamp_us=100)
    log.append([b"b"], timestamp_us=50)
    assert [r.timestamp_us for r in read_all(log)] == [100, 100]
    log.close()


def test_offset_for_time(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    # Equal timestamps across batches and segments, and gaps between times.
    for ts in [10, 10, 10, 20, 20, 30, 50, 50, 50, 50]:
        log.append([b"p" * 40, b"q" * 40], timestamp_us=ts)
    assert log.segment_count > 3
    times = [r.timestamp_us for r in read_all(log)]
    for at in range(0, 60):
        expected = next((i for i, t in enumerate(times) if t >= at), None)
        assert log.offset_for_time(at) == expected, at
    assert log.offset_for_time(-(2**60)) == 0
    log.close()


def test_offset_for_time_after_retention_and_restart(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    for ts in range(20):
        log.append([b"z" * 100], timestamp_us=ts * 10)
    log.apply_retention(Retention(max_bytes=648), now_us=0)
    # One 162-byte segment per record (a 20-byte header, a 142-byte batch of one):
    # four fit in 648 bytes.
    assert log.start_offset == 16
    log.close()
    log = Log.open(tmp_path, SMALL)
    assert log.start_offset == 16
    assert log.offset_for_time(0) == 16
    assert log.offset_for_time(165) == 17
    assert log.offset_for_time(190) == 19
    assert log.offset_for_time(191) is None
    log.close()


def test_retention_by_size_keeps_active_segment(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    for i in range(30):
        log.append([b"r" * 60], timestamp_us=i)
    segments = log.segment_count
    assert log.apply_retention(Retention(max_bytes=0), now_us=0) == segments - 1
    assert log.segment_count == 1
    # 98-byte batches of one record: two fit a 256-byte segment after its 20-byte header.
    assert log.start_offset == 28
    assert [r.offset for r in read_all(log)] == [28, 29]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, max_records=1, max_bytes=1)
    log.close()
    log = Log.open(tmp_path, SMALL)
    assert (log.start_offset, log.next_offset) == (28, 30)
    assert log.append([b"after"], timestamp_us=99) == 30
    log.close()


def test_retention_by_size_keeps_the_newest_within_bound(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    for i in range(30):
        log.append([b"r" * 60], timestamp_us=i)
    bound = log.size_bytes // 2
    log.apply_retention(Retention(max_bytes=bound), now_us=0)
    assert log.size_bytes <= bound
    assert log.segment_count > 1
    log.close()


def test_retention_by_age_removes_only_old_sealed_segments(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    for i in range(30):
        log.append([b"r" * 60], timestamp_us=i * 1000)
    before = log.start_offset
    assert log.apply_retention(Retention(max_age_us=10**9), now_us=30_000) == 0
    assert log.start_offset == before
    log.apply_retention(Retention(max_age_us=15_000), now_us=30_000)
    # Two records per segment: [14, 15] is the first whose newest record (15 ms)
    # is inside the horizon, so it and everything after it stay.
    assert log.start_offset == 14
    assert read_all(log)[0] == Record(14, 14_000, None, b"r" * 60)
    log.apply_retention(Retention(max_age_us=0), now_us=10**12)
    assert log.segment_count == 1
    assert log.next_offset == 30
    log.close()


def test_retention_of_an_empty_log_deletes_nothing(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    assert log.apply_retention(Retention(max_bytes=0, max_age_us=0), now_us=10**12) == 0
    assert log.segment_count == 1
    log.close()
