"""On-disk layouts of segment and index files (described in docs/storage-format.md).

Everything is big-endian. A segment file is a 20-byte header followed by
records; an index file is a 20-byte header followed by 16-byte entries. This
module only packs and unpacks bytes; it opens no files.

Checksums are CRC-32C (Castagnoli), through the ``crc32c`` package: it uses
the CPU's CRC instruction where there is one, about four times faster than
``zlib.crc32`` on 4 KiB records, and every appended byte goes through it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from felix_broker.storage.errors import (
    CorruptionError,
    PrincipalTooLongError,
    UnsupportedVersionError,
)

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "INDEX_MAGIC",
    "MAX_PAYLOAD_BYTES",
    "MAX_PRINCIPAL_BYTES",
    "RECORD_HEAD_SIZE",
    "SEGMENT_MAGIC",
    "IndexEntry",
    "Record",
    "RecordHead",
    "check_header",
    "check_record",
    "decode_record",
    "encode_header",
    "encode_principal",
    "encode_records",
    "index_path",
    "pack_index_entry",
    "parse_segment_name",
    "segment_path",
    "unpack_index_entries",
]

# Version 1 used zlib's CRC-32; no broker with it was ever released, so its
# files are refused like any other unknown version.
FORMAT_VERSION = 2
SEGMENT_MAGIC = b"FLXS"
INDEX_MAGIC = b"FLXI"

# Header: magic, version, reserved (0), base offset, CRC-32C of the 16 bytes before it.
_HEADER = struct.Struct(">4sHHQI")
HEADER_SIZE = _HEADER.size
_VERSION_AT = 4

# Record: crc, length, offset, timestamp_us, flags, principal length, then the
# principal and the payload. ``length`` counts the whole record, crc included;
# the CRC-32 covers every byte after itself, so a damaged length is caught too.
_CRC = struct.Struct(">I")
_BODY = struct.Struct(">IQqBB")
RECORD_HEAD_SIZE = _CRC.size + _BODY.size
_HEAD = struct.Struct(">IIQqBB")
FLAG_HAS_PRINCIPAL = 0x01
_KNOWN_FLAGS = FLAG_HAS_PRINCIPAL

MAX_PRINCIPAL_BYTES = 255
# Record positions inside a segment are u32 in the index; with segments capped
# at 2 GiB (see LogConfig) and one record at most ~2 GiB, every position fits.
MAX_PAYLOAD_BYTES = 2**31 - RECORD_HEAD_SIZE - MAX_PRINCIPAL_BYTES - 1

# Index entry: offset relative to the segment's base, byte position, timestamp_us.
_ENTRY = struct.Struct(">IIq")
INDEX_ENTRY_SIZE = _ENTRY.size

_SEGMENT_NAME = re.compile(r"(\d{20})\.log")


@dataclass(frozen=True, slots=True)
class Record:
    """One stored record: its offset, append time, publisher principal and payload."""

    offset: int
    timestamp_us: int
    publisher: str | None
    payload: bytes


class RecordHead(NamedTuple):
    """The fixed-size head of a record, as read from disk."""

    crc: int
    length: int
    offset: int
    timestamp_us: int
    flags: int
    principal_length: int


class IndexEntry(NamedTuple):
    """One sparse index entry: a record's offset, byte position and append time."""

    offset: int
    position: int
    timestamp_us: int


def segment_path(directory: Path, base_offset: int) -> Path:
    """The segment file whose first record has ``base_offset``."""
    return directory / f"{base_offset:020d}.log"


def index_path(directory: Path, base_offset: int) -> Path:
    """The index file beside the segment of ``base_offset``."""
    return directory / f"{base_offset:020d}.idx"


def parse_segment_name(name: str) -> int | None:
    """The base offset named by a segment file name, or None for any other file."""
    match = _SEGMENT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def encode_header(magic: bytes, base_offset: int) -> bytes:
    """A segment or index file header."""
    head = _HEADER.pack(magic, FORMAT_VERSION, 0, base_offset, 0)[:-4]
    return head + _CRC.pack(crc32c(head))


