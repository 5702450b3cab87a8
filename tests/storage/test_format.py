"""Byte layouts: headers, records, index entries, names."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from felix_broker.storage.errors import (
    CorruptionError,
    PrincipalTooLongError,
    UnsupportedVersionError,
)
from felix_broker.storage.format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    RECORD_HEAD_SIZE,
    SEGMENT_MAGIC,
    IndexEntry,
    Record,
    check_header,
    check_record,
    decode_record,
    encode_header,
    encode_principal,
    encode_records,
    pack_index_entry,
    parse_segment_name,
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
    assert FORMAT_VERSION == 2
    assert crc32c(b"123456789") == 0xE3069283
    head = b"FLXS" + struct.pack(">HHQ", 2, 0, 5)
    assert encode_header(SEGMENT_MAGIC, 5) == head + struct.pack(">I", crc32c(head))
    body = struct.pack(">IQqBB", 26 + 1 + 2, 5, 77, 1, 1) + b"p" + b"hi"
    record = struct.pack(">I", crc32c(body)) + body
    assert b"".join(encode_records(5, 77, 1, b"p", [b"hi"])) == record


def test_header_checks_magic_checksum_and_base() -> None:
    header = encode_header(SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), b"XXXX" + header[4:], SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), header[:-1] + bytes([header[-1] ^ 1]), SEGMENT_MAGIC, 7)
    with pytest.raises(CorruptionError):
        check_header(Path("x"), header, SEGMENT_MAGIC, 8)


@pytest.mark.parametrize("publisher", [None, "", "alice", "é" * 127])
def test_record_round_trip(publisher: str | None) -> None:
    flags, principal = encode_principal(publisher)
    payload = b"payload bytes"
    data = b"".join(encode_records(42, 1_700_000_000_000_000, flags, principal, [payload]))
    head = check_record(data, 0, len(data))
    assert head is not None
    assert head.length == len(data) == RECORD_HEAD_SIZE + len(principal) + len(payload)
    assert decode_record(data, 0, head) == Record(42, 1_700_000_000_000_000, publisher, payload)


def test_record_damage_is_detected_anywhere() -> None:
    data = b"".join(encode_records(1, 2, 0, b"", [b"abc"]))
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        assert check_record(bytes(damaged), 0, len(damaged)) is None, i
    assert check_record(bytes(len(data)), 0, len(data)) is None
    assert check_record(data, 0, len(data) - 1) is None


def test_records_of_a_batch_follow_each_other() -> None:
    data = b"".join(encode_records(7, 9, 0, b"", [b"a", b"", b"ccc"]))
    position = 0
    offsets = []
    while position < len(data):
        head = check_record(data, position, len(data))
        assert head is not None
        offsets.append(decode_record(data, position, head).offset)
        position += head.length
    assert offsets == [7, 8, 9]


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
