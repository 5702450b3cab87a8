"""On-disk layouts of segment and index files (described in docs/storage-format.md).

Everything is big-endian. A segment file is a 20-byte header followed by
record batches; an index file is a 20-byte header followed by 16-byte
entries. This module only packs and unpacks bytes; it opens no files.

A batch is what one append wrote: a head (first offset, time, record count,
publisher), a table with each record's payload length and checksum, then
the payloads. Per record that costs 8 bytes and two C calls (``len`` and a
CRC), with no per-record Python work on the append path: a 64-record batch
encodes about twice as fast as with a full header per record.

Checksums are CRC-32C (Castagnoli), through the ``crc32c`` package: it uses
the CPU's CRC instruction where there is one, about four times faster than
``zlib.crc32`` on 4 KiB records, and every appended byte goes through it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from felix_broker.storage.errors import (
    CorruptionError,
    PrincipalTooLongError,
    UnsupportedVersionError,
)

__all__ = [
    "BATCH_HEAD_SIZE",
    "FLAG_COMMIT",
    "FLAG_HAS_PRINCIPAL",
    "FLAG_PRODUCER_MARK",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "INDEX_MAGIC",
    "MAX_PAYLOAD_BYTES",
    "MAX_PRINCIPAL_BYTES",
    "PREVIOUS_VERSION",
    "RECORD_ENTRY_SIZE",
    "SEGMENT_MAGIC",
    "Batch",
    "BatchExtension",
    "BatchHead",
    "CommitMark",
    "IndexEntry",
    "ProducerMark",
    "Record",
    "StoredChange",
    "batch_size",
    "check_batch",
    "check_header",
    "check_payload",
    "decode_batch",
    "decode_extension",
    "encode_batch",
    "encode_extension",
    "encode_header",
    "encode_principal",
    "header_version",
    "index_path",
    "pack_index_entry",
    "parse_segment_name",
    "read_batch_head",
    "read_batch_table",
    "segment_path",
    "unpack_index_entries",
    "upgrade_segment",
]

# Version 1 stored a full header and a zlib CRC-32 with every record; no broker
# with it was ever released, so its files are refused like any unknown version.
# Version 2 had no extension area (producer marks, commits); its segments are
# upgraded in place on open (see upgrade_segment).
FORMAT_VERSION = 3
PREVIOUS_VERSION = 2
SEGMENT_MAGIC = b"FLXS"
INDEX_MAGIC = b"FLXI"

# Header: magic, version, reserved (0), base offset, CRC-32C of the 16 bytes before it.
_HEADER = struct.Struct(">4sHHQI")
HEADER_SIZE = _HEADER.size
_VERSION_AT = 4

# Batch head: crc, length, base offset, timestamp_us, count, flags, principal
# length, extension length; then the principal, the extension area, the record
# table and the payloads. ``length`` counts the whole batch, crc included. The
# CRC-32C covers every byte from after itself to the end of the record table
# (the extension area included), so a damaged length, count, payload length,
# producer mark or state change is caught; each payload has its own CRC-32C in
# the table.
_CRC = struct.Struct(">I")
_BATCH_HEAD = struct.Struct(">IIQqIBBI")
BATCH_HEAD_SIZE = _BATCH_HEAD.size
RECORD_ENTRY_SIZE = 8  # payload length u32, payload CRC-32C u32
FLAG_HAS_PRINCIPAL = 0x01
FLAG_PRODUCER_MARK = 0x02
FLAG_COMMIT = 0x04
_EXTENSION_FLAGS = FLAG_PRODUCER_MARK | FLAG_COMMIT
_KNOWN_FLAGS = FLAG_HAS_PRINCIPAL | _EXTENSION_FLAGS

# Extension area, in this order when its flag is set. Producer mark: producer
# id, sequence, payload digest (u64 each). Commit: entity key (u32 length +
# bytes), change count (u32), then per change an op byte, the key (u16 length +
# UTF-8) and, for a put, the value (u32 length + bytes).
_MARK = struct.Struct(">QQQ")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_OP_PUT = 1
_OP_DELETE = 2

MAX_PRINCIPAL_BYTES = 255
# Positions inside a segment are u32 in the index; with segments capped at
# 2 GiB (see LogConfig) and one record at most ~2 GiB, every position fits.
MAX_PAYLOAD_BYTES = 2**31 - BATCH_HEAD_SIZE - MAX_PRINCIPAL_BYTES - RECORD_ENTRY_SIZE - 1

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


@dataclass(frozen=True, slots=True)
class ProducerMark:
    """Which idempotent producer batch a stored batch is: id, sequence and payload digest."""

    producer_id: int
    sequence: int
    digest: int


@dataclass(frozen=True, slots=True)
class StoredChange:
    """One change of an entity's state: a put of ``value``, or a delete when it is None."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class CommitMark:
    """The state changes stored with a commit's event (a batch of exactly one record)."""

    entity_key: bytes
    changes: tuple[StoredChange, ...]