def check_header(path: Path, data: bytes, magic: bytes, base_offset: int) -> None:
    """Validate a file header; the version is checked before anything else can be trusted."""
    if len(data) < HEADER_SIZE:
        raise CorruptionError(path, len(data), "file shorter than its header")
    found_magic, version, _reserved, found_base, crc = _HEADER.unpack_from(data, 0)
    if found_magic != magic:
        raise CorruptionError(path, 0, f"bad magic {found_magic!r}, expected {magic!r}")
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(path, version, FORMAT_VERSION)
    if crc32c(data[: HEADER_SIZE - 4]) != crc:
        raise CorruptionError(path, 0, "header checksum mismatch")
    if found_base != base_offset:
        raise CorruptionError(
            path, _VERSION_AT + 4, f"header names base offset {found_base}, file name {base_offset}"
        )


def encode_principal(publisher: str | None) -> tuple[int, bytes]:
    """The flags and bytes stored for a publisher principal; refuses more than 255 bytes."""
    if publisher is None:
        return 0, b""
    raw = publisher.encode("utf-8")
    if len(raw) > MAX_PRINCIPAL_BYTES:
        raise PrincipalTooLongError(len(raw))
    return FLAG_HAS_PRINCIPAL, raw


def encode_records(
    first_offset: int,
    timestamp_us: int,
    flags: int,
    principal: bytes,
    payloads: Sequence[bytes],
) -> list[bytes]:
    """Records ``first_offset, first_offset + 1, ...`` as pieces to write back to back.

    The hot path of every append: per record one pack, two checksum calls and
    no copy of the payload (the caller joins small batches and hands big ones
    to a vectored write).
    """
    overhead = RECORD_HEAD_SIZE + len(principal)
    principal_length = len(principal)
    pack_body = _BODY.pack
    pack_crc = _CRC.pack
    checksum = crc32c
    pieces: list[bytes] = []
    for offset, payload in enumerate(payloads, first_offset):
        body = pack_body(overhead + len(payload), offset, timestamp_us, flags, principal_length)
        if principal_length:
            body += principal
        pieces += (pack_crc(checksum(payload, checksum(body))), body, payload)
    return pieces


def check_record(data: bytes | memoryview, position: int, end: int) -> RecordHead | None:
    """The head of the record at ``position`` if a whole, checksum-valid record is there.

    None means the bytes there are not a record (torn, zeroed, garbage or
    damaged); the caller decides whether that is a repairable tail.
    """
    if end - position < RECORD_HEAD_SIZE:
        return None
    head = RecordHead._make(_HEAD.unpack_from(data, position))
    length = head.length
    if length < RECORD_HEAD_SIZE + head.principal_length or length > end - position:
        return None
    if head.flags & ~_KNOWN_FLAGS:
        return None
    if not head.flags & FLAG_HAS_PRINCIPAL and head.principal_length:
        return None
    if crc32c(data[position + 4 : position + length]) != head.crc:
        return None
    return head


def decode_record(data: bytes | memoryview, position: int, head: RecordHead) -> Record:
    """The record whose validated head ``head`` sits at ``position`` in ``data``."""
    start = position + RECORD_HEAD_SIZE
    principal_end = start + head.principal_length
    publisher = (
        bytes(data[start:principal_end]).decode("utf-8")
        if head.flags & FLAG_HAS_PRINCIPAL
        else None
    )
    payload = bytes(data[principal_end : position + head.length])
    return Record(head.offset, head.timestamp_us, publisher, payload)


def pack_index_entry(entry: IndexEntry, base_offset: int) -> bytes:
    """One index entry as stored."""
    return _ENTRY.pack(entry.offset - base_offset, entry.position, entry.timestamp_us)


def unpack_index_entries(data: bytes, base_offset: int) -> list[IndexEntry] | None:
    """The entries after an index header, or None when the entry area is ragged."""
    area = len(data) - HEADER_SIZE
    if area % INDEX_ENTRY_SIZE:
        return None
    return [
        IndexEntry(base_offset + relative, position, timestamp)
        for relative, position, timestamp in _ENTRY.iter_unpack(data[HEADER_SIZE:])
    ]
