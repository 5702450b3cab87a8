"""Guards of the append path, the state view of commits, and rebuilding both from a real log."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from felix_broker.storage import FsyncMode, Log, LogConfig, Retention
from felix_broker.storage.format import CommitMark, StoredChange
from felix_broker.streams.guards import (
    AppendRefusedError,
    CommitGuard,
    ConditionalGuard,
    ProducerGuard,
    ShardMarks,
    TailMismatch,
    publish_refused,
)
from felix_broker.streams.producers import Append, Duplicate, Refusal, RefusalReason, payload_digest
from felix_broker.streams.state import StateRead, StateView
from felix_wire.codec import encode_frame

CONFIG = LogConfig(segment_bytes=300, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)


def _commit(entity: bytes, **changes: bytes | None) -> CommitMark:
    return CommitMark(entity, tuple(StoredChange(k, v) for k, v in changes.items()))


def test_state_view_answers_value_version_and_as_of() -> None:
    view = StateView()
    assert view.get(b"e", "k") == StateRead(None, None, None)
    view.apply(3, _commit(b"e", k=b"v1", other=b"x"))
    view.apply(5, _commit(b"f", k=b"elsewhere"))
    assert view.get(b"e", "k") == StateRead(b"v1", 3, 5)
    view.apply(9, _commit(b"e", k=None))
    assert view.get(b"e", "k") == StateRead(None, None, 9)
    assert view.get(b"e", "other") == StateRead(b"x", 3, 9)
    with pytest.raises(ValueError):
        view.apply(9, _commit(b"e"))
    view.trim(4)  # retention removed the commit at 3: the state it wrote goes with it
    assert view.get(b"e", "other") == StateRead(None, None, 9)
    assert view.get(b"f", "k") == StateRead(b"elsewhere", 5, 9)


def test_conditional_guard_admits_only_at_the_expected_tail() -> None:
    guard = ConditionalGuard(10)
    assert guard.admit(10, 0) == Append()
    assert guard.admit(11, 0) == TailMismatch(11)
    assert guard.extension(True) is None


def test_commit_guard_applies_state_only_once_durable() -> None:
    marks = ShardMarks()
    guard = CommitGuard(marks, _commit(b"e", k=b"v"), expected_offset=4)
    assert guard.admit(3, 0) == TailMismatch(3)
    assert guard.admit(4, 0) == Append()
    guard.appended(4)
    assert marks.state.get(b"e", "k").value is None
    guard.durable(4)
    assert marks.state.get(b"e", "k") == StateRead(b"v", 4, 4)


def test_producer_guard_records_and_stores_its_mark_on_durable_shards_only() -> None:
    marks = ShardMarks()
    digest = payload_digest([b"a"])
    guard = ProducerGuard(marks, producer_id=5, sequence=0, digest=digest, reused_refusal=True)
    assert guard.admit(0, 0) == Append()
    assert guard.extension(False) is None
    extension = guard.extension(True)
    assert extension is not None and extension.producer is not None
    guard.appended(0)
    assert guard.admit(1, 0) == Duplicate(0)


def test_marks_are_rebuilt_from_the_log_and_follow_retention(tmp_path: Path) -> None:
    log = Log.open(tmp_path, CONFIG)
    marks = ShardMarks.rebuild(log)
    writes = [
        (
            ProducerGuard(
                marks,
                producer_id=1,
                sequence=0,
                digest=payload_digest([b"p0"]),
                reused_refusal=True,
            ),
            [b"p0"],
        ),
        (CommitGuard(marks, _commit(b"e", k=b"v1")), [b"ev1"]),
        (
            ProducerGuard(
                marks,
                producer_id=1,
                sequence=1,
                digest=payload_digest([b"p1"]),
                reused_refusal=True,
            ),
            [b"p1"],
        ),
        (CommitGuard(marks, _commit(b"e", j=b"w")), [b"ev2"]),
    ]
    for guard, payloads in writes:
        assert guard.admit(log.next_offset, log.start_offset) == Append()
        offset = log.append(payloads, timestamp_us=1, extension=guard.extension(True))
        guard.appended(offset)
        guard.durable(offset)
    for _ in range(6):  # filler, so that retention has sealed segments to remove
        log.append([b"f" * 60], timestamp_us=2)
    log.close()

    log = Log.open(tmp_path, CONFIG)
    rebuilt = ShardMarks.rebuild(log)
    for table in (marks, rebuilt):
        assert table.producers.check(
            1, 1, payload_digest([b"p1"]), reused_refusal=True
        ) == Duplicate(2)
        assert table.producers.check(1, 2, 0, reused_refusal=True) == Append()
        assert table.state.get(b"e", "k") == StateRead(b"v1", 1, 3)
        assert table.state.get(b"e", "j") == StateRead(b"w", 3, 3)

    log.apply_retention(Retention(max_bytes=0), now_us=0)
    assert log.start_offset > 3
    rebuilt.follow(log.start_offset)
    assert 1 not in rebuilt.producers
    assert rebuilt.state.get(b"e", "k") == StateRead(None, None, None)
    after_restart = ShardMarks.rebuild(log)
    assert 1 not in after_restart.producers
    assert after_restart.state.get(b"e", "j") == StateRead(None, None, None)
    log.close()


@pytest.mark.parametrize(
    ("admission", "reason"),
    [
        (Refusal(RefusalReason.UNKNOWN_PRODUCER), "unknown_producer"),
        (Refusal(RefusalReason.SEQUENCE_EXPIRED), "sequence_expired"),
        (Refusal(RefusalReason.SEQUENCE_REUSED), "sequence_reused"),
        (Refusal(RefusalReason.SEQUENCE_GAP, 4), {"sequence_gap": {"expected": 4}}),
        (TailMismatch(12), {"offset_mismatch": {"tail": 12}}),
    ],
)
def test_refusals_on_the_wire(admission: Refusal | TailMismatch, reason: object) -> None:
    frame = encode_frame(publish_refused(9, admission))
    body = msgspec.json.decode(frame[12:])
    assert body["type"] == "publish_refused"
    assert body["request_id"] == 9
    assert body["reason"] == reason
    assert body["message"] == str(AppendRefusedError(admission))