@dataclass(frozen=True, slots=True)
class BatchExtension:
    """What a batch carries besides its records (stored in its extension area)."""

    producer: ProducerMark | None = None
    commit: CommitMark | None = None


class BatchHead(NamedTuple):
    """The fixed-size head of a batch, as read from disk (not yet checksum-verified)."""

    crc: int
    length: int
    base_offset: int
    timestamp_us: int
    record_count: int
    flags: int
    principal_length: int
    extension_length: int = 0

    @property
    def table_end(self) -> int:
        """Bytes from the batch start to the end of its record table (what the CRC covers)."""
        return (
            BATCH_HEAD_SIZE
            + self.principal_length
            + self.extension_length
            + RECORD_ENTRY_SIZE * self.record_count
        )

    @property
    def end_offset(self) -> int:
        """The offset after the batch's last record."""
        return self.base_offset + self.record_count


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch whose head and record table passed their checksum."""

    head: BatchHead
    publisher: str | None
    lengths: tuple[int, ...]
    crcs: tuple[int, ...]
    extension: BatchExtension | None = None
    """What the extension area holds; None for a plain batch."""

    def payload_positions(self, position: int) -> Iterator[int]:
        """Where each payload starts, for a batch that starts at ``position``."""
        at = position + self.head.table_end
        for length in self.lengths:
            yield at
            at += length


class IndexEntry(NamedTuple):
    """One sparse index entry: a batch's first offset, byte position and append time."""

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


def header_version(data: bytes) -> int | None:
    """The format version a file header names, None when too short to name one."""
    if len(data) < _VERSION_AT + 2:
        return None
    version: int = _U16.unpack_from(data, _VERSION_AT)[0]
    return version


def check_header(
    path: Path, data: bytes, magic: bytes, base_offset: int, *, version: int = FORMAT_VERSION
) -> None:
    """Validate a file header; the version is checked before anything else can be trusted."""
    if len(data) < HEADER_SIZE:
        raise CorruptionError(path, len(data), "file shorter than its header")
    found_magic, found_version, _reserved, found_base, crc = _HEADER.unpack_from(data, 0)
    if found_magic != magic:
        raise CorruptionError(path, 0, f"bad magic {found_magic!r}, expected {magic!r}")
    if found_version != version:
        raise UnsupportedVersionError(path, found_version, version)
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


def batch_size(
    principal_length: int, count: int, payload_bytes: int, extension_length: int = 0
) -> int:
    """Bytes on disk of a batch of ``count`` records holding ``payload_bytes`` in all."""
    return (
        BATCH_HEAD_SIZE
        + principal_length
        + extension_length
        + RECORD_ENTRY_SIZE * count
        + payload_bytes
    )


def encode_extension(extension: BatchExtension) -> tuple[int, bytes]:
    """The flags and extension area bytes of ``extension``."""
    flags = 0
    pieces: list[bytes] = []
    if extension.producer is not None:
        mark = extension.producer
        flags |= FLAG_PRODUCER_MARK
        pieces.append(_MARK.pack(mark.producer_id, mark.sequence, mark.digest))
    if extension.commit is not None:
        commit = extension.commit
        flags |= FLAG_COMMIT
        pieces += [_U32.pack(len(commit.entity_key)), commit.entity_key]
        pieces.append(_U32.pack(len(commit.changes)))
        for change in commit.changes:
            key = change.key.encode("utf-8")
            if len(key) > 0xFFFF:
                raise ValueError(f"state key of {len(key)} bytes; at most 65535 allowed")
            if change.value is None:
                pieces += [bytes([_OP_DELETE]), _U16.pack(len(key)), key]
            else:
                pieces += [bytes([_OP_PUT]), _U16.pack(len(key)), key]
                pieces += [_U32.pack(len(change.value)), change.value]
    return flags, b"".join(pieces)


