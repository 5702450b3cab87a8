"""A replica's disk: its ballot and its log of entries, in one folder per shard.

What the core's disk effects need, and nothing more:

- `write(offset, entries)` appends at the log's length (handed to the OS, not
  yet durable); `sync()` fsyncs and returns the length it covered (the core's
  `synced(length)`);
- `truncate(length)` and `persist_ballot(generation, leader)` are synchronous:
  fsynced before they return (the core requires it before its next effect);
- `recover()` reads back what survived a crash (`DiskImage`): a torn or corrupt
  tail (a crash mid-write) is cut off, never read as a record;
- `read(offset, count)` reads records back (a ship to a follower behind the
  core's in-memory base);
- `compact(floor, weigh)` drops the records below `floor` (the core's
  `CompactLog`: every replica holds them) by rewriting the file from `floor`.
  It runs only once at least `compact_every` records can go (default 1024), so
  the file is rewritten once per that many records, not per commit: the file
  holds at most `compact_every` records below the floor, plus what the core
  still needs.

Layout: ``ballot.json`` (``{"generation": G, "leader": node id or null}``,
replaced atomically: temp file, fsync, rename, folder fsync) and the entries
file: frames of ``u32 length | u32 crc32 | body`` where the body is the msgpack
of the catalogued `ReplicaEntry` (spec/fleet.yaml), the shape the entries travel
in between brokers. The file is ``entries.log`` until the first compaction, then
``entries-{base}-{base_generation}-{weight}.log``: its first record is at offset
`base`, the record before it was of `base_generation`, and `weight` is the sum of
`weigh(entry)` over every record dropped (a stream shard's record count below
`base`, so a restart knows how much of the stream log the file's records cover).
A compaction writes the new file under a temporary name, fsyncs it, renames it
into place, fsyncs the folder and only then deletes the old file: a crash at any
point leaves one whole file with the highest base, which `recover` takes (and
removes the others).

Not thread-safe: one event loop drives it; only fsyncs move to a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import struct
import zlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from felix_wire.fleet import ReplicaEntry

from .core import DiskImage, Entry

__all__ = ["ReplicaDisk", "ReplicaDiskError"]

_FRAME = struct.Struct("<II")  # body length, crc32 of the body
_MAX_BODY = 64 * 1024 * 1024  # a frame claiming more is a torn tail, not a record
_ENTRIES = "entries.log"
_COMPACTED = re.compile(r"entries-(\d+)-(\d+)-(\d+)\.log")
_BALLOT = "ballot.json"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicaEntry)


class ReplicaDiskError(Exception):
    """The replica's files cannot be written or read (the replica stops)."""


