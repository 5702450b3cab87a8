"""Cutting a log back to a batch boundary (`Log.truncate`) on real files: later
segments go, the tail segment is cut, the index and marks follow, and a crash in
the middle of a cut leaves a log that opens and can be cut again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from felix_broker.storage import FsyncMode, Log, LogConfig, OffsetOutOfRangeError, Record
from felix_broker.storage.format import BatchExtension, ProducerMark
from felix_broker.streams.guards import ShardMarks
from felix_broker.streams.producers import Append

SMALL = LogConfig(segment_bytes=256, index_interval_bytes=64, fsync_mode=FsyncMode.ON_COMMIT)


def read_all(log: Log) -> list[Record]:
    return log.read(log.start_offset, max_records=1_000_000, max_bytes=1 << 40)


def fill(log: Log, batches: int) -> list[int]:
    """`batches` batches of two records each over several segments; their bases."""
    bases = []
    for i in range(batches):
        mark = BatchExtension(producer=ProducerMark(7, i, i)) if i % 3 == 0 else None
        payloads = [bytes([65 + i % 26]) * 40, b"x" * (i % 5)]
        bases.append(log.append(payloads, timestamp_us=1000 + i, publisher="p", extension=mark))
    return bases


async def test_a_cut_drops_later_segments_and_the_tail_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    log = Log.open(tmp_path, SMALL)
    bases = fill(log, 12)
    await log.sync()
    before = read_all(log)
    assert log.segment_count > 3
    cut = bases[5]
    await log.truncate(cut)
    assert log.next_offset == cut
    assert log.durable_offset == cut
    assert read_all(log) == [r for r in before if r.offset < cut]
    assert log.offset_for_time(10**9) is None  # nothing after the cut's times
    # The log goes on from the cut: new records take the cut offsets.
    assert log.append([b"new"], timestamp_us=5000) == cut
    await log.sync()
    log.close()
    again = Log.open(tmp_path, SMALL)
    assert read_all(again) == [r for r in before if r.offset < cut] + [
        Record(cut, 5000, None, b"new")
    ]
    # Producer marks above the cut are gone with their batches.
    marks = [offset for offset, _count, _ext in again.extensions()]
    assert marks == [b for i, b in enumerate(bases) if i % 3 == 0 and b < cut]
    # The producer table rebuilt from the cut log: sequence 3 was the last kept.
    producers = ShardMarks.rebuild(again).producers
    assert producers.next_sequence(7) == 4
    assert isinstance(producers.check(7, 4, 4, reused_refusal=True), Append)
    again.close()


async def test_a_cut_at_a_segment_start_and_at_zero(tmp_path: Path) -> None:
    log = Log.open(tmp_path, SMALL)
    fill(log, 10)
    await log.sync()
    second = log._segments[1].base_offset  # a segment boundary
    await log.truncate(second)
    assert log.next_offset == second
    await log.truncate(0)
    assert (log.next_offset, read_all(log), log.segment_count) == (0, [], 1)
    log.close()
    again = Log.open(tmp_path, SMALL)
    assert again.next_offset == 0
    again.close()


async def test_a_cut_inside_a_batch_or_outside_the_log_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    log = Log.open(tmp_path, SMALL)
    fill(log, 4)
    await log.sync()
    before = read_all(log)
    with pytest.raises(ValueError, match="no batch starts"):
        await log.truncate(1)  # the middle of the first batch
    with pytest.raises(OffsetOutOfRangeError):
        await log.truncate(log.next_offset + 1)
    assert read_all(log) == before
    log.close()


async def test_a_crash_in_the_middle_of_a_cut_leaves_a_prefix_that_a_second_cut_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log.open(tmp_path, SMALL)
    bases = fill(log, 12)
    await log.sync()
    before = read_all(log)
    cut = bases[2]

    class Crash(BaseException):
        pass

    def crash(path: object, length: int) -> None:
        raise Crash  # the process dies after the later segments went, before the cut

    monkeypatch.setattr(os, "truncate", crash)
    with pytest.raises(Crash):
        await log.truncate(cut)
    monkeypatch.undo()
    # What the disk holds: a prefix of the log, at least as long as the cut.
    reopened = Log.open(tmp_path, SMALL)
    held = read_all(reopened)
    assert cut <= len(held) < len(before)
    assert held == before[: len(held)]
    await reopened.truncate(cut)
    assert read_all(reopened) == before[:cut]
    reopened.close()
    final = Log.open(tmp_path, SMALL)
    assert read_all(final) == before[:cut]
    final.close()
