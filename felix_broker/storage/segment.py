"""One segment file of record batches with its sparse index: create, recover, append, read.

A segment knows nothing about fsync policy or retention; the log decides when
to roll, sync and delete. Only the last (active) segment of a log holds open
write descriptors; sealed segments are opened read-only for the length of a read.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from pathlib import Path

from felix_broker.storage.errors import CorruptionError
from felix_broker.storage.format import (
    BATCH_HEAD_SIZE,
    HEADER_SIZE,
    INDEX_MAGIC,
    PREVIOUS_VERSION,
    SEGMENT_MAGIC,
    Batch,
    BatchExtension,
    BatchHead,
    IndexEntry,
    Record,
    check_batch,
    check_header,
    check_payload,
    encode_batch,
    encode_header,
    header_version,
    index_path,
    pack_index_entry,
    read_batch_head,
    read_batch_table,
    segment_path,
    unpack_index_entries,
    upgrade_segment,
)

__all__ = ["Segment"]

_log = logging.getLogger(__name__)

# Reads go through the page cache in chunks this big; a longer record is read whole.
_READ_CHUNK = 256 * 1024
# Verified batch tables kept per segment, counted in records: a read that lands
# inside a batch read recently goes straight to its record.
_TABLE_CACHE_RECORDS = 4096


# Most systems accept 1024 buffers per vectored write.
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 16


def _write_at(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], position + written)


# Below this many bytes a batch is joined and written with one pwrite: for
# small records copying costs less than the kernel's per-buffer work in a
# vectored write (64 x 100 B: 9.5 against 12 us), for 4 KiB records the copy
# costs more than it saves (115 against 101 us); 64 x 1 KiB is a draw.
_JOIN_BELOW = 64 * 1024


def _write_pieces(fd: int, pieces: list[bytes], position: int, size: int) -> None:
    if size < _JOIN_BELOW:
        _write_at(fd, b"".join(pieces), position)
        return
    # A vectored write hands big payloads to the kernel without first copying
    # them into one buffer; a short write (rare on files) finishes the slow way.
    for start in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[start : start + _IOV_MAX]
        size = sum(len(piece) for piece in chunk)
        written = os.pwritev(fd, chunk, position)
        if written < size:
            _write_at(fd, b"".join(chunk)[written:], position + written)
        position += size


def _find_valid_batch(data: bytes, start: int, end: int) -> int | None:
    """The position of the first checksum-valid batch in ``data[start:end]``, if any.

    Used only after a bad batch in the active segment, to tell a torn tail
    (nothing valid after the damage) from damage in the middle of the log.
    Slow (a probe per byte: about 1 s per MiB of non-zero garbage on the bench
    VM; zeros are skipped at once), but it only runs on damaged files.
    """
    if data.count(0, start, end) == end - start:
        return None
    view = memoryview(data)
    for position in range(start, end - BATCH_HEAD_SIZE + 1):
        # check_batch rejects an implausible head before it computes any CRC.
        if check_batch(view, position, end) is not None:
            return position
    return None


class _Reader:
    """Positional reads of one segment through a window, so a scan costs one pread per chunk."""

    def __init__(self, path: Path, fd: int, end: int) -> None:
        self._path = path
        self._fd = fd
        self._end = end
        self._window = memoryview(b"")
        self._window_at = 0

    def view(self, position: int, size: int, *, ahead: bool = True) -> memoryview:
        """Bytes ``[position, position + size)``; a part longer than a chunk is read whole.
        With ``ahead`` False a miss reads just these bytes (the caller needs no more)."""
        start = position - self._window_at
        if start < 0 or start + size > len(self._window):
            want = max(size, min(_READ_CHUNK, self._end - position)) if ahead else size
            self._window = memoryview(os.pread(self._fd, want, position))
            self._window_at, start = position, 0
            if len(self._window) < size:
                raise CorruptionError(self._path, position, "segment shorter than recorded")
        return self._window[start : start + size]


class Segment:
    """A segment file of records with offsets ``[base_offset, end_offset)``."""

    def __init__(self, directory: Path, base_offset: int, index_interval: int) -> None:
        self.base_offset = base_offset
        self.path = segment_path(directory, base_offset)
        self.index_path = index_path(directory, base_offset)
        self.size = HEADER_SIZE
        self.count = 0
        self.first_timestamp_us = 0
        self.last_timestamp_us = 0
        # Write descriptor, open only while this is the active segment.
        self.fd: int | None = None
        self._index_interval = index_interval
        self._next_entry_at = HEADER_SIZE
        # Sparse index kept in compact arrays: a 64 MiB segment at the default
        # 4 KiB interval costs about 400 KB of memory.
        self._entry_offsets = array("q")
        self._entry_positions = array("q")
        self._entry_times = array("q")
        # position -> (verified batch, where each payload starts), least recent first;
        # at most _TABLE_CACHE_RECORDS records' worth. Written batches never change.
        # Reads run on the loop and on worker threads (Log.aread): the lock guards it.
        self._tables: OrderedDict[int, tuple[Batch, tuple[int, ...]]] = OrderedDict()
        self._tables_records = 0
        self._tables_lock = threading.Lock()

    @property
    def end_offset(self) -> int:
        """The offset after this segment's last record."""
        return self.base_offset + self.count

    # --- opening ---------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval: int) -> Segment:
        """A new, empty, active segment (files created, header written)."""
        segment = cls(directory, base_offset, index_interval)
        fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_at(fd, encode_header(SEGMENT_MAGIC, base_offset), 0)
            segment._write_index(segment._index_bytes())
        except BaseException:
            os.close(fd)
            raise
        segment.fd = fd
        return segment

    @classmethod
    def recover(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval: int,
        active: bool,
        sync_file: Callable[[int], None] | None,
    ) -> Segment:
        """Scan a segment file, repairing a torn tail if it is the active one.

        Every record's checksum is verified. In a sealed segment any bad record
        is corruption. In the active segment a bad record with nothing valid
        after it is a torn or zero-filled tail from a crash and is cut off; a
        bad record followed by a valid one is corruption. ``sync_file`` (None
        for fsync mode ``none``) makes a repair durable. The index file is
        rewritten when it does not match what the scan found.
        """
        segment = cls(directory, base_offset, index_interval)
        path = segment.path
        data = path.read_bytes()
        if len(data) >= HEADER_SIZE and header_version(data) == PREVIOUS_VERSION:
            data = segment._upgrade(data, sync_file)
        if len(data) < HEADER_SIZE and active:
            # A roll that crashed before the header reached the disk.
            _log.warning("%s: rewriting a torn segment header (%d bytes)", path, len(data))
            data = encode_header(SEGMENT_MAGIC, base_offset)
            segment._rewrite(data, sync_file)
        check_header(path, data, SEGMENT_MAGIC, base_offset)
        end = len(data)
        position = segment._scan(data, end)
        if position < end:
            if not active:
                raise CorruptionError(path, position, "invalid batch in a sealed segment")
            valid_at = _find_valid_batch(data, position + 1, end)
            if valid_at is not None:
                raise CorruptionError(
                    path, position, f"invalid batch followed by a valid batch at byte {valid_at}"
                )
            _log.warning(
                "%s: cutting a torn tail of %d bytes at byte %d", path, end - position, position
            )
            os.truncate(path, position)
            if sync_file is not None:
                segment._sync_path(sync_file)
        segment._check_index()
        if active:
            segment.fd = os.open(path, os.O_RDWR)
        return segment

    def _scan(self, data: bytes, end: int) -> int:
        """Account every valid batch from the header on; returns where valid data stops."""
        view = memoryview(data)
        position = HEADER_SIZE
        while position < end:
            batch = check_batch(view, position, end)
            if batch is None or batch.head.base_offset != self.end_offset:
                break
            if self.count and batch.head.timestamp_us < self.last_timestamp_us:
                break
            self._account(position, batch.head)
            position += batch.head.length
        return position

    def _account(self, position: int, head: BatchHead) -> None:
        # Index entries point at batches (a batch is read from its start), at
        # most one per batch and at least index_interval bytes apart.
        if position >= self._next_entry_at:
            self._entry_offsets.append(head.base_offset)
            self._entry_positions.append(position)
            self._entry_times.append(head.timestamp_us)
            self._next_entry_at = position + self._index_interval
        if not self.count:
            self.first_timestamp_us = head.timestamp_us
        self.last_timestamp_us = head.timestamp_us
        self.count += head.record_count
        self.size = position + head.length

    def _entries(self) -> list[IndexEntry]:
        return [
            IndexEntry(offset, position, timestamp)
            for offset, position, timestamp in zip(
                self._entry_offsets, self._entry_positions, self._entry_times, strict=True
            )
        ]

    def _index_bytes(self) -> bytes:
        entries = b"".join(pack_index_entry(e, self.base_offset) for e in self._entries())
        return encode_header(INDEX_MAGIC, self.base_offset) + entries

    def _check_index(self) -> None:
        expected = self._index_bytes()
        try:
            found: bytes | None = self.index_path.read_bytes()
        except FileNotFoundError:
            found = None
        if found is not None:
            try:
                check_header(self.index_path, found, INDEX_MAGIC, self.base_offset)
            except CorruptionError:
                pass  # an index is derived data: a damaged one is rebuilt below
            else:
                if unpack_index_entries(found, self.base_offset) == self._entries():
                    return
        _log.info("%s: rebuilding the index from the segment", self.index_path)
        self._write_index(expected)

    def _write_index(self, data: bytes) -> None:
        # Written beside and renamed, so a crash leaves the old or the new index.
        tmp = self.index_path.with_name(self.index_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_at(fd, data, 0)
        finally:
            os.close(fd)
        os.replace(tmp, self.index_path)

    def _upgrade(self, data: bytes, sync_file: Callable[[int], None] | None) -> bytes:
        # Written beside and renamed, so a crash leaves the old file or the new
        # one; the index (derived data, with the old version in its header) goes.
        upgraded = upgrade_segment(self.path, data, self.base_offset)
        tmp = self.path.with_name(self.path.name + ".upgrade")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_at(fd, upgraded, 0)
            if sync_file is not None:
                sync_file(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self.index_path.unlink(missing_ok=True)
        _log.info("%s: upgraded from storage format version %d", self.path, PREVIOUS_VERSION)
        return upgraded

    def _rewrite(self, data: bytes, sync_file: Callable[[int], None] | None) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_at(fd, data, 0)
            if sync_file is not None:
                sync_file(fd)
        finally:
            os.close(fd)

    def _sync_path(self, sync_file: Callable[[int], None]) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            sync_file(fd)
        finally:
            os.close(fd)

    # --- writing ---------------------------------------------------------------------

    def append(
        self,
        first_offset: int,
        timestamp_us: int,
        flags: int,
        principal: bytes,
        payloads: Sequence[bytes],
        extension: bytes = b"",
    ) -> None:
        """Write records ``first_offset, first_offset + 1, ...`` as one batch, with one write.

        ``flags`` include those of ``extension`` (see ``format.encode_extension``).
        """
        if self.fd is None:
            raise RuntimeError(f"{self.path} is not the active segment")
        pieces = encode_batch(first_offset, timestamp_us, flags, principal, payloads, extension)
        position = self.size
        length = sum(map(len, pieces))
        _write_pieces(self.fd, pieces, position, length)
        # The index entry, if any, reaches the index file when the segment is
        # sealed or closed: the index is derived data, and the active
        # segment's is rebuilt after a crash anyway, so one write per append
        # (and no second file growing under every fsync) is enough.
        self._account(
            position,
            BatchHead(
                0,
                length,
                first_offset,
                timestamp_us,
                len(payloads),
                flags,
                len(principal),
                len(extension),
            ),
        )

    def append_many(self, batches: Sequence[tuple[int, int, int, bytes, Sequence[bytes]]]) -> None:
        """Write several batches ``(first_offset, timestamp_us, flags, principal,
        payloads)``, each as :meth:`append` would, with one write for all of them."""
        if self.fd is None:
            raise RuntimeError(f"{self.path} is not the active segment")
        pieces: list[bytes] = []
        heads: list[tuple[int, BatchHead]] = []
        position = start = self.size
        for first_offset, timestamp_us, flags, principal, payloads in batches:
            encoded = encode_batch(first_offset, timestamp_us, flags, principal, payloads)
            length = sum(map(len, encoded))
            pieces.extend(encoded)
            heads.append(
                (
                    position,
                    BatchHead(
                        0,
                        length,
                        first_offset,
                        timestamp_us,
                        len(payloads),
                        flags,
                        len(principal),
                        0,
                    ),
                )
            )
            position += length
        _write_pieces(self.fd, pieces, start, position - start)
        for at, head in heads:
            self._account(at, head)

    def seal(self) -> int | None:
        """Stop being the active segment; returns the write descriptor for the caller to close.

        The log closes that descriptor only once no fsync round can still be
        using it (a closed descriptor number may be reused by another file).
        """
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                self._write_index(self._index_bytes())
            except OSError as exc:
                # Not fatal: the next open rebuilds an index that does not match.
                _log.warning("%s: could not write the index: %s", self.index_path, exc)
        return fd

    def close(self) -> None:
        """Close any open descriptor."""
        fd = self.seal()
        if fd is not None:
            os.close(fd)

    def delete(self) -> None:
        """Remove the segment and its index (the segment first: a lone index is cleaned up)."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)

    # --- reading ---------------------------------------------------------------------

    def records_from(self, fd: int, offset: int, end: int | None = None) -> Iterator[Record]:
        """Records with offsets at and after ``offset`` (to the end written so far, or
        below ``end``: then only the bytes of those records are read).

        ``fd`` is any descriptor open for reading this segment. Checksums are
        verified on the way, so damage after open is reported, not returned.
        """
        reader = _Reader(self.path, fd, self.size)
        for position, batch, starts in self._batches_from(reader, offset):
            head = batch.head
            if head.end_offset <= offset:
                continue
            if end is not None and head.base_offset >= end:
                return
            # Straight to the first wanted record: the table says where it starts.
            first = max(offset, head.base_offset) - head.base_offset
            stop = len(starts) if end is None else min(len(starts), end - head.base_offset)
            lengths, crcs = batch.lengths, batch.crcs
            span_at = starts[first]
            span = starts[stop - 1] + lengths[stop - 1] - span_at
            # Read ahead only when later batches are wanted too (a scan); a read that
            # ends in this batch takes just its records' bytes.
            data = reader.view(span_at, span, ahead=end is None or end > head.end_offset)
            for i in range(first, stop):
                at = starts[i] - span_at
                payload = data[at : at + lengths[i]]
                if not check_payload(payload, crcs[i]):
                    raise CorruptionError(self.path, position, "record checksum mismatch")
                yield Record(
                    head.base_offset + i, head.timestamp_us, batch.publisher, bytes(payload)
                )

    def extensions(self, fd: int) -> Iterator[tuple[int, int, BatchExtension]]:
        """(first offset, record count, extension) of every batch here that carries one.

        Reads heads, extension areas and record tables only, never payloads.
        """
        reader = _Reader(self.path, fd, self.size)
        for _position, batch, _starts in self._batches_from(reader, self.base_offset):
            if batch.extension is not None:
                yield batch.head.base_offset, batch.head.record_count, batch.extension

    def boundary(self, offset: int) -> int:
        """The byte position where the batch starting at ``offset`` starts (the file's
        size for ``end_offset``); ValueError when no batch starts there."""
        if offset == self.end_offset:
            return self.size
        fd = os.open(self.path, os.O_RDONLY)
        try:
            reader = _Reader(self.path, fd, self.size)
            for position, batch, _starts in self._batches_from(reader, offset):
                if batch.head.base_offset == offset:
                    return position
                if batch.head.base_offset > offset:
                    break
        finally:
            os.close(fd)
        raise ValueError(f"{self.path}: no batch starts at offset {offset}")

    def _batches_from(
        self, reader: _Reader, offset: int
    ) -> Iterator[tuple[int, Batch, tuple[int, ...]]]:
        """Each batch (head and table verified) from the one the index says holds
        ``offset``, with where each of its payloads starts."""
        i = bisect_right(self._entry_offsets, offset) - 1
        position = self._entry_positions[i] if i >= 0 else HEADER_SIZE
        expected = self._entry_offsets[i] if i >= 0 else self.base_offset
        end = self.size
        while position < end:
            cached = self._table_at(position)
            if cached is None:
                head = read_batch_head(reader.view(position, BATCH_HEAD_SIZE), 0, end - position)
                if head is None:
                    raise CorruptionError(self.path, position, "batch head out of range")
                batch = read_batch_table(reader.view(position, head.table_end), 0, head)
                if batch is None or head.base_offset != expected:
                    raise CorruptionError(self.path, position, "batch checksum or offset mismatch")
                starts = tuple(accumulate(batch.lengths[:-1], initial=position + head.table_end))
                cached = (batch, starts)
                self._remember(position, cached)
            batch, starts = cached
            head = batch.head
            if head.base_offset != expected:
                raise CorruptionError(self.path, position, "batch checksum or offset mismatch")
            yield position, batch, starts
            position += head.length
            expected = head.end_offset

    def _table_at(self, position: int) -> tuple[Batch, tuple[int, ...]] | None:
        with self._tables_lock:
            table = self._tables.get(position)
            if table is not None:
                self._tables.move_to_end(position)
            return table

    def _remember(self, position: int, table: tuple[Batch, tuple[int, ...]]) -> None:
        records = len(table[1])
        if records > _TABLE_CACHE_RECORDS:
            return
        with self._tables_lock:
            tables = self._tables
            if position in tables:
                return  # another reader got there first
            tables[position] = table
            self._tables_records += records
            while self._tables_records > _TABLE_CACHE_RECORDS:
                _, (_, dropped) = tables.popitem(last=False)
                self._tables_records -= len(dropped)

    def offset_for_time(self, fd: int, at_us: int) -> int | None:
        """The first offset here appended at or after ``at_us``, via the sparse index."""
        if not self.count or self.last_timestamp_us < at_us:
            return None
        # The last entry strictly older than at_us: batches equal to at_us may
        # sit before an entry that carries the same time.
        i = bisect_left(self._entry_times, at_us)
        start = self._entry_offsets[i - 1] if i > 0 else self.base_offset
        # Every record of a batch has the batch's time: no payload is read.
        for _position, batch, _starts in self._batches_from(
            _Reader(self.path, fd, self.size), start
        ):
            if batch.head.timestamp_us >= at_us:
                return batch.head.base_offset
        return None
        # The last entry strictly older than at_us: records equal to at_us may
        # sit before an entry that carries the same time.
        i = bisect_left(self._entry_times, at_us)
        start = self._entry_offsets[i - 1] if i > 0 else self.base_offset
        for record in self.records_from(fd, start):
            if record.timestamp_us >= at_us:
                return record.offset
        return None
