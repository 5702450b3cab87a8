"""Snapshots of a Quorum cache shard: what lets its replication log be compacted.

A replica's cache shard is derived state: applying the committed replication log
in order gives it (replication/cache.py). Without a snapshot the whole log must be
kept and replayed at every open. With one, a replica rebuilds from the newest
snapshot and replays only the entries above it, and its replication log may drop
what is below (`SnapshotDisk` caps the existing rewrite, `ReplicaDisk.compact`, at
the snapshot's offset).

- **What it holds** (`CacheSnapshot`, spec/fleet.yaml): the replication log offset
  it was taken at (every entry below it applied, none above), the generation of the
  record before it, the cache shard log's tail (the version the next put gets) and
  every live entry (key, value, version, TTL deadline) in recency order and every
  counter. Applying is deterministic, so it is the same at one offset on every
  replica; versions survive because the rebuilt shard log ends at the same tail.
- **Crash-safe**: ``snapshot-{offset}.bin`` (``u32 crc32 | msgpack body``) is
  written under a temporary name, fsynced, renamed into place and the folder
  fsynced; only then are older snapshots deleted and may the disk drop entries
  below it. A crash at any point leaves the previous snapshot or the new one whole;
  `load_newest` takes the newest readable one and removes temporaries.
- **Rebuild** (`restore`): the shard log folder is emptied and given one segment
  starting at ``tail - n`` holding n COPY and COUNTER records (cache/records.py),
  so the cache shard's replay yields the same entries, versions, TTLs, counters and
  recency order, and its next offset is `tail` as on the replica that wrote it.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from felix_broker.cache.records import CacheRecord, Kind, encode_counter, encode_record
from felix_broker.cache.shard import CacheShard
from felix_broker.storage import Log, LogConfig
from felix_broker.storage.segment import Segment
from felix_wire.fleet import CacheSnapshot, CacheSnapshotCounter, CacheSnapshotEntry

from .core import Entry
from .disk import ReplicaDisk, ReplicaDiskError

__all__ = [
    "SnapshotDisk",
    "capture",
    "decode_snapshot",
    "encode_snapshot",
    "load_newest",
    "reset_log",
    "restore",
    "write_snapshot",
]

_NAME = re.compile(r"snapshot-(\d+)\.bin")
_CRC = struct.Struct("<I")
_COPY_BATCH = 256

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CacheSnapshot)


class SnapshotDisk(ReplicaDisk):
    """A cache replica's disk: compaction never drops an entry above `floor`, the
    offset of its newest durable snapshot (0: none, so nothing is dropped)."""

    def __init__(self, folder: Path, *, compact_every: int = 1024) -> None:
        super().__init__(folder, compact_every=compact_every)
        self.floor = 0

    def compact(self, floor: int, weigh: Callable[[Entry], int]) -> bool:
        return super().compact(min(floor, self.floor), weigh)


def capture(shard: CacheShard, offset: int, generation: int) -> CacheSnapshot:
    """The shard's state now, labelled as the state at replication offset `offset`."""
    return CacheSnapshot(
        offset=offset,
        generation=generation,
        tail=shard.tail,
        entries=[
            CacheSnapshotEntry(
                key=key, value=e.value, version=e.version, expires_at_ms=e.expires_at_ms
            )
            for key, e in shard.entries.items()
        ],
        counters=[
            CacheSnapshotCounter(key=key, total=c.total) for key, c in shard.counters.items()
        ],
    )


def encode_snapshot(snapshot: CacheSnapshot) -> bytes:
    body = _encoder.encode(snapshot)
    return _CRC.pack(zlib.crc32(body)) + body


def decode_snapshot(data: bytes) -> CacheSnapshot:
    """Raises ValueError for a torn or corrupt snapshot."""
    if len(data) < _CRC.size:
        raise ValueError("snapshot shorter than its checksum")
    (crc,) = _CRC.unpack_from(data)
    body = data[_CRC.size :]
    if zlib.crc32(body) != crc:
        raise ValueError("snapshot checksum mismatch")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"snapshot undecodable: {exc}") from None


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_snapshot(folder: Path, offset: int, data: bytes) -> Path:
    """Write `data` (`encode_snapshot`) as the snapshot at `offset`, crash-safely (see
    the module docstring), then remove older snapshots. Blocking file I/O."""
    path = folder / f"snapshot-{offset}.bin"
    temp = folder / f"snapshot-{offset}.bin.tmp"
    try:
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        _fsync_folder(folder)
        for other in folder.iterdir():
            held = _NAME.fullmatch(other.name)
            if held is not None and int(held.group(1)) < offset:
                other.unlink()
    except OSError as exc:
        raise ReplicaDiskError(f"{path}: snapshot not written: {exc}") from None
    return path


def reset_log(folder: Path, offset: int, generation: int) -> None:
    """Replace a replica's replication log by an empty one starting at `offset` (the
    record before it of `generation`), crash-safely: the new file is created under a
    temporary name, fsynced, renamed and the folder fsynced; `ReplicaDisk.recover`
    then takes it (the highest base) and removes the others. Blocking file I/O."""
    name = f"entries-{offset}-{generation}-0.log"
    temp = folder / (name + ".tmp")
    try:
        with open(temp, "wb") as out:
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, folder / name)
        _fsync_folder(folder)
    except OSError as exc:
        raise ReplicaDiskError(f"{folder}: replication log not reset: {exc}") from None


def load_newest(folder: Path) -> CacheSnapshot | None:
    """The newest readable snapshot in `folder` (None: none); temporaries go."""
    if not folder.exists():
        return None
    found: list[tuple[int, Path]] = []
    for path in folder.iterdir():
        held = _NAME.fullmatch(path.name)
        if held is not None:
            found.append((int(held.group(1)), path))
        elif path.name.startswith("snapshot-") and path.name.endswith(".bin.tmp"):
            path.unlink()
    for offset, path in sorted(found, reverse=True):
        try:
            snapshot = decode_snapshot(path.read_bytes())
        except ValueError:
            continue  # never renamed into place whole: an older one is the truth
        if snapshot.offset != offset:
            raise ReplicaDiskError(f"{path}: holds the snapshot at {snapshot.offset}")
        return snapshot
    return None


def restore(directory: Path, snapshot: CacheSnapshot | None, config: LogConfig) -> None:
    """Empty the cache shard log folder and, from a snapshot, write the log a shard
    opens into the snapshot's state (see the module docstring). Blocking file I/O."""
    shutil.rmtree(directory, ignore_errors=True)
    if snapshot is None:
        return
    payloads = [
        encode_record(CacheRecord(Kind.COPY, e.key, e.value, e.version, e.expires_at_ms))
        for e in snapshot.entries
    ]
    payloads.extend(encode_counter(c.key, c.total) for c in snapshot.counters)
    start = snapshot.tail - len(payloads)
    if start < 0:
        raise ReplicaDiskError(
            f"snapshot at {snapshot.offset}: {len(payloads)} records below tail {snapshot.tail}"
        )
    directory.mkdir(parents=True)
    Segment.create(directory, start, config.index_interval_bytes).close()
    log = Log.open(directory, config)
    try:
        for at in range(0, len(payloads), _COPY_BATCH):
            log.append(payloads[at : at + _COPY_BATCH], timestamp_us=1)
    finally:
        log.close()
    if start + len(payloads) != snapshot.tail:  # pragma: no cover - Log.append's contract
        raise ReplicaDiskError(f"snapshot at {snapshot.offset}: rebuilt log ends off its tail")
