"""One cache shard: its entries, counters, TTLs, memory bound, watches and (optionally) log.

Every operation here is synchronous: a check and the write it decides happen
with no `await` between them, which is what makes conditional writes atomic
per key on the event loop (two racing `absent` puts cannot both apply). Only
durability waits, compaction and recovery are asynchronous or blocking.

Log-backed (durable storage on): every change is appended to the shard's log
(`cache_records` says the payloads) before the in-memory index changes; a
value's version is the offset of the PUT that wrote it. Compaction copies live
entries and counters forward to the tail (COPY and COUNTER records keep their
versions and sums), waits until the copies are durable, then deletes the
sealed segments that now hold only superseded records. Offsets never rewind.

In memory only: versions come from a counter seeded with the wall clock in
microseconds, so a restarted broker does not reissue a version a client may
still hold (K3).

Memory bound: a shard keeps at most `CacheLimits.max_shard_bytes` of entries
(key bytes + value bytes + a fixed per-entry overhead). A put past the bound
evicts the least recently used entries (gets and puts count as use) until it
fits; an eviction is a delete (a tombstone in the log, seen by watches) and
counts in `felix_cache_evictions_total`. One entry larger than the whole bound
is refused. Counters are never evicted: "never written" must stay distinct from
a value that was dropped.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from felix_broker.cache.records import (
    CacheRecord,
    Kind,
    decode_record,
    encode_counter,
    encode_record,
)
from felix_broker.cache.watch import Change, Watcher
from felix_broker.clock import wall_ms, wall_us
from felix_broker.config import FsyncMode
from felix_broker.storage import Log, LogConfig, Retention, StorageError
from felix_broker.storage.format import batch_size

__all__ = ["CacheLimits", "CacheShard", "Entry", "EntryTooLargeError"]

_log = logging.getLogger(__name__)

_MIB = 1024 * 1024
# A rough cost of one entry's Python objects beyond its key and value bytes.
ENTRY_OVERHEAD = 64
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
# Records per append during compaction; the loop yields between batches.
_COPY_BATCH = 256
_READ_BATCH = 4096


@dataclass(frozen=True, slots=True)
class CacheLimits:
    """The cache's bounds and upkeep knobs (per shard unless said otherwise)."""

    max_shard_bytes: int = 256 * _MIB
    """Memory bound of one shard's entries; LRU eviction past it."""
    ttl_pass_interval: float = 1.0
    """Seconds between TTL passes (K5: once per second)."""
    ttl_deletes_per_pass: int = 1024
    """Expiry deletes one shard writes per pass at most (K5)."""
    watch_queue_capacity: int = 1024
    """Changes a watch may have queued; one more makes it lag and end."""
    segment_bytes: int = 16 * _MIB
    """Segment size of a cache log; compaction can only free whole sealed segments."""
    compact_ratio: float = 4.0
    """Compact once the log is this many times the size of its live records..."""
    compact_min_bytes: int = 16 * _MIB
    """...and at least this big."""
    fsync_interval: float = 0.1
    """Seconds between fsyncs of every cache log in fsync mode `periodic`."""


class EntryTooLargeError(ValueError):
    """One entry is bigger than the shard's whole memory bound."""


@dataclass(slots=True)
class Entry:
    value: bytes
    version: int
    expires_at_ms: int  # 0 = never
    offset: int  # the record holding it now (a COPY moves it); = version in memory
    size: int  # bytes counted against the memory bound
    record_bytes: int  # bytes of its record in the log (for the compaction ratio)


@dataclass(slots=True)
class _Counter:
    total: int
    offset: int
    record_bytes: int


def now_ms() -> int:
    return wall_ms()


def _now_us() -> int:
    return wall_us()


