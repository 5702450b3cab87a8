"""Opening damaged logs: torn tails are repaired, damage elsewhere is refused precisely."""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felix_broker.storage import (
    CorruptionError,
    FsyncMode,
    Log,
    LogConfig,
    Record,
    UnsupportedVersionError,
)
from felix_broker.storage.format import BATCH_HEAD_SIZE, HEADER_SIZE, RECORD_ENTRY_SIZE

PAYLOAD = 50
RECORD = BATCH_HEAD_SIZE + RECORD_ENTRY_SIZE + PAYLOAD  # each append here is a batch of one
HEADER = HEADER_SIZE
# Room for exactly 53 such records per segment.
CONFIG = LogConfig(
    segment_bytes=HEADER + 53 * RECORD + 10, index_interval_bytes=128, fsync_mode=FsyncMode.NONE
)


def position(index_in_segment: int) -> int:
    return HEADER + index_in_segment * RECORD


def make_log(directory: Path, records: int) -> list[Path]:
    """A log of ``records`` 50-byte records in 53-record segments; returns segment paths."""
    log = Log.open(directory, CONFIG)
    for i in range(records):
        log.append([bytes([i % 256]) * PAYLOAD], timestamp_us=i)
    log.close()
    return sorted(directory.glob("*.log"))


def offsets(log: Log) -> list[int]:
    return [r.offset for r in log.read(log.start_offset, max_records=10**6, max_bytes=1 << 40)]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def truncate_mid_record(path: Path) -> None:
    os.truncate(path, position(7) + 30)


def append_garbage(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\x13\x37 not a record, just junk \xff" * 9)


def append_zeros(path: Path) -> None:
    with path.open("ab") as f:
        f.write(bytes(8192))


def zero_last_records(path: Path) -> None:
    # Like a crash after the size grew but before the data blocks were written.
    data = bytearray(path.read_bytes())
    data[position(7) :] = bytes(len(data) - position(7))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "kept"),
    [
        (truncate_mid_record, 7),
        (append_garbage, 10),
        (append_zeros, 10),
        (zero_last_records, 7),
    ],
)
def test_torn_tail_is_cut_and_the_rest_kept(
    tmp_path: Path, damage: Callable[[Path], None], kept: int
) -> None:
    (active,) = make_log(tmp_path, 10)
    damage(active)
    log = Log.open(tmp_path, CONFIG)
    assert offsets(log) == list(range(kept))
    assert active.stat().st_size == position(kept)
    assert log.append([b"new"], timestamp_us=100) == kept
    log.close()
    log = Log.open(tmp_path, CONFIG)
    last = log.read(kept, max_records=10, max_bytes=100)
    assert last == [Record(kept, 100, None, b"new")]
    log.close()


def test_torn_tail_of_the_active_segment_after_sealed_ones(tmp_path: Path) -> None:
    paths = make_log(tmp_path, 60)
    assert len(paths) == 2
    os.truncate(paths[-1], position(3) + 1)
    log = Log.open(tmp_path, CONFIG)
    assert log.next_offset == 53 + 3
    log.close()


def test_bad_checksum_followed_by_valid_data_is_refused(tmp_path: Path) -> None:
    (active,) = make_log(tmp_path, 10)
    flip(active, position(2) + 30)
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert info.value.path == active
    assert info.value.position == position(2)
    assert str(active) in str(info.value) and str(position(2)) in str(info.value)


def test_damaged_length_followed_by_valid_data_is_refused(tmp_path: Path) -> None:
    (active,) = make_log(tmp_path, 10)
    flip(active, position(0) + 6)
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert (info.value.path, info.value.position) == (active, position(0))


@pytest.mark.parametrize("record", [0, 20, 52])
def test_any_bad_record_in_a_sealed_segment_is_refused(tmp_path: Path, record: int) -> None:
    paths = make_log(tmp_path, 60)
    flip(paths[0], position(record) + 40)
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert (info.value.path, info.value.position) == (paths[0], position(record))


def test_truncated_sealed_segment_is_refused(tmp_path: Path) -> None:
    paths = make_log(tmp_path, 60)
    os.truncate(paths[0], position(52) + 10)
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert (info.value.path, info.value.position) == (paths[0], position(52))


