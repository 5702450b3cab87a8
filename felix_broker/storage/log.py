"""A shard's log: contiguous offsets over a chain of segments, with fsync policy.

Durability and visibility per fsync mode (see docs/storage-format.md):

- ``none``: never fsync. :meth:`Log.wait_durable` returns at once and
  ``durable_offset == next_offset``: the promise is "handed to the OS", which
  survives a broker crash but not a power loss.
- ``periodic``: the owner (:class:`~felix_broker.storage.store.LogStore`) calls
  :meth:`Log.sync` every ``fsync_interval``. ``wait_durable`` returns at once,
  like ``none``: the mode trades a bounded loss window on power failure for
  publish latency, and making publishers wait for the timer would give the
  latency of ``on_commit`` without its guarantee. ``durable_offset`` reports
  what an fsync really covered.
- ``on_commit``: ``wait_durable(offset)`` returns only once an fsync covered
  ``offset``. Concurrent waiters share fsyncs (group commit: at most one fsync
  round runs at a time, and the next one covers everything appended meanwhile).
  Readers see only durable records, so nothing a crash can lose is ever
  delivered.

A failed write or fsync puts the log in a failed state: everything later
raises :class:`LogFailedError` until the log is reopened (which rescans it).

A :class:`Log` is not thread-safe: use it from one thread (the event loop);
it moves only the fsync calls to a worker thread (see ``fsync_threads``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from felix_broker.config import FsyncMode
from felix_broker.storage.errors import (
    CorruptionError,
    LogClosedError,
    LogFailedError,
    OffsetOutOfRangeError,
)
from felix_broker.storage.format import (
    HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    RECORD_ENTRY_SIZE,
    BatchExtension,
    Record,
    batch_size,
    encode_extension,
    encode_principal,
    parse_segment_name,
)
from felix_broker.storage.fsync_threads import run_fsync
from felix_broker.storage.retention import Retention, segments_to_delete
from felix_broker.storage.segment import Segment

__all__ = ["Log", "LogConfig"]

_log = logging.getLogger(__name__)

_MIB = 1024 * 1024
# Positions in the index are u32: a segment must stay below 4 GiB even when a
# record larger than the segment bound lands alone in one.
_MAX_SEGMENT_BYTES = 2**31


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How a log lays out and syncs its files."""

    segment_bytes: int = 64 * _MIB
    """Roll to a new segment before one would grow past this (a bigger record gets its own)."""
    index_interval_bytes: int = 4096
    """At least this many bytes between two sparse index entries (at most one per batch)."""
    fsync_mode: FsyncMode = FsyncMode.PERIODIC
    fsync_interval: float = 0.1
    """Seconds between the owner's periodic :meth:`Log.sync` calls."""

    def __post_init__(self) -> None:
        smallest = HEADER_SIZE + batch_size(0, 1, 0)
        if not smallest <= self.segment_bytes <= _MAX_SEGMENT_BYTES:
            raise ValueError(
                f"segment_bytes must be in [{smallest}, "
                f"{_MAX_SEGMENT_BYTES}], got {self.segment_bytes}"
            )
        if self.index_interval_bytes < 1:
            raise ValueError(f"index_interval_bytes must be >= 1, got {self.index_interval_bytes}")
        if not self.fsync_interval > 0:
            raise ValueError(f"fsync_interval must be > 0, got {self.fsync_interval}")


def _base_offset(segment: Segment) -> int:
    return segment.base_offset


def _last_timestamp(segment: Segment) -> int:
    return segment.last_timestamp_us