class ReplicaDisk:
    def __init__(self, folder: Path, *, compact_every: int = 1024) -> None:
        if compact_every <= 0:
            raise ValueError("compact_every must be positive")
        self.folder = folder
        self.compact_every = compact_every
        self.base = 0  # the offset of the file's first record
        self.base_generation = 0  # the generation of the record at base - 1
        self.weight = 0  # the weight of the records compacted away
        self._positions = array("q")  # byte position of each entry's frame, from base
        self._size = 0
        self._fd: int | None = None
        self._path = folder / _ENTRIES

    @property
    def length(self) -> int:
        return self.base + len(self._positions)

    def _pick_file(self) -> None:
        """The entries file with the highest base; the others (and temporaries) go."""
        found: list[tuple[int, int, int, Path]] = []
        for path in self.folder.iterdir():
            held = _COMPACTED.fullmatch(path.name)
            if held is not None:
                base, generation, weight = (int(g) for g in held.groups())
                found.append((base, generation, weight, path))
            elif path.name.endswith(".log.tmp"):
                path.unlink()
        if found:
            self.base, self.base_generation, self.weight, self._path = max(found)
            for _, _, _, path in found:
                if path != self._path:
                    path.unlink()
            legacy = self.folder / _ENTRIES
            if legacy.exists():
                legacy.unlink()

    def recover(self) -> DiskImage:
        """Open (creating the folder) and read back the ballot and the entries."""
        self.folder.mkdir(parents=True, exist_ok=True)
        generation, leader = 0, None
        ballot = self.folder / _BALLOT
        if ballot.exists():
            try:
                held = json.loads(ballot.read_text())
                generation, leader = int(held["generation"]), held["leader"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ReplicaDiskError(f"{ballot}: unreadable ballot: {exc}") from None
        self._pick_file()
        path = self._path
        data = path.read_bytes() if path.exists() else b""
        entries: list[Entry] = []
        self._positions = array("q")
        at = 0
        while at + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, at)
            body = data[at + _FRAME.size : at + _FRAME.size + length]
            if length > _MAX_BODY or len(body) != length or zlib.crc32(body) != crc:
                break  # a torn tail: what follows was never synced whole
            try:
                entry = _decoder.decode(body)
            except msgspec.DecodeError:
                break
            self._positions.append(at)
            entries.append(Entry(entry.generation, bytes(entry.payload), entry.start))
            at += _FRAME.size + length
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if at != len(data):
            os.ftruncate(self._fd, at)
            os.fsync(self._fd)
        self._size = at
        return DiskImage(generation, leader, tuple(entries), self.base, self.base_generation)

    def write(self, offset: int, entries: Sequence[Entry]) -> None:
        if offset != self.length:
            raise ReplicaDiskError(f"write at {offset}, but the log holds {self.length}")
        chunks: list[bytes] = []
        at = self._size
        for entry in entries:
            wire = ReplicaEntry(
                generation=entry.generation, payload=entry.payload, start=entry.start
            )
            body = _encoder.encode(wire)
            self._positions.append(at)
            chunk = _FRAME.pack(len(body), zlib.crc32(body)) + body
            chunks.append(chunk)
            at += len(chunk)
        blob = b"".join(chunks)
        try:
            os.pwrite(self._fd_or_fail(), blob, self._size)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: write failed: {exc}") from None
        self._size += len(blob)

    async def sync(self) -> int:
        """fsync; the number of entries the fsync covered."""
        length = self.length
        fd = self._fd_or_fail()
        try:
            await asyncio.to_thread(os.fsync, fd)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: fsync failed: {exc}") from None
        return length

    def truncate(self, length: int) -> None:
        if length >= self.length:
            return
        if length < self.base:
            raise ReplicaDiskError(f"truncate to {length}, below the compacted base {self.base}")
        position = self._positions[length - self.base]
        fd = self._fd_or_fail()
        try:
            os.ftruncate(fd, position)
            os.fsync(fd)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: truncate failed: {exc}") from None
        del self._positions[length - self.base :]
        self._size = position

    def read(self, offset: int, count: int) -> tuple[int, list[Entry]]:
        """The generation of the record at `offset - 1` and up to `count` records from
        `offset` (which must be at or above `base`)."""
        if offset < self.base or offset > self.length:
            raise ReplicaDiskError(f"read at {offset}: the file holds [{self.base}, {self.length})")
        first = offset - 1 if offset > self.base else offset
        last = min(offset + count, self.length)
        entries = self._read_range(first, last)
        if offset > self.base:
            return entries[0].generation, entries[1:]
        return (self.base_generation if offset else 0), entries

    def _read_range(self, low: int, high: int) -> list[Entry]:
        if low >= high:
            return []
        start = self._positions[low - self.base]
        end = self._positions[high - self.base] if high < self.length else self._size
        try:
            data = os.pread(self._fd_or_fail(), end - start, start)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: read failed: {exc}") from None
        entries: list[Entry] = []
        at = 0
        while at < len(data):
            length, crc = _FRAME.unpack_from(data, at)
            body = data[at + _FRAME.size : at + _FRAME.size + length]
            if len(body) != length or zlib.crc32(body) != crc:
                raise ReplicaDiskError(f"{self._path}: a record read back is corrupt")
            entry = _decoder.decode(body)
            entries.append(Entry(entry.generation, bytes(entry.payload), entry.start))
            at += _FRAME.size + length
        return entries

    def compact(self, floor: int, weigh: Callable[[Entry], int]) -> bool:
        """Drop the records below `floor` once at least `compact_every` can go (see
        the module docstring); whether the file was rewritten."""
        floor = min(floor, self.length)
        if floor - self.base < self.compact_every:
            return False
        dropped = self._read_range(self.base, floor)
        weight = self.weight + sum(weigh(e) for e in dropped)
        generation = dropped[-1].generation
        cut = self._positions[floor - self.base] if floor < self.length else self._size
        fd = self._fd_or_fail()
        name = f"entries-{floor}-{generation}-{weight}.log"
        temp = self.folder / (name + ".tmp")
        path = self.folder / name
        try:
            tail = os.pread(fd, self._size - cut, cut)
            with open(temp, "wb") as out:
                out.write(tail)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
            self._fsync_folder()
            new_fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: compaction failed: {exc}") from None
        old = self._path
        os.close(fd)
        self._fd, self._path = new_fd, path
        with_cut = array("q", (p - cut for p in self._positions[floor - self.base :]))
        self._positions = with_cut
        self._size -= cut
        self.base, self.base_generation, self.weight = floor, generation, weight
        try:
            old.unlink()
        except OSError as exc:  # the next recover removes it
            raise ReplicaDiskError(f"{old}: not removed after compaction: {exc}") from None
        return True

    def _fsync_folder(self) -> None:
        folder = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def persist_ballot(self, generation: int, leader: str | None) -> None:
        path = self.folder / _BALLOT
        temp = self.folder / (_BALLOT + ".tmp")
        text = json.dumps({"generation": generation, "leader": leader})
        try:
            with open(temp, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
            self._fsync_folder()
        except OSError as exc:
            raise ReplicaDiskError(f"{path}: ballot not persisted: {exc}") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _fd_or_fail(self) -> int:
        if self._fd is None:
            raise ReplicaDiskError(f"{self.folder}: not open (recover first)")
        return self._fd
