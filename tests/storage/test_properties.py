"""A stateful property test: the log behaves like a list of records across everything."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from felix_broker.storage import FsyncMode, Log, LogConfig, Record, Retention
from felix_broker.storage.format import HEADER_SIZE, check_batch

pytestmark = pytest.mark.timeout(300)

CONFIG = LogConfig(segment_bytes=300, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)


class LogModel(RuleBasedStateMachine):
    """Appends, retention, restarts, torn tails, reads and time lookups against a list."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="felix-log-"))
        self.log = Log.open(self.directory, CONFIG)
        self.records: list[Record] = []  # index == offset; below start are retained no more
        self.start = 0
        self.clock = 1000

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory)

    @rule(
        payloads=st.lists(st.binary(max_size=120), min_size=1, max_size=6),
        step=st.integers(-5, 20),
        publisher=st.none() | st.text(max_size=8),
    )
    def append(self, payloads: list[bytes], step: int, publisher: str | None) -> None:
        self.clock += step
        # The log keeps times non-decreasing over the records it still holds.
        retained = self.records[self.start :]
        stored = max(self.clock, retained[-1].timestamp_us) if retained else self.clock
        base = self.log.append(payloads, timestamp_us=self.clock, publisher=publisher)
        assert base == len(self.records)
        self.records += [
            Record(base + i, stored, publisher, payload) for i, payload in enumerate(payloads)
        ]

    @rule(max_bytes=st.integers(0, 2000))
    def retain_by_size(self, max_bytes: int) -> None:
        self.log.apply_retention(Retention(max_bytes=max_bytes), now_us=0)
        assert self.log.size_bytes <= max_bytes or self.log.segment_count == 1
        assert self.log.start_offset >= self.start
        self.start = self.log.start_offset

    @rule(age=st.integers(0, 100))
    def retain_by_age(self, age: int) -> None:
        self.log.apply_retention(Retention(max_age_us=age), now_us=self.clock)
        assert self.log.start_offset >= self.start
        dropped = self.records[self.start : self.log.start_offset]
        assert all(r.timestamp_us < self.clock - age for r in dropped)
        self.start = self.log.start_offset

    @rule()
    def restart(self) -> None:
        self.log.close()
        self.log = Log.open(self.directory, CONFIG)

    @precondition(lambda self: len(self.records) > self.start)
    @rule(cut=st.integers(0, 10_000), junk=st.binary(max_size=40))
    def crash_with_torn_last_batch(self, cut: int, junk: bytes) -> None:
        self.log.close()
        active = max(self.directory.glob("*.log"))
        data = active.read_bytes()
        # Find the last batch on disk (an append split across segments left
        # only its last part here).
        position, last = HEADER_SIZE, None
        while position < len(data):
            batch = check_batch(data, position, len(data))
            assert batch is not None
            last = (position, batch.head.length, batch.head.record_count)
            position += batch.head.length
        if last is None or last[0] == HEADER_SIZE:
            self.log = Log.open(self.directory, CONFIG)
            return  # the batch sits alone in a segment; tearing it is covered elsewhere
        start, length, records = last
        at = start + cut % length
        damage = bytearray(bytes(len(junk)) if junk[:1] == b"\0" else junk)
        if damage and damage[0] == data[at]:
            damage[0] ^= 0xFF  # the junk must really differ from the batch it replaces
        os.truncate(active, at)
        with active.open("ab") as f:
            f.write(damage)
        self.log = Log.open(self.directory, CONFIG)
        del self.records[-records:]

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        first = data.draw(st.integers(self.start, len(self.records)), label="from")
        max_records = data.draw(st.integers(1, 20), label="max_records")
        max_bytes = data.draw(st.integers(0, 600), label="max_bytes")
        end = data.draw(st.none() | st.integers(first, len(self.records) + 2), label="end")
        expected: list[Record] = []
        used = 0
        for record in self.records[first : len(self.records) if end is None else end]:
            if expected and used + len(record.payload) > max_bytes:
                break
            expected.append(record)
            used += len(record.payload)
            if len(expected) == max_records:
                break
        got = self.log.read(first, max_records=max_records, max_bytes=max_bytes, end=end)
        assert got == expected

    @rule(at=st.integers(900, 2200))
    def time_lookup(self, at: int) -> None:
        expected = next(
            (r.offset for r in self.records[self.start :] if r.timestamp_us >= at), None
        )
        assert self.log.offset_for_time(at) == expected

    @invariant()
    def offsets_match(self) -> None:
        assert self.log.start_offset == self.start
        assert self.log.next_offset == self.log.durable_offset == len(self.records)


LogModel.TestCase.settings = settings(LogModel.TestCase.settings, stateful_step_count=40)
TestLogModel = LogModel.TestCase