def _scan(
    files: Iterator[tuple[Segment, int]],
    from_offset: int,
    stop: int,
    max_records: int,
    max_bytes: int,
) -> list[Record]:
    """The records of a read (see `Log.read`) from segments in order, each with a
    descriptor to read it through."""
    records: list[Record] = []
    used = 0
    offset = from_offset
    for segment, fd in files:
        if offset >= stop:
            break
        # At most max_records are wanted: the segment reads only their bytes.
        want = min(stop, offset + max_records - len(records))
        for record in segment.records_from(fd, offset, end=want):
            if record.offset >= stop:
                return records
            if records and used + len(record.payload) > max_bytes:
                return records
            records.append(record)
            used += len(record.payload)
            if len(records) >= max_records:
                return records
        offset = segment.end_offset
    return records


def _remove_leftovers(directory: Path, bases: set[int]) -> None:
    for path in directory.iterdir():
        if path.name.endswith((".idx.tmp", ".log.upgrade")):
            # An unfinished index rewrite, or an upgrade that crashed before its
            # rename (the old segment is still there and is upgraded again).
            path.unlink()
        elif path.suffix == ".idx" and parse_segment_name(path.stem + ".log") not in bases:
            # Retention removes the segment before its index; a crash between
            # the two leaves an index for nothing.
            path.unlink()