def test_missing_middle_segment_is_refused(tmp_path: Path) -> None:
    paths = make_log(tmp_path, 120)
    assert len(paths) == 3
    paths[1].unlink()
    with pytest.raises(CorruptionError) as info:
        Log.open(tmp_path, CONFIG)
    assert info.value.path == paths[2]


@pytest.mark.parametrize("suffix", [".log", ".idx"])
def test_unknown_version_is_refused_naming_the_file(tmp_path: Path, suffix: str) -> None:
    make_log(tmp_path, 60)
    target = sorted(tmp_path.glob(f"*{suffix}"))[0]
    data = bytearray(target.read_bytes())
    struct.pack_into(">H", data, 4, 9)
    target.write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersionError) as info:
        Log.open(tmp_path, CONFIG)
    assert info.value.path == target
    assert info.value.version == 9
    assert str(target) in str(info.value)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.unlink(),
        lambda p: os.truncate(p, 27),
        lambda p: p.write_bytes(p.read_bytes()[:20] + b"\xff" * 16),
        lambda p: p.write_bytes(b"junk"),
    ],
)
def test_indexes_that_do_not_match_are_rebuilt(
    tmp_path: Path, damage: Callable[[Path], object]
) -> None:
    make_log(tmp_path, 120)
    indexes = sorted(tmp_path.glob("*.idx"))
    originals = [p.read_bytes() for p in indexes]
    for path in indexes:
        damage(path)
    log = Log.open(tmp_path, CONFIG)
    assert [p.read_bytes() for p in indexes] == originals
    assert offsets(log) == list(range(120))
    assert log.offset_for_time(77) == 77
    log.close()


def test_torn_header_of_a_new_active_segment_is_rewritten(tmp_path: Path) -> None:
    make_log(tmp_path, 60)
    newest = tmp_path / f"{60:020d}.log"
    newest.write_bytes(b"FLX")  # a roll that crashed mid-header
    log = Log.open(tmp_path, CONFIG)
    assert log.next_offset == 60
    assert log.append([b"x"], timestamp_us=1000) == 60
    log.close()


def test_leftover_files_are_cleaned_up(tmp_path: Path) -> None:
    make_log(tmp_path, 10)
    (tmp_path / f"{0:020d}.idx.tmp").write_bytes(b"half")
    orphan = tmp_path / f"{5:020d}.idx"
    orphan.write_bytes(b"orphan")
    Log.open(tmp_path, CONFIG).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{0:020d}.idx", f"{0:020d}.log"]


def test_damage_after_open_is_reported_by_reads(tmp_path: Path) -> None:
    paths = make_log(tmp_path, 60)
    log = Log.open(tmp_path, CONFIG)
    flip(paths[0], position(5) + 40)
    with pytest.raises(CorruptionError) as info:
        log.read(0, max_records=100, max_bytes=1 << 20)
    assert (info.value.path, info.value.position) == (paths[0], position(5))
    log.close()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 120), min_size=1, max_size=8),
    at=st.integers(0, 10_000),
    junk=st.binary(min_size=1, max_size=64),
)
def test_any_overwrite_of_the_active_segment_is_repaired_or_refused(
    sizes: list[int], at: int, junk: bytes
) -> None:
    # Whatever the damage, opening either keeps an intact prefix of the records
    # or refuses with a CorruptionError: it never returns altered records.
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        log = Log.open(directory, CONFIG)
        written: list[bytes] = []
        for i, size in enumerate(sizes):
            batch = [bytes([i, j]) * size for j in range(1 + i % 3)]
            log.append(batch, timestamp_us=i)
            written += batch
        log.close()
        active = max(directory.glob("*.log"))
        data = bytearray(active.read_bytes())
        where = HEADER + at % (len(data) - HEADER)
        data[where : where + len(junk)] = junk
        active.write_bytes(bytes(data))
        try:
            log = Log.open(directory, CONFIG)
        except CorruptionError as error:
            assert error.path == active
            return
        kept = [record.payload for record in log.read(0, max_records=10**6, max_bytes=1 << 40)]
        log.close()
        assert kept == written[: len(kept)]