class CacheShard:
    """The state of one shard of one cache. Create with `CacheShard.open` (log-backed)
    or the constructor (in memory)."""

    def __init__(
        self,
        name: str,
        *,
        limits: CacheLimits,
        evictions: Counter,
        log: Log | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.log = log
        self._evictions = evictions
        # Insertion order is recency order: the first entry is the next to evict.
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.counters: dict[str, _Counter] = {}
        self.bytes_used = 0
        self.live_record_bytes = 0
        self.compacting = False
        # (expires_at_ms, key, version); stale items are skipped when popped.
        self._expiry: list[tuple[int, str, int]] = []
        self._key_watchers: dict[str, set[Watcher]] = {}
        self._prefix_watchers: set[Watcher] = set()
        self._next_version = _now_us()
        self._last_stamp_us = 0
        # A replica's shard of a replicated (Quorum) cache: written only by applying its
        # replication log (felix_broker/replication/cache.py), so never expired on this
        # broker's clock nor compacted by the cache service.
        self.replicated = False

    # -- life cycle -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        name: str,
        directory: Path,
        *,
        limits: CacheLimits,
        evictions: Counter,
        fsync_mode: FsyncMode,
        fsync: Callable[[int], None] = os.fsync,
    ) -> CacheShard:
        """Open (recovering) the shard's log and rebuild the index. Blocking file I/O.
        `fsync` is what the log syncs a file with (the broker's times itself)."""
        config = LogConfig(
            segment_bytes=limits.segment_bytes,
            fsync_mode=fsync_mode,
            fsync_interval=limits.fsync_interval,
        )
        log = Log.open(directory, config, fsync=fsync)
        shard = cls(name, limits=limits, evictions=evictions, log=log)
        try:
            shard._replay()
        except BaseException:
            log.close()
            raise
        return shard

    def _replay(self) -> None:
        log = self.log
        assert log is not None
        offset = log.start_offset
        while offset < log.readable_offset:
            records = log.read(offset, max_records=_READ_BATCH, max_bytes=64 * _MIB)
            if not records:
                break
            for stored in records:
                self._apply(decode_record(stored.payload), stored.offset, len(stored.payload))
                self._last_stamp_us = max(self._last_stamp_us, stored.timestamp_us)
            offset = records[-1].offset + 1
        self._expiry = [(e.expires_at_ms, k, e.version) for k, e in self.entries.items()]
        self._expiry = [item for item in self._expiry if item[0]]
        heapq.heapify(self._expiry)
        _log.info(
            "cache shard %s recovered: %d entries, %d counters, offsets [%d, %d)",
            self.name,
            len(self.entries),
            len(self.counters),
            log.start_offset,
            log.next_offset,
        )
        if self.bytes_used > self.limits.max_shard_bytes:
            # A smaller bound than the one the log was written under.
            self._evict_over_bound(keep=None)

    def _apply(self, record: CacheRecord, offset: int, payload_bytes: int) -> None:
        """Replay one record into the index (recovery)."""
        record_bytes = batch_size(0, 1, payload_bytes)
        if record.kind is Kind.COUNTER:
            old = self.counters.get(record.key)
            if old is not None:
                self.live_record_bytes -= old.record_bytes
            self.counters[record.key] = _Counter(record.counter_sum, offset, record_bytes)
            self.live_record_bytes += record_bytes
        elif record.kind is Kind.DELETE:
            self._drop(record.key)
        else:
            self._store(
                record.key,
                Entry(
                    record.value,
                    record.version,
                    record.expires_at_ms,
                    offset,
                    _entry_size(record.key, record.value),
                    record_bytes,
                ),
            )

    async def close(self) -> None:
        for watcher in list(self._prefix_watchers):
            watcher.close()
        for watchers in list(self._key_watchers.values()):
            for watcher in list(watchers):
                watcher.close()
        if self.log is not None:
            await self.log.aclose()

    # -- reads --------------------------------------------------------------------------

    def live(self, key: str, now: int) -> Entry | None:
        """The key's entry unless missing or expired (an expired entry reads as absent
        at once; the TTL pass writes its delete)."""
        entry = self.entries.get(key)
        if entry is None or (entry.expires_at_ms and entry.expires_at_ms <= now):
            return None
        return entry

    def get(self, key: str, now: int) -> Entry | None:
        entry = self.live(key, now)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def counter(self, key: str) -> int | None:
        found = self.counters.get(key)
        return None if found is None else found.total

    def watchers(self) -> list[Watcher]:
        """Every watch registered on this shard."""
        found = set(self._prefix_watchers)
        for watchers in self._key_watchers.values():
            found |= watchers
        return list(found)

    @property
    def tail(self) -> int:
        """The offset the next change gets (log-backed shards)."""
        assert self.log is not None
        return self.log.next_offset

    # -- writes -------------------------------------------------------------------------

    def put(self, key: str, value: bytes, ttl_ms: int | None, now: int) -> Entry:
        """Store `value`; returns the new entry (its version and offset).

        `ttl_ms` None or 0 means no expiry. Raises EntryTooLargeError, or a
        StorageError when the log refused the append (nothing changed then).
        """
        size = _entry_size(key, value)
        if size > self.limits.max_shard_bytes:
            raise EntryTooLargeError(
                f"an entry of {size} bytes exceeds the shard bound of "
                f"{self.limits.max_shard_bytes} bytes"
            )
        expires = now + ttl_ms if ttl_ms else 0
        if self.log is not None:
            version = self.log.next_offset
            payload = encode_record(CacheRecord(Kind.PUT, key, value, version, expires))
            offset = self._append([payload])
            record_bytes = batch_size(0, 1, len(payload))
        else:
            version = offset = self._version()
            record_bytes = 0
        entry = Entry(value, version, expires, offset, size, record_bytes)
        self._store(key, entry)
        if expires:
            heapq.heappush(self._expiry, (expires, key, version))
            self._trim_expiry_heap()
        self._notify(Change(key, value, offset, expires))
        self._evict_over_bound(keep=key)
        return entry

    def delete(self, key: str, now: int) -> tuple[Entry | None, int | None]:
        """Remove the key. Returns the removed live entry (None when there was none or
        it had expired) and the offset of the tombstone written (None if nothing was)."""
        entry = self.entries.get(key)
        if entry is None:
            return None, None
        offset = self._remove(key)
        expired = bool(entry.expires_at_ms and entry.expires_at_ms <= now)
        return (None if expired else entry), offset

    def put_if(
        self, key: str, value: bytes, ttl_ms: int | None, version: int | None, now: int
    ) -> tuple[bool, int | None, int | None]:
        """Put when the key is absent (`version` None) or at `version`.

        Returns (applied, version, offset): applied, the version written; refused,
        the current version or None; offset is the record to wait durable for.
        """
        current = self.live(key, now)
        at = current.version if current is not None else None
        if at != version:
            return False, at, None
        entry = self.put(key, value, ttl_ms, now)
        return True, entry.version, entry.offset

    def delete_if(self, key: str, version: int, now: int) -> tuple[bool, int | None, int | None]:
        """Delete when the key is at `version`; returns (applied, current version, offset)."""
        current = self.live(key, now)
        if current is None or current.version != version:
            return False, (current.version if current is not None else None), None
        _entry, offset = self.delete(key, now)
        return True, None, offset

    def counter_add(self, key: str, delta: int) -> tuple[int, int | None]:
        """Add `delta`; returns the new sum and the offset to wait durable for.

        Raises OverflowError when the sum leaves the i64 range (nothing changes).
        """
        old = self.counters.get(key)
        total = (old.total if old is not None else 0) + delta
        if not _I64_MIN <= total <= _I64_MAX:
            raise OverflowError(f"counter {key!r} would leave the 64-bit range")
        offset: int | None = None
        record_bytes = 0
        if self.log is not None:
            payload = encode_counter(key, total)
            offset = self._append([payload])
            record_bytes = batch_size(0, 1, len(payload))
        if old is not None:
            self.live_record_bytes -= old.record_bytes
        self.counters[key] = _Counter(total, offset if offset is not None else 0, record_bytes)
        self.live_record_bytes += record_bytes
        return total, offset

    # -- durability ---------------------------------------------------------------------

    async def wait_durable(self, offset: int | None) -> None:
        if self.log is not None and offset is not None:
            await self.log.wait_durable(offset)

    async def settle(self, key: str) -> None:
        """Wait until what was accepted for `key` is durable, before a conditional
        write checks it (K4). A no-op unless the fsync mode is on_commit."""
        log = self.log
        if log is None or log.config.fsync_mode is not FsyncMode.ON_COMMIT:
            return
        if log.durable_offset < log.next_offset:
            await log.wait_durable(log.next_offset - 1)
        entry = self.entries.get(key)
        while entry is not None and entry.offset >= log.durable_offset:
            await log.wait_durable(entry.offset)
            entry = self.entries.get(key)

    # -- TTL --------------------------------------------------------------------------

    def expire_due(self, now: int) -> int:
        """Write deletes for up to `ttl_deletes_per_pass` expired entries; returns how many."""
        done = 0
        while self._expiry and done < self.limits.ttl_deletes_per_pass:
            expires, key, version = self._expiry[0]
            if expires > now:
                break
            heapq.heappop(self._expiry)
            entry = self.entries.get(key)
            if entry is None or entry.version != version or entry.expires_at_ms != expires:
                continue  # overwritten or deleted since
            self._remove(key)
            done += 1
        return done

    def expired(self, now: int, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` entries whose TTL passed, as (key, version), earliest deadline
        first; nothing changes (a replicated shard's leader writes their deletes)."""
        found: list[tuple[str, int]] = []
        kept: list[tuple[int, str, int]] = []
        while self._expiry and len(found) < limit:
            item = self._expiry[0]
            expires, key, version = item
            if expires > now:
                break
            heapq.heappop(self._expiry)
            entry = self.entries.get(key)
            if entry is None or entry.version != version or entry.expires_at_ms != expires:
                continue  # overwritten or deleted since
            found.append((key, version))
            kept.append(item)
        for item in kept:  # still there until its delete is applied
            heapq.heappush(self._expiry, item)
        return found

    def _trim_expiry_heap(self) -> None:
        # Overwritten TTL entries leave stale heap items; rebuild before they pile up.
        if len(self._expiry) > 2 * len(self.entries) + 1024:
            self._expiry = [
                (e.expires_at_ms, k, e.version) for k, e in self.entries.items() if e.expires_at_ms
            ]
            heapq.heapify(self._expiry)

    # -- watches ------------------------------------------------------------------------

    def register(self, watcher: Watcher) -> None:
        if watcher.key is not None:
            self._key_watchers.setdefault(watcher.key, set()).add(watcher)
        else:
            self._prefix_watchers.add(watcher)

    def unregister(self, watcher: Watcher) -> None:
        if watcher.key is not None:
            watchers = self._key_watchers.get(watcher.key)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._key_watchers[watcher.key]
        else:
            self._prefix_watchers.discard(watcher)

    def snapshot(self, watcher: Watcher, now: int) -> list[Change]:
        """The current live values a watch matches, as changes at their versions."""
        if watcher.key is not None:
            entry = self.live(watcher.key, now)
            items = [] if entry is None else [(watcher.key, entry)]
        else:
            items = [(k, e) for k, e in self.entries.items() if watcher.matches(k)]
            items = [(k, e) for k, e in items if self.live(k, now) is not None]
        return [Change(k, e.value, e.version, e.expires_at_ms) for k, e in items]

    def _notify(self, change: Change) -> None:
        for watcher in self._key_watchers.get(change.key, ()):
            watcher.offer(change)
        for watcher in self._prefix_watchers:
            if watcher.matches(change.key):
                watcher.offer(change)

    # -- compaction ---------------------------------------------------------------------

    @property
    def wants_compaction(self) -> bool:
        log = self.log
        if log is None or self.compacting or log.segment_count < 2:
            return False
        size = log.size_bytes
        limits = self.limits
        return size > limits.compact_min_bytes and size > limits.compact_ratio * max(
            1, self.live_record_bytes
        )

    async def compact(self) -> int:
        """Copy every live entry and counter written before the tail forward, then
        delete the sealed segments left holding only superseded records.

        Returns the segments deleted. Writes go on meanwhile: an entry written
        again during the copy already has a record past the cut and is skipped.
        """
        log = self.log
        assert log is not None
        self.compacting = True
        try:
            cut = log.next_offset
            # Every record before the cut has a timestamp below `stamp`, every
            # record from here on one at or above it; retention by age at `stamp`
            # then removes exactly the segments wholly before the cut.
            stamp = max(_now_us(), self._last_stamp_us + 1)
            self._last_stamp_us = stamp
            keys = [k for k, e in self.entries.items() if e.offset < cut]
            for start in range(0, len(keys), _COPY_BATCH):
                self._copy_entries(keys[start : start + _COPY_BATCH], cut)
                await asyncio.sleep(0)
            names = [k for k, c in self.counters.items() if c.offset < cut]
            for start in range(0, len(names), _COPY_BATCH):
                self._copy_counters(names[start : start + _COPY_BATCH], cut)
                await asyncio.sleep(0)
            # The copies must be on disk before the originals go.
            if log.needs_sync:
                await log.sync()
            deleted = log.apply_retention(Retention(max_age_us=0), now_us=stamp)
            _log.info(
                "cache shard %s compacted: %d segments deleted, offsets now [%d, %d)",
                self.name,
                deleted,
                log.start_offset,
                log.next_offset,
            )
            return deleted
        finally:
            self.compacting = False

    def _copy_entries(self, keys: list[str], cut: int) -> None:
        moving: list[tuple[Entry, bytes]] = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None or entry.offset >= cut:
                continue
            record = CacheRecord(Kind.COPY, key, entry.value, entry.version, entry.expires_at_ms)
            moving.append((entry, encode_record(record)))
        if not moving:
            return
        first = self._append([payload for _entry, payload in moving])
        for i, (entry, _payload) in enumerate(moving):
            entry.offset = first + i

    def _copy_counters(self, names: list[str], cut: int) -> None:
        moving: list[tuple[_Counter, bytes]] = []
        for name in names:
            found = self.counters.get(name)
            if found is None or found.offset >= cut:
                continue
            moving.append((found, encode_counter(name, found.total)))
        if not moving:
            return
        first = self._append([payload for _counter, payload in moving])
        for i, (found, _payload) in enumerate(moving):
            found.offset = first + i

    # -- internals ------------------------------------------------------------------

    def _append(self, payloads: list[bytes]) -> int:
        assert self.log is not None
        stamp = max(_now_us(), self._last_stamp_us)
        offset = self.log.append(payloads, timestamp_us=stamp)
        self._last_stamp_us = stamp
        return offset

    def _version(self) -> int:
        self._next_version += 1
        return self._next_version

    def _store(self, key: str, entry: Entry) -> None:
        self._drop(key)
        self.entries[key] = entry
        self.bytes_used += entry.size
        self.live_record_bytes += entry.record_bytes

    def _drop(self, key: str) -> Entry | None:
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes_used -= old.size
            self.live_record_bytes -= old.record_bytes
        return old

    def _remove(self, key: str) -> int:
        """Delete a present key: tombstone first (log-backed), then index, then watches."""
        if self.log is not None:
            offset = self._append([encode_record(CacheRecord(Kind.DELETE, key))])
        else:
            offset = self._version()
        self._drop(key)
        self._notify(Change(key, None, offset))
        return offset

    def _evict_over_bound(self, keep: str | None) -> None:
        while self.bytes_used > self.limits.max_shard_bytes and self.entries:
            victim = next(iter(self.entries))
            if victim == keep:
                if len(self.entries) == 1:
                    return
                self.entries.move_to_end(victim)
                continue
            try:
                self._remove(victim)
            except StorageError:
                # The put that got here is already written; the bound is restored
                # by a later write once the log works again.
                _log.exception("cache shard %s: eviction could not be written", self.name)
                return
            self._evictions.inc()


def _entry_size(key: str, value: bytes) -> int:
    return len(key.encode()) + len(value) + ENTRY_OVERHEAD
