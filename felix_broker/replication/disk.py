"""A replica's disk: its ballot and its log of entries, in one folder per shard.

What the core's disk effects need, and nothing more:

- `write(offset, entries)` appends at the log's length (handed to the OS, not
  yet durable); `sync()` fsyncs and returns the length it covered (the core's
  `synced(length)`);
- `truncate(length)` and `persist_ballot(generation, leader)` are synchronous:
  fsynced before they return (the core requires it before its next effect);
- `recover()` reads back what survived a crash (`DiskImage`): a torn or corrupt
  tail (a crash mid-write) is cut off, never read as a record.

Layout: ``ballot.json`` (``{"generation": G, "leader": node id or null}``,
replaced atomically: temp file, fsync, rename, folder fsync) and ``entries.log``:
frames of ``u32 length | u32 crc32 | body`` where the body is the msgpack of
the catalogued `ReplicaEntry` (spec/fleet.yaml), the shape the entries travel in
between brokers.

Not thread-safe: one event loop drives it; only fsyncs move to a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import msgspec

from felix_wire.fleet import ReplicaEntry

from .core import DiskImage, Entry

__all__ = ["ReplicaDisk", "ReplicaDiskError"]

_FRAME = struct.Struct("<II")  # body length, crc32 of the body
_MAX_BODY = 64 * 1024 * 1024  # a frame claiming more is a torn tail, not a record
_ENTRIES = "entries.log"
_BALLOT = "ballot.json"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicaEntry)


class ReplicaDiskError(Exception):
    """The replica's files cannot be written or read (the replica stops)."""


class ReplicaDisk:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._positions: list[int] = []  # byte position of each entry's frame
        self._size = 0
        self._fd: int | None = None

    @property
    def length(self) -> int:
        return len(self._positions)

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
        path = self.folder / _ENTRIES
        data = path.read_bytes() if path.exists() else b""
        entries: list[Entry] = []
        self._positions = []
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
        return DiskImage(generation, leader, tuple(entries))

    def write(self, offset: int, entries: Sequence[Entry]) -> None:
        if offset != self.length:
            raise ReplicaDiskError(f"write at {offset}, but the log holds {self.length}")
        chunks: list[bytes] = []
        for entry in entries:
            wire = ReplicaEntry(
                generation=entry.generation, payload=entry.payload, start=entry.start
            )
            body = _encoder.encode(wire)
            self._positions.append(self._size + sum(map(len, chunks)))
            chunks.append(_FRAME.pack(len(body), zlib.crc32(body)) + body)
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
        position = self._positions[length]
        fd = self._fd_or_fail()
        try:
            os.ftruncate(fd, position)
            os.fsync(fd)
        except OSError as exc:
            raise ReplicaDiskError(f"{self.folder}: truncate failed: {exc}") from None
        del self._positions[length:]
        self._size = position

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
            folder = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
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
