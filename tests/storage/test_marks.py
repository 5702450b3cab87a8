"""Format version 3: producer marks and commits in a batch's extension area, and v2 upgrades."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.storage import CorruptionError, FsyncMode, Log, LogConfig, Record
from felix_broker.storage.format import (
    FLAG_COMMIT,
    FLAG_PRODUCER_MARK,
    BatchExtension,
    CommitMark,
    ProducerMark,
    StoredChange,
    check_batch,
    decode_batch,
    decode_extension,
    encode_batch,
    encode_extension,
    segment_path,
)

CONFIG = LogConfig(segment_bytes=400, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)

MARK = BatchExtension(producer=ProducerMark(2**64 - 1, 7, 0xDEADBEEF))
COMMIT = BatchExtension(
    commit=CommitMark(
        b"order-1",
        (StoredChange("status", b"paid"), StoredChange("note", None), StoredChange("", b"")),
    )
)

changes = st.lists(
    st.builds(StoredChange, st.text(max_size=20), st.none() | st.binary(max_size=40)), max_size=5
)
extensions = st.builds(
    BatchExtension,
    producer=st.none()
    | st.builds(
        ProducerMark,
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**64 - 1),
    ),
    commit=st.none() | st.builds(CommitMark, st.binary(max_size=30), changes.map(tuple)),
).filter(lambda e: e.producer is not None or e.commit is not None)


@given(extensions, st.data())
def test_extension_round_trips_and_any_flipped_bit_is_caught(
    extension: BatchExtension, data: st.DataObject
) -> None:
    flags, area = encode_extension(extension)
    assert decode_extension(flags, area) == extension
    payloads = [b"event"] if extension.commit is not None else [b"a", b"bc"]
    raw = b"".join(encode_batch(9, 5, flags, b"", payloads, area))
    batch = check_batch(raw, 0, len(raw))
    assert batch is not None and batch.extension == extension
    assert [r.payload for r in decode_batch(raw, 0, batch)] == payloads
    at = data.draw(st.integers(0, len(raw) - 1))
    damaged = bytearray(raw)
    damaged[at] ^= 1 << data.draw(st.integers(0, 7))
    assert check_batch(bytes(damaged), 0, len(damaged)) is None


def test_documented_extension_bytes() -> None:
    # Packed by hand from docs/storage-format.md.
    flags, area = encode_extension(
        BatchExtension(
            producer=ProducerMark(1, 2, 3),
            commit=CommitMark(b"k", (StoredChange("a", b"xy"), StoredChange("b", None))),
        )
    )
    assert flags == FLAG_PRODUCER_MARK | FLAG_COMMIT == 0x06
    assert area == (
        struct.pack(">QQQ", 1, 2, 3)
        + struct.pack(">I", 1)
        + b"k"
        + struct.pack(">I", 2)
        + b"\x01"
        + struct.pack(">H", 1)
        + b"a"
        + struct.pack(">I", 2)
        + b"xy"
        + b"\x02"
        + struct.pack(">H", 1)
        + b"b"
    )


def test_a_commit_batch_holds_exactly_one_record() -> None:
    flags, area = encode_extension(COMMIT)
    raw = b"".join(encode_batch(0, 0, flags, b"", [b"a", b"b"], area))
    assert check_batch(raw, 0, len(raw)) is None


def test_marks_survive_a_restart_and_marked_batches_are_never_split(tmp_path: Path) -> None:
    log = Log.open(tmp_path, CONFIG)
    assert log.append([b"x" * 150], timestamp_us=1) == 0
    # This batch does not fit what is left of the active segment: it starts a new
    # one whole instead of being split, even though it is bigger than segment_bytes.
    big = [b"y" * 200, b"z" * 200]
    assert log.append(big, timestamp_us=2, extension=MARK) == 1
    assert log.segment_count == 2
    assert log.append([b"event"], timestamp_us=3, extension=COMMIT) == 3
    assert log.append([b"plain"], timestamp_us=4) == 4
    expected = [(1, 2, MARK), (3, 1, COMMIT)]
    assert list(log.extensions()) == expected
    log.close()
    log = Log.open(tmp_path, CONFIG)
    assert list(log.extensions()) == expected
    assert log.read(0, max_records=10, max_bytes=10_000) == [
        Record(0, 1, None, b"x" * 150),
        Record(1, 2, None, big[0]),
        Record(2, 2, None, big[1]),
        Record(3, 3, None, b"event"),
        Record(4, 4, None, b"plain"),
    ]
    with pytest.raises(ValueError, match="exactly one record"):
        log.append([b"a", b"b"], timestamp_us=5, extension=COMMIT)
    log.close()


def test_a_torn_marked_batch_is_wholly_absent(tmp_path: Path) -> None:
    log = Log.open(tmp_path, CONFIG)
    log.append([b"ok"], timestamp_us=1, extension=MARK)
    log.append([b"event"], timestamp_us=2, extension=COMMIT)
    log.close()
    path = segment_path(tmp_path, 0)
    path.write_bytes(path.read_bytes()[:-3])
    log = Log.open(tmp_path, CONFIG)
    assert log.next_offset == 1
    assert list(log.extensions()) == [(0, 1, MARK)]
    log.close()


# --- upgrading version 2 ------------------------------------------------------------


def _v2_header(base: int) -> bytes:
    head = b"FLXS" + struct.pack(">HHQ", 2, 0, base)
    return head + struct.pack(">I", crc32c(head))


def _v2_batch(base: int, timestamp: int, principal: bytes | None, payloads: list[bytes]) -> bytes:
    # The version-2 layout, packed by hand: a 30-byte head without an extension length.
    flags = 0 if principal is None else 1
    principal = principal or b""
    table = b"".join(struct.pack(">II", len(p), crc32c(p)) for p in payloads)
    length = 30 + len(principal) + len(table) + sum(map(len, payloads))
    covered = (
        struct.pack(">IQqIBB", length, base, timestamp, len(payloads), flags, len(principal))
        + principal
        + table
    )
    return struct.pack(">I", crc32c(covered)) + covered + b"".join(payloads)


def test_a_version_2_log_is_upgraded_in_place(tmp_path: Path) -> None:
    sealed = (
        _v2_header(0) + _v2_batch(0, 10, b"alice", [b"a", b"bb"]) + _v2_batch(2, 11, None, [b"c"])
    )
    active = _v2_header(3) + _v2_batch(3, 12, b"", [b"d"])
    segment_path(tmp_path, 0).write_bytes(sealed)
    segment_path(tmp_path, 3).write_bytes(active + b"\x07torn")  # a torn tail, cut on open
    (tmp_path / "00000000000000000000.idx").write_bytes(b"v2 index: rebuilt")
    log = Log.open(tmp_path, CONFIG)
    expected = [
        Record(0, 10, "alice", b"a"),
        Record(1, 10, "alice", b"bb"),
        Record(2, 11, None, b"c"),
        Record(3, 12, "", b"d"),
    ]
    assert log.read(0, max_records=10, max_bytes=100) == expected
    assert log.append([b"e"], timestamp_us=13) == 4
    log.close()
    assert segment_path(tmp_path, 0).read_bytes()[4:6] == b"\x00\x03"
    log = Log.open(tmp_path, CONFIG)  # a version-3 log now: opened as it is
    assert log.read(0, max_records=10, max_bytes=100) == [*expected, Record(4, 13, None, b"e")]
    log.close()


def test_a_damaged_version_2_batch_before_valid_data_is_corruption(tmp_path: Path) -> None:
    first = _v2_batch(0, 1, None, [b"a"])
    data = _v2_header(0) + first[:-1] + b"X" + _v2_batch(1, 2, None, [b"b"])
    segment_path(tmp_path, 0).write_bytes(data)
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert info.value.position == 20
    # Nothing was rewritten: the operator finds the file as it was.
    assert segment_path(tmp_path, 0).read_bytes() == data