def decode_extension(flags: int, data: bytes) -> BatchExtension | None:
    """The extension stored in ``data`` under ``flags``; None when the bytes do not add up."""
    try:
        at = 0
        producer = None
        commit = None
        if flags & FLAG_PRODUCER_MARK:
            producer = ProducerMark(*_MARK.unpack_from(data, at))
            at += _MARK.size
        if flags & FLAG_COMMIT:
            (key_length,) = _U32.unpack_from(data, at)
            at += 4
            entity_key = data[at : at + key_length]
            if len(entity_key) != key_length:
                return None
            at += key_length
            (count,) = _U32.unpack_from(data, at)
            at += 4
            changes: list[StoredChange] = []
            for _ in range(count):
                op = data[at]
                (length,) = _U16.unpack_from(data, at + 1)
                at += 3
                key = data[at : at + length].decode("utf-8")
                at += length
                if op == _OP_DELETE:
                    changes.append(StoredChange(key, None))
                    continue
                if op != _OP_PUT:
                    return None
                (length,) = _U32.unpack_from(data, at)
                at += 4
                value = data[at : at + length]
                if len(value) != length:
                    return None
                at += length
                changes.append(StoredChange(key, value))
            commit = CommitMark(entity_key, tuple(changes))
    except (struct.error, IndexError, UnicodeDecodeError):
        return None
    if at != len(data):
        return None
    return BatchExtension(producer, commit)


def encode_batch(
    base_offset: int,
    timestamp_us: int,
    flags: int,
    principal: bytes,
    payloads: Sequence[bytes],
    extension: bytes = b"",
) -> list[bytes]:
    """The batch of records ``base_offset, base_offset + 1, ...`` as pieces to write in order.

    The hot path of every append. The payloads are not copied (the caller
    joins small batches and hands big ones to a vectored write), and the
    per-record work (length and CRC) runs inside ``map``, not in Python.
    """
    count = len(payloads)
    lengths = list(map(len, payloads))
    table = struct.pack(
        f">{2 * count}I", *chain.from_iterable(zip(lengths, map(crc32c, payloads), strict=True))
    )
    length = batch_size(len(principal), count, sum(lengths), len(extension))
    head = _BATCH_HEAD.pack(
        0, length, base_offset, timestamp_us, count, flags, len(principal), len(extension)
    )[_CRC.size :]
    covered = head + principal + extension + table
    return [_CRC.pack(crc32c(covered)), covered, *payloads]


def read_batch_head(data: bytes | memoryview, position: int, end: int) -> BatchHead | None:
    """The head at ``position`` if its fields are plausible for a batch ending by ``end``.

    Checks sizes and flags only; :func:`read_batch_table` checks the CRC.
    None means the bytes there are not a batch (torn, zeroed, garbage or damaged).
    """
    if end - position < BATCH_HEAD_SIZE:
        return None
    head = BatchHead._make(_BATCH_HEAD.unpack_from(data, position))
    if head.record_count < 1 or head.flags & ~_KNOWN_FLAGS:
        return None
    if not head.flags & FLAG_HAS_PRINCIPAL and head.principal_length:
        return None
    if bool(head.flags & _EXTENSION_FLAGS) != bool(head.extension_length):
        return None
    if head.flags & FLAG_COMMIT and head.record_count != 1:
        return None
    if not head.table_end <= head.length <= end - position:
        return None
    return head


def read_batch_table(data: bytes | memoryview, position: int, head: BatchHead) -> Batch | None:
    """The batch at ``position`` if its head and table pass their CRC and add up.

    ``data`` must hold the batch from ``position`` to ``position + head.table_end``.
    Payload checksums are left to the caller (see :func:`check_batch`).
    """
    table_end = position + head.table_end
    if crc32c(data[position + _CRC.size : table_end]) != head.crc:
        return None
    principal_at = position + BATCH_HEAD_SIZE
    extension_at = principal_at + head.principal_length
    table_at = extension_at + head.extension_length
    table = struct.unpack_from(f">{2 * head.record_count}I", data, table_at)
    lengths, crcs = table[0::2], table[1::2]
    if head.table_end + sum(lengths) != head.length:
        return None
    publisher = None
    if head.flags & FLAG_HAS_PRINCIPAL:
        try:
            publisher = bytes(data[principal_at:extension_at]).decode("utf-8")
        except UnicodeDecodeError:
            return None  # checksummed, yet not written by a log: a crafted file
    extension = None
    if head.extension_length:
        extension = decode_extension(head.flags, bytes(data[extension_at:table_at]))
        if extension is None:
            return None  # checksummed, yet not written by a log: a crafted file
    return Batch(head, publisher, lengths, crcs, extension)


