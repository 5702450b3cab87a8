"""Idempotent batches and commits on a real log, under hypothesis: interleavings of sends,
resends, commits, retention and restarts, against a model. A restart rebuilds the shard's
marks from the files and must answer exactly as before."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from felix_broker.storage import FsyncMode, Log, LogConfig, Retention
from felix_broker.storage.format import CommitMark, StoredChange
from felix_broker.streams.guards import AppendGuard, CommitGuard, ProducerGuard, ShardMarks
from felix_broker.streams.producers import Append, Duplicate, Refusal, RefusalReason, payload_digest

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)


class DurableMarksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="felix-marks-"))
        self.log = Log.open(self.directory, CONFIG)
        self.marks = ShardMarks.rebuild(self.log)
        # Model: per producer, every batch appended since it (re)started.
        self.batches: dict[int, list[tuple[int, int, int]]] = {}
        self.state: dict[tuple[bytes, str], tuple[bytes, int]] = {}
        self.as_of: int | None = None

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _write(self, guard: AppendGuard, payloads: list[bytes]) -> object:
        # What the publish worker does, synchronously.
        admission = guard.admit(self.log.next_offset, self.log.start_offset)
        if isinstance(admission, Append):
            offset = self.log.append(payloads, timestamp_us=1, extension=guard.extension(True))
            guard.appended(offset)
            guard.durable(offset)
            return offset
        return admission

    @rule(
        producer=st.integers(0, 2),
        delta=st.integers(-3, 1),
        payload=st.integers(0, 1),
        reused=st.booleans(),
    )
    def send(self, producer: int, delta: int, payload: int, reused: bool) -> None:
        known = self.batches.get(producer)
        sequence = max(0, (known[-1][0] + 1 if known else 0) + delta)
        payloads = [b"p%d" % payload, b"s%d" % sequence]
        digest = payload_digest(payloads)
        guard = ProducerGuard(
            self.marks,
            producer_id=producer,
            sequence=sequence,
            digest=digest,
            reused_refusal=reused,
        )
        got = self._write(guard, payloads)
        if known is None:
            if sequence == 0:
                assert isinstance(got, int)
                self.batches[producer] = [(0, digest, got)]
            else:
                assert got == Refusal(RefusalReason.UNKNOWN_PRODUCER)
            return
        expected = known[-1][0] + 1
        if sequence == expected:
            assert isinstance(got, int)
            known.append((sequence, digest, got))
        elif sequence > expected:
            assert got == Refusal(RefusalReason.SEQUENCE_GAP, expected)
        else:
            match = [b for b in known[-64:] if b[0] == sequence]
            if not match:
                assert got == Refusal(RefusalReason.SEQUENCE_EXPIRED)
            elif match[0][1] == digest or not reused:
                assert got == Duplicate(match[0][2])
            else:
                assert got == Refusal(RefusalReason.SEQUENCE_REUSED)

    @rule(
        entity=st.sampled_from([b"e1", b"e2"]),
        key=st.sampled_from(["a", "b"]),
        delete=st.booleans(),
    )
    def commit(self, entity: bytes, key: str, delete: bool) -> None:
        value = None if delete else b"v%d" % self.log.next_offset
        guard = CommitGuard(self.marks, CommitMark(entity, (StoredChange(key, value),)))
        offset = self._write(guard, [b"event"])
        assert isinstance(offset, int)
        if value is None:
            self.state.pop((entity, key), None)
        else:
            self.state[(entity, key)] = (value, offset)
        self.as_of = offset

    @rule()
    def retention(self) -> None:
        self.log.apply_retention(Retention(max_bytes=800), now_us=0)
        start = self.log.start_offset
        self.marks.follow(start)
        for producer in list(self.batches):
            kept = [b for b in self.batches[producer] if b[2] >= start]
            if kept:
                self.batches[producer] = kept
            else:
                del self.batches[producer]
        self.state = {k: v for k, v in self.state.items() if v[1] >= start}
        if self.as_of is not None and self.as_of < start:
            self.as_of = None

    @rule()
    def restart(self) -> None:
        self.log.close()
        self.log = Log.open(self.directory, CONFIG)
        self.marks = ShardMarks.rebuild(self.log)

    @invariant()
    def state_matches(self) -> None:
        for entity in (b"e1", b"e2"):
            for key in ("a", "b"):
                read = self.marks.state.get(entity, key)
                value, version = self.state.get((entity, key), (None, None))
                assert (read.value, read.version, read.as_of) == (value, version, self.as_of)
        assert len(self.marks.producers) == len(self.batches)
        for producer, known in self.batches.items():
            assert self.marks.producers.next_sequence(producer) == known[-1][0] + 1


DurableMarksMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_durable_marks_machine = DurableMarksMachine.TestCase
