"""Byte layouts: headers, records, index entries, names."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.storage.errors import (
    CorruptionError,
    PrincipalTooLongError,
    UnsupportedVersionError,
)
from felix_broker.storage.format import (
    BATCH_HEAD_SIZE,
    FORMAT_VERSION,
    HEADER_SIZE,
    RECORD_ENTRY_SIZE,
    SEGMENT_MAGIC,
    IndexEntry,
    Record,
    batch_size,
    check_batch,
    check_header,
    check_payload,
    decode_batch,
    encode_batch,
    encode_header,
    encode_principal,
    pack_index_entry,
    parse_segment_name,
    read_batch_head,
    read_batch_table,
    segment_path,
    unpack_index_entries,
)


def test_header_round_trip() -> None:
    header = encode_header(SEGMENT_MAGIC, 1234)
    assert len(header) == HEADER_SIZE == 20
    check_header(Path("x.log"), header, SEGMENT_MAGIC, 1234)


@pytest.mark.parametrize("version", [1, FORMAT_VERSION + 1])
def test_header_with_unknown_version_names_the_file(version: int) -> None:
    # Version 1 (zlib CRC-32) was never released: it is as unknown as a newer one.
    header = bytearray(encode_header(SEGMENT_MAGIC, 0))
    struct.pack_into(">H", header, 4, version)
    with pytest.raises(UnsupportedVersionError) as info:
        check_header(Path("a/b.log"), bytes(header), SEGMENT_MAGIC, 0)
    assert info.value.version == version
    assert "a/b.log" in str(info.value)


def test_bytes_match_the_documented_layout_with_crc32c() -> None:
    # Packed by hand from docs/storage-format.md, so a change of layout or of
    # checksum algorithm (CRC-32C, check value 0xE3069283) cannot go unnoticed.
    assert FORMAT_VERSION == 3
    assert crc32c(b"123456789") == 0xE3069283
    head = b"FLXS" + struct.pack(">HHQ", 3, 0, 5)
    assert encode_header(SEGMENT_MAGIC, 5) == head + struct.pack(">I", crc32c(head))
    length = 34 + 1 + 2 * 8 + 2 + 3
    covered = (
        struct.pack(">IQqIBBI", length, 5, 77, 2, 1, 1, 0)
        + b"p"
        + struct.pack(">IIII", 2, crc32c(b"hi"), 3, crc32c(b"abc"))
    )
    batch = struct.pack(">I", crc32c(covered)) + covered + b"hi" + b"abc"
    assert b"".join(encode_batch(5, 77, 1, b"p", [b"hi", b"abc"])) == batch
    assert batch_size(1, 2, 5) == len(batch) == length
    assert (BATCH_HEAD_SIZE, RECORD_ENTRY_SIZE) == (34, 8)


def test_header_checks_magic_checksum_and_base() -> None:
    header = encode_header(SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), b"XXXX" + header[4:], SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), header[:-1] + bytes([header[-1] ^ 1]), SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), header, SEGMENT_MAGIC, 8)


@pytest.mark.parametrize("publisher", [None, "", "alice", "é" * 127])
def test_batch_round_trip(publisher: str | None) -> None:
    flags, principal = encode_principal(publisher)
    payloads = [b"payload bytes", b"", b"x" * 5000]
    data = b"".join(encode_batch(42, 1_700_000_000_000_000, flags, principal, payloads))
    batch = check_batch(data, 0, len(data))
    assert batch is not None
    assert batch.head.length == len(data) == batch_size(len(principal), 3, 5013)
    assert (batch.head.base_offset, batch.head.end_offset) == (42, 45)
    assert decode_batch(data, 0, batch) == [
        Record(42 + i, 1_700_000_000_000_000, publisher, payload)
        for i, payload in enumerate(payloads)
    ]


def test_batch_damage_is_detected_anywhere() -> None:
    data = b"".join(encode_batch(1, 2, 1, b"pub", [b"abc", b"", b"defg"]))
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        assert check_batch(bytes(damaged), 0, len(damaged)) is None, i
    assert check_batch(bytes(len(data)), 0, len(data)) is None
    assert check_batch(data, 0, len(data) - 1) is None


def test_a_damaged_payload_passes_the_head_but_not_its_own_checksum() -> None:
    # Readers check the head and table first, then each payload as they return it.
    data = bytearray(b"".join(encode_batch(0, 0, 0, b"", [b"first", b"second"])))
    data[-1] ^= 1
    head = read_batch_head(data, 0, len(data))
    assert head is not None
    batch = read_batch_table(bytes(data), 0, head)
    assert batch is not None
    first, second = batch.payload_positions(0)
    assert check_payload(bytes(data[first : first + 5]), batch.crcs[0])
    assert not check_payload(bytes(data[second : second + 6]), batch.crcs[1])


def test_batches_follow_each_other() -> None:
    data = b"".join(
        encode_batch(7, 9, 0, b"", [b"a", b"", b"ccc"]) + encode_batch(10, 9, 0, b"", [b"d"])
    )
    position = 0
    offsets = []
    while position < len(data):
        batch = check_batch(data, position, len(data))
        assert batch is not None
        offsets += [record.offset for record in decode_batch(data, position, batch)]
        position += batch.head.length
    assert offsets == [7, 8, 9, 10]


def test_principal_limit_is_255_utf8_bytes() -> None:
    assert encode_principal("x" * 255)[1] == b"x" * 255
    with pytest.raises(PrincipalTooLongError) as info:
        encode_principal("é" * 128)
    assert info.value.length == 256


def test_index_entries_and_names() -> None:
    entries = [IndexEntry(100, 20, 5), IndexEntry(103, 4200, 9)]
    data = encode_header(b"FLXI", 100) + b"".join(pack_index_entry(e, 100) for e in entries)
    assert unpack_index_entries(data, 100) == entries
    assert unpack_index_entries(data + b"\0", 100) is None
    path = segment_path(Path("d"), 100)
    assert path.name == "00000000000000000100.log"
    assert parse_segment_name(path.name) == 100
    assert parse_segment_name("100.log") is None


@given(st.binary(max_size=300), st.integers(0, 300))
def test_check_batch_on_any_bytes_returns_a_fitting_batch_or_none(data: bytes, at: int) -> None:
    position = min(at, len(data))
    batch = check_batch(data, position, len(data))
    if batch is not None:
        assert position + batch.head.length <= len(data)
        assert len(decode_batch(data, position, batch)) == batch.head.record_count


@given(
    base=st.integers(0, 2**63 - 2**20),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    publisher=st.none() | st.text(max_size=40),
    payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=20),
    damage=st.data(),
)
def test_any_batch_round_trips_and_any_flipped_bit_is_caught(
    base: int, timestamp: int, publisher: str | None, payloads: list[bytes], damage: st.DataObject
) -> None:
    flags, principal = encode_principal(publisher)
    data = b"".join(encode_batch(base, timestamp, flags, principal, payloads))
    batch = check_batch(data, 0, len(data))
    assert batch is not None
    assert decode_batch(data, 0, batch) == [
        Record(base + i, timestamp, publisher, payload) for i, payload in enumerate(payloads)
    ]
    at = damage.draw(st.integers(0, len(data) - 1), label="byte")
    bit = damage.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(data)
    damaged[at] ^= 1 << bit
    assert check_batch(bytes(damaged), 0, len(damaged)) is None
    cut = damage.draw(st.integers(0, len(data) - 1), label="cut")
    assert check_batch(data[:cut], 0, cut) is None


def test_a_checksummed_batch_with_a_non_utf8_principal_is_not_a_batch() -> None:
    data = b"".join(encode_batch(0, 0, 1, b"\xff\xfe", [b"x"]))
    assert check_batch(data, 0, len(data)) is None