def check_batch(data: bytes | memoryview, position: int, end: int) -> Batch | None:
    """The batch at ``position`` if it is whole and every checksum in it matches."""
    head = read_batch_head(data, position, end)
    if head is None:
        return None
    batch = read_batch_table(data, position, head)
    if batch is None:
        return None
    for at, length, crc in zip(
        batch.payload_positions(position), batch.lengths, batch.crcs, strict=True
    ):
        if not check_payload(data[at : at + length], crc):
            return None
    return batch


def check_payload(payload: bytes | memoryview, crc: int) -> bool:
    """Whether ``payload`` matches the CRC-32C its batch's record table holds for it."""
    return crc32c(payload) == crc


def decode_batch(data: bytes | memoryview, position: int, batch: Batch) -> list[Record]:
    """The records of the checked batch ``batch`` that starts at ``position`` in ``data``."""
    head = batch.head
    return [
        Record(offset, head.timestamp_us, batch.publisher, bytes(data[at : at + length]))
        for offset, at, length in zip(
            range(head.base_offset, head.end_offset),
            batch.payload_positions(position),
            batch.lengths,
            strict=True,
        )
    ]


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


# --- version 2 -> 3 -----------------------------------------------------------------

_V2_BATCH_HEAD = struct.Struct(">IIQqIBB")


def _v2_batch(data: bytes, position: int, end: int) -> tuple[int, bytes] | None:
    """The version-2 batch at ``position`` as (its length, the same batch in version 3)."""
    if end - position < _V2_BATCH_HEAD.size:
        return None
    crc, length, base, timestamp, count, flags, principal_length = _V2_BATCH_HEAD.unpack_from(
        data, position
    )
    if count < 1 or flags & ~FLAG_HAS_PRINCIPAL:
        return None
    if not flags & FLAG_HAS_PRINCIPAL and principal_length:
        return None
    table_end = _V2_BATCH_HEAD.size + principal_length + RECORD_ENTRY_SIZE * count
    if not table_end <= length <= end - position:
        return None
    if crc32c(data[position + _CRC.size : position + table_end]) != crc:
        return None
    table_at = position + _V2_BATCH_HEAD.size + principal_length
    table = struct.unpack_from(f">{2 * count}I", data, table_at)
    lengths, crcs = table[0::2], table[1::2]
    if table_end + sum(lengths) != length:
        return None
    at = position + table_end
    for payload_length, payload_crc in zip(lengths, crcs, strict=True):
        if crc32c(data[at : at + payload_length]) != payload_crc:
            return None
        at += payload_length
    principal = data[position + _V2_BATCH_HEAD.size : table_at]
    head = _BATCH_HEAD.pack(0, length + 4, base, timestamp, count, flags, principal_length, 0)
    covered = head[_CRC.size :] + principal + data[table_at : position + table_end]
    return length, _CRC.pack(crc32c(covered)) + covered + data[position + table_end : at]


def upgrade_segment(path: Path, data: bytes, base_offset: int) -> bytes:
    """A version-2 segment file's bytes, rewritten as version 3 (no record changes).

    Every valid batch is converted (version 3 adds the extension length to
    each head). Bytes after the first invalid batch are kept as they are, so
    that recovery judges them as it would have in version 2 (a torn tail of
    the active segment is cut); an invalid batch followed by a valid one is
    corruption here already, as the version-3 probe cannot recognise
    version-2 batches.
    """
    check_header(path, data, SEGMENT_MAGIC, base_offset, version=PREVIOUS_VERSION)
    pieces = [encode_header(SEGMENT_MAGIC, base_offset)]
    position = HEADER_SIZE
    end = len(data)
    while position < end:
        converted = _v2_batch(data, position, end)
        if converted is None:
            break
        length, batch = converted
        pieces.append(batch)
        position += length
    if position < end and data.count(0, position, end) != end - position:
        for probe in range(position + 1, end - _V2_BATCH_HEAD.size + 1):
            if _v2_batch(data, probe, end) is not None:
                raise CorruptionError(
                    path, position, f"invalid batch followed by a valid batch at byte {probe}"
                )
    pieces.append(data[position:])
    return b"".join(pieces)