class Log:
    """An append-only log of records for one shard. Create with :meth:`Log.open`."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        fsync: Callable[[int], None],
        segments: list[Segment],
    ) -> None:
        self.directory = directory
        self.config = config
        self._fsync = fsync
        self._segments = segments
        self._next_offset = segments[-1].end_offset
        self._durable_offset = self._next_offset
        self._failure: BaseException | None = None
        self._closed = False
        # Retention never removes a segment holding a record at or above this offset
        # (None: no floor). A replicated stream shard sets it to the last retention cut
        # its replica applied (replication/apply.py; decision quorum-retention-cut).
        self.retention_floor: int | None = None
        # Group commit: at most one fsync round runs; waiters queue for its end.
        self._sync_running = False
        self._sync_waiters: list[asyncio.Future[None]] = []
        # Write descriptors of sealed segments that an in-flight fsync round may
        # still use; closed when the round ends.
        self._retired_fds: list[int] = []
        self._directory_dirty = False
        # Held around every fsync, so close() never closes a descriptor that a
        # worker thread is syncing.
        self._fsync_lock = threading.Lock()
        self._truncations = 0  # cuts so far: a durability waiter past a cut gives up

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig | None = None,
        *,
        fsync: Callable[[int], None] = os.fsync,
    ) -> Log:
        """Open (recovering) or create the log in ``directory``. Blocking file I/O.

        Raises :class:`CorruptionError` or :class:`UnsupportedVersionError`
        naming the file when the log cannot be trusted. Records found on disk
        count as durable: in the fsync modes they are synced before this returns.
        """
        config = config or LogConfig()
        directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(
            base
            for base in (parse_segment_name(p.name) for p in directory.iterdir())
            if base is not None
        )
        _remove_leftovers(directory, set(bases))
        sync_file = None if config.fsync_mode is FsyncMode.NONE else fsync
        segments: list[Segment] = []
        try:
            if not bases:
                segments.append(Segment.create(directory, 0, config.index_interval_bytes))
            for i, base in enumerate(bases):
                active = i == len(bases) - 1
                segment = Segment.recover(
                    directory,
                    base,
                    index_interval=config.index_interval_bytes,
                    active=active,
                    sync_file=sync_file,
                )
                segments.append(segment)
                if not active and not segment.count:
                    raise CorruptionError(segment.path, HEADER_SIZE, "sealed segment is empty")
                if len(segments) > 1 and segments[-2].end_offset != base:
                    raise CorruptionError(
                        segment.path,
                        0,
                        f"segment starts at offset {base} but the one before ends at "
                        f"{segments[-2].end_offset}",
                    )
            log = cls(directory, config, fsync, segments)
            if sync_file is not None:
                log._sync_files(segments[-1].fd, True)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        _log.debug(
            "opened log %s at offsets [%d, %d)", directory, log.start_offset, log.next_offset
        )
        return log

    # --- offsets ---------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The oldest retained offset (grows with retention, never shrinks)."""
        return self._segments[0].base_offset

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def durable_offset(self) -> int:
        """Every offset below this is durable per the fsync mode (all appended for ``none``)."""
        if self.config.fsync_mode is FsyncMode.NONE:
            return self._next_offset
        return self._durable_offset

    @property
    def readable_offset(self) -> int:
        """Reads return offsets below this: durable ones under ``on_commit``, all otherwise."""
        if self.config.fsync_mode is FsyncMode.ON_COMMIT:
            return self._durable_offset
        return self._next_offset

    @property
    def failed(self) -> bool:
        """Whether an I/O error stopped the log (reopen to recover)."""
        return self._failure is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    @property
    def needs_sync(self) -> bool:
        """Whether :meth:`sync` has work: unsynced records or directory changes."""
        return (
            self.config.fsync_mode is not FsyncMode.NONE
            and not self._closed
            and self._failure is None
            and (self._durable_offset < self._next_offset or self._directory_dirty)
        )

    @property
    def size_bytes(self) -> int:
        """Bytes of all segment files."""
        return sum(segment.size for segment in self._segments)

    @property
    def segment_count(self) -> int:
        """How many segment files the log has, the active one included."""
        return len(self._segments)

    # --- appending -------------------------------------------------------------------

    def append(
        self,
        payloads: Sequence[bytes],
        *,
        timestamp_us: int,
        publisher: str | None = None,
        extension: BatchExtension | None = None,
    ) -> int:
        """Append a batch (one timestamp, one publisher); returns the first record's offset.

        The records are handed to the OS before this returns; see
        :meth:`wait_durable` for durability. Timestamps never go backwards in
        a log: a ``timestamp_us`` earlier than that of the newest record held
        is stored as that time, so time lookups stay a binary search.

        A batch with an ``extension`` (a producer mark, a commit) is written
        as one stored batch, never split across segments, so a crash leaves
        all of it or none: if it does not fit the active segment it starts a
        new one, which it may make larger than ``segment_bytes``.
        """
        self._check_usable()
        total = self.check_payloads(payloads)
        flags, principal = encode_principal(publisher)
        extension_bytes = b""
        if extension is not None:
            extension_flags, extension_bytes = encode_extension(extension)
            flags |= extension_flags
            if extension.commit is not None and len(payloads) != 1:
                raise ValueError("a commit is exactly one record")
        # Only the active segment can be empty, so the newest held record is in
        # it or in the segment before.
        for segment in self._segments[-1:-3:-1]:
            if segment.count:
                timestamp_us = max(timestamp_us, segment.last_timestamp_us)
                break
        base = self._next_offset
        done = 0
        try:
            segment = self._segments[-1]
            whole = batch_size(len(principal), len(payloads), total, len(extension_bytes))
            if extension_bytes:
                if HEADER_SIZE + whole > _MAX_SEGMENT_BYTES:
                    raise ValueError(f"a marked batch of {whole} bytes cannot fit one segment")
                if segment.count and segment.size + whole > self.config.segment_bytes:
                    self._roll()
                    segment = self._segments[-1]
                segment.append(base, timestamp_us, flags, principal, payloads, extension_bytes)
                self._next_offset += len(payloads)
                return base
            if segment.size + whole <= self.config.segment_bytes:
                # The common case: the whole batch fits the active segment.
                segment.append(base, timestamp_us, flags, principal, payloads)
                self._next_offset += len(payloads)
                return base
            # Split across segments: each part is a batch of its own.
            while done < len(payloads):
                segment = self._segments[-1]
                room = self.config.segment_bytes - segment.size
                take = 0
                size = batch_size(len(principal), 0, 0)
                for payload in payloads[done:]:
                    record = RECORD_ENTRY_SIZE + len(payload)
                    # A record always fits an empty segment, however big.
                    if size + record > room and (segment.count or take):
                        break
                    size += record
                    take += 1
                if not take:
                    self._roll()
                    continue
                segment.append(
                    self._next_offset, timestamp_us, flags, principal, payloads[done : done + take]
                )
                self._next_offset += take
                done += take
        except OSError as exc:
            self._fail("write", exc)  # no-op when a failed fsync already stopped the log
            raise LogFailedError(f"log {self.directory} failed: {self._failure}") from exc
        return base

    @staticmethod
    def check_payloads(payloads: Sequence[bytes]) -> int:
        """Raise the ValueError :meth:`append` would raise for these payloads; their size."""
        if not payloads:
            raise ValueError("append needs at least one payload")
        total = sum(map(len, payloads))
        if total > MAX_PAYLOAD_BYTES:  # only then can a single payload be too big
            for payload in payloads:
                if len(payload) > MAX_PAYLOAD_BYTES:
                    raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
        return total

    def append_many(self, batches: Sequence[tuple[Sequence[bytes], int, str | None]]) -> list[int]:
        """Append batches ``(payloads, timestamp_us, publisher)`` in order, each stored
        as :meth:`append` stores it; returns each batch's first offset.

        When they all fit the active segment they are handed to the OS with one
        write (a stream's publish pass: one write instead of one per publish);
        otherwise one :meth:`append` each. Either way every batch is handed to the
        OS before this returns, and a failed write fails the log as in :meth:`append`.
        """
        self._check_usable()
        if len(batches) == 1:
            payloads, timestamp_us, publisher = batches[0]
            return [self.append(payloads, timestamp_us=timestamp_us, publisher=publisher)]
        segment = self._segments[-1]
        floor = 0
        for held in self._segments[-1:-3:-1]:
            if held.count:
                floor = held.last_timestamp_us
                break
        entries: list[tuple[int, int, int, bytes, Sequence[bytes]]] = []
        offset = self._next_offset
        size = segment.size
        for payloads, timestamp_us, publisher in batches:
            total = self.check_payloads(payloads)
            flags, principal = encode_principal(publisher)
            floor = max(floor, timestamp_us)
            entries.append((offset, floor, flags, principal, payloads))
            size += batch_size(len(principal), len(payloads), total)
            offset += len(payloads)
        if size > self.config.segment_bytes:
            return [
                self.append(payloads, timestamp_us=timestamp_us, publisher=publisher)
                for payloads, timestamp_us, publisher in batches
            ]
        try:
            segment.append_many(entries)
        except OSError as exc:
            self._fail("write", exc)
            raise LogFailedError(f"log {self.directory} failed: {self._failure}") from exc
        self._next_offset = offset
        return [entry[0] for entry in entries]

    def _roll(self) -> None:
        active = self._segments[-1]
        if self.config.fsync_mode is not FsyncMode.NONE and active.fd is not None:
            # Recovery repairs only the last segment, so a segment must be
            # complete on disk before a later one can hold data. This costs one
            # fsync on the caller's thread per segment_bytes written.
            try:
                self._fsync(active.fd)
                if self._directory_dirty:
                    self._sync_directory()
            except OSError as exc:
                self._fail("fsync", exc)
                raise
            self._directory_dirty = False
            self._durable_offset = self._next_offset
        fd = active.seal()
        if fd is not None:
            if not self._sync_running:
                os.close(fd)
            else:
                self._retired_fds.append(fd)
        self._segments.append(
            Segment.create(self.directory, self._next_offset, self.config.index_interval_bytes)
        )
        self._directory_dirty = True

    # --- truncation ------------------------------------------------------------------

    async def truncate(self, offset: int) -> None:
        """Cut the log back to ``offset`` (a batch boundary at or above the start):
        every record from ``offset`` on is gone, durably, when this returns.

        Crash-safe: later segments go newest first (each removal leaves a shorter
        prefix of the log), then the segment holding ``offset`` is cut at that
        batch's first byte (a file truncation: the old length or the new one), then
        its index is rebuilt from what is left and the folder is synced. A crash at
        any point leaves a prefix of the log at least ``offset`` long, which
        recovery opens as usual; calling this again finishes the cut. Waits for a
        running fsync round first; a ``wait_durable`` of an offset cut away raises
        ``OffsetOutOfRangeError``. Blocking file I/O on the caller's thread (a rare
        operation: a replica dropping records it never shipped)."""
        self._check_usable()
        if not self.start_offset <= offset <= self._next_offset:
            raise OffsetOutOfRangeError(offset, self.start_offset, self._next_offset)
        if offset == self._next_offset:
            return
        while self._sync_running:
            waiter = asyncio.get_running_loop().create_future()
            self._sync_waiters.append(waiter)
            await waiter
            self._check_usable()
        # The segment holding `offset` stays (cut, maybe to its header alone).
        keep = bisect_right([s.base_offset for s in self._segments], offset) - 1
        tail = self._segments[keep]
        position = tail.boundary(offset)  # before anything changes: a bad offset raises
        try:
            with self._fsync_lock:
                for segment in reversed(self._segments[keep + 1 :]):
                    segment.delete()
                    self._segments.pop()
                    self._sync_directory()
                tail.close()
                os.truncate(tail.path, position)
                fd = os.open(tail.path, os.O_RDONLY)
                try:
                    self._fsync(fd)
                finally:
                    os.close(fd)
                sync_file = None if self.config.fsync_mode is FsyncMode.NONE else self._fsync
                self._segments[keep] = Segment.recover(
                    self.directory,
                    tail.base_offset,
                    index_interval=self.config.index_interval_bytes,
                    active=True,
                    sync_file=sync_file,
                )
                self._sync_directory()
        except Exception as exc:  # I/O, or the cut segment no longer scans: stop here
            self._fail("truncate", exc)
            raise LogFailedError(f"log {self.directory} failed: {self._failure}") from exc
        self._next_offset = self._segments[-1].end_offset
        self._durable_offset = min(self._durable_offset, self._next_offset)
        self._truncations += 1
        _log.info("log %s truncated to offset %d", self.directory, offset)

    # --- durability ------------------------------------------------------------------

    async def wait_durable(self, offset: int) -> None:
        """Return once ``offset`` is durable per the fsync mode (see the module docs)."""
        self._check_usable()
        if not 0 <= offset < self._next_offset:
            raise ValueError(f"offset {offset} was not appended (next offset {self._next_offset})")
        if self.config.fsync_mode is FsyncMode.ON_COMMIT:
            await self._sync_until(offset + 1, directory=False)

    async def sync(self) -> None:
        """Make everything appended so far durable (no-op under ``none``)."""
        self._check_usable()
        if self.config.fsync_mode is not FsyncMode.NONE:
            await self._sync_until(self._next_offset, directory=True)

    async def _sync_until(self, target: int, *, directory: bool) -> None:
        loop = asyncio.get_running_loop()
        truncations = self._truncations
        while self._durable_offset < target or (directory and self._directory_dirty):
            self._check_usable()
            if self._truncations != truncations and target > self._next_offset:
                raise OffsetOutOfRangeError(target - 1, self.start_offset, self._next_offset)
            if not self._sync_running:
                self._start_sync_round()
            # Each waiter has its own future, so a cancelled waiter cancels
            # only itself, never the round that others share.
            waiter = loop.create_future()
            self._sync_waiters.append(waiter)
            await waiter

    def _start_sync_round(self) -> None:
        target = self._next_offset
        fd = self._segments[-1].fd
        directory = self._directory_dirty
        self._directory_dirty = False
        self._sync_running = True
        run_fsync(partial(self._sync_files, fd, directory), partial(self._end_sync_round, target))

    def _end_sync_round(self, target: int, error: BaseException | None) -> None:
        # On the loop thread. Waiters resume after this and find the new
        # durable offset, or the failure through _check_usable.
        self._sync_running = False
        retired, self._retired_fds = self._retired_fds, []
        for retired_fd in retired:
            os.close(retired_fd)
        if error is not None:
            self._fail("fsync", error)
        elif self._failure is None:
            self._durable_offset = max(self._durable_offset, target)
        waiters, self._sync_waiters = self._sync_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _sync_files(self, fd: int | None, directory: bool) -> None:
        with self._fsync_lock:
            if self._closed:
                return  # close() synced under this lock and closed the descriptors
            if fd is not None:
                self._fsync(fd)
            if directory:
                self._sync_directory()

    def _sync_directory(self) -> None:
        # New and deleted segment files are durable only once their folder is.
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            _log.error(
                "log %s: %s failed (%s); it acknowledges nothing more until reopened",
                self.directory,
                what,
                exc,
            )

    def _check_usable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        if self._failure is not None:
            raise LogFailedError(f"log {self.directory} failed: {self._failure}")

    # --- reading ---------------------------------------------------------------------

    def read(
        self, from_offset: int, *, max_records: int, max_bytes: int, end: int | None = None
    ) -> list[Record]:
        """Records from ``from_offset`` on, below ``end`` and :attr:`readable_offset`.

        Stops at ``max_records`` records or before the payloads would exceed
        ``max_bytes``; a single record bigger than ``max_bytes`` is still
        returned alone, so a reader always makes progress. Never waits: an
        empty list means nothing readable yet. Raises
        :class:`OffsetOutOfRangeError` outside ``[start_offset, next_offset]``.
        Blocks for the file reads: on the event loop, prefer :meth:`aread`.
        """
        stop, first = self._read_range(from_offset, max_records, max_bytes, end)

        def files() -> Generator[tuple[Segment, int]]:
            for segment in self._segments[first:]:
                fd = segment.fd if segment.fd is not None else os.open(segment.path, os.O_RDONLY)
                try:
                    yield segment, fd
                finally:
                    if fd != segment.fd:
                        os.close(fd)

        scan = files()
        try:
            return _scan(scan, from_offset, stop, max_records, max_bytes)
        finally:
            scan.close()  # closes the descriptor it opened, if any

    async def aread(
        self, from_offset: int, *, max_records: int, max_bytes: int, end: int | None = None
    ) -> list[Record]:
        """:meth:`read` with the file reads and checksums on a worker thread, so a big
        read (up to megabytes) does not hold the event loop.

        What to read is fixed on the loop: the readable range, and a descriptor of
        its own (dup or open) for each segment in it, so appends, retention and
        close meanwhile change nothing the thread sees; the thread closes them.
        """
        stop, first = self._read_range(from_offset, max_records, max_bytes, end)
        files: list[tuple[Segment, int]] = []
        try:
            for segment in self._segments[first:]:
                if segment.base_offset >= stop and files:
                    break
                fd = (
                    os.dup(segment.fd)
                    if segment.fd is not None
                    else os.open(segment.path, os.O_RDONLY)
                )
                files.append((segment, fd))
        except BaseException:
            for _, fd in files:
                os.close(fd)
            raise

        def scan() -> list[Record]:
            try:
                return _scan(iter(files), from_offset, stop, max_records, max_bytes)
            finally:
                for _, fd in files:
                    os.close(fd)

        return await asyncio.to_thread(scan)

    def _read_range(
        self, from_offset: int, max_records: int, max_bytes: int, end: int | None
    ) -> tuple[int, int]:
        """Check a read; returns where it stops and the index of its first segment."""
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        if max_records < 1 or max_bytes < 0:
            raise ValueError("max_records must be >= 1 and max_bytes >= 0")
        if not self.start_offset <= from_offset <= self._next_offset:
            raise OffsetOutOfRangeError(from_offset, self.start_offset, self._next_offset)
        stop = self.readable_offset if end is None else min(end, self.readable_offset)
        return stop, bisect_right(self._segments, from_offset, key=_base_offset) - 1

    def extensions(self) -> Iterator[tuple[int, int, BatchExtension]]:
        """(first offset, record count, extension) of every retained batch carrying one.

        In offset order, over every appended batch (durable or not): what a
        shard replays on open to rebuild its producer table and state view.
        Reads heads and extension areas, never payloads. Do not append while
        iterating.
        """
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        for segment in list(self._segments):
            fd = segment.fd if segment.fd is not None else os.open(segment.path, os.O_RDONLY)
            try:
                yield from segment.extensions(fd)
            finally:
                if fd != segment.fd:
                    os.close(fd)

    def offset_for_time(self, at_us: int) -> int | None:
        """The first readable offset appended at or after ``at_us``.

        Older than everything gives :attr:`start_offset`; newer than every
        readable record gives None. A binary search over segments by their
        last time, then over the chosen segment's sparse index.
        """
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        # Only the active segment can be empty.
        segments = self._segments if self._segments[-1].count else self._segments[:-1]
        i = bisect_left(segments, at_us, key=_last_timestamp)
        if i == len(segments):
            return None
        segment = segments[i]
        fd = segment.fd if segment.fd is not None else os.open(segment.path, os.O_RDONLY)
        try:
            offset = segment.offset_for_time(fd, at_us)
        finally:
            if fd != segment.fd:
                os.close(fd)
        if offset is None or offset >= self.readable_offset:
            return None
        return offset

    # --- retention and closing -------------------------------------------------------

    def retention_start(self, retention: Retention, *, now_us: int) -> int:
        """The start offset ``retention`` alone would leave (ignoring the floor)."""
        count = self._past(retention, now_us)
        return self._segments[count].base_offset

    def _past(self, retention: Retention, now_us: int) -> int:
        return segments_to_delete(
            [segment.size for segment in self._segments],
            [segment.last_timestamp_us for segment in self._segments],
            retention=retention,
            now_us=now_us,
        )

    def apply_retention(self, retention: Retention, *, now_us: int) -> int:
        """Delete whole sealed segments past ``retention``, oldest first, none holding a
        record at or above ``retention_floor``; returns how many."""
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        count = self._past(retention, now_us)
        floor = self.retention_floor
        if floor is not None:
            while count and self._segments[count - 1].end_offset > floor:
                count -= 1
        for segment in self._segments[:count]:
            segment.delete()
        if count:
            del self._segments[:count]
            self._directory_dirty = True
            _log.debug(
                "log %s: retention removed %d segments; start offset now %d",
                self.directory,
                count,
                self.start_offset,
            )
        return count

    def close(self) -> None:
        """Sync what is pending (fsync modes), close every file. Blocks for that fsync.

        Raises :class:`LogFailedError` if that last fsync fails (files are closed anyway).
        """
        if self._closed:
            return
        error: OSError | None = None
        with self._fsync_lock:
            active = self._segments[-1]
            if self.needs_sync and active.fd is not None:
                try:
                    self._fsync(active.fd)
                    if self._directory_dirty:
                        self._sync_directory()
                except OSError as exc:
                    error = exc
                    self._fail("fsync", exc)
                else:
                    self._durable_offset = self._next_offset
                    self._directory_dirty = False
            self._closed = True
            for segment in self._segments:
                segment.close()
            retired, self._retired_fds = self._retired_fds, []
            for fd in retired:
                os.close(fd)
        if error is not None:
            raise LogFailedError(f"log {self.directory}: fsync on close failed: {error}") from error

    async def aclose(self) -> None:
        """Like :meth:`close`, with the final fsync off the event loop thread."""
        if self._closed:
            return
        try:
            if self.needs_sync:
                await self.sync()
        except BaseException:
            self.close()  # the log failed or the wait was cancelled: just release the files
            raise
        self.close()
