"""Replicated (Quorum) caches and counters: a cache shard's writes as a replicated log.

A cache with `consistency: Quorum` and a replication factor above 1 runs every
write of each shard through the same replication core as a Quorum stream (one
`ReplicaDriver` per cache shard per replica, the same peer messages, fencing,
quorum mark, `quorum_timeout`, promotion only of a caught-up replica). What a
cache adds is what an entry means and how it is applied:

- **An entry is one write** (`ReplicatedCacheOp`, spec/fleet.yaml): put, delete,
  put_if, delete_if, counter_add, or the leader's TTL `expire`, with the leader's
  wall clock at admission (`now_ms`). Every replica applies committed entries in
  log order to its own `CacheShard` (`CacheApplier`), so a condition is checked
  at the op's place in the log (two racing `absent` puts: the first committed
  wins, the other is answered `applied: false`), TTL deadlines are the leader's,
  and counter sums are exact.
- **The cache shard is derived state.** Its log lives under the replica's folder
  (``state/``, fsync mode none) and is rebuilt from the committed replication log
  every time the replica opens (the folder is emptied first), so a version (the
  offset of the put in that log) is the same number on every replica, and a
  crash never leaves it ahead of or behind the replication log. The cache
  service serves that shard (`CacheService.adopt`). The replication log of a
  cache shard is therefore never compacted (`compact_every` past any count): a
  snapshot to rebuild from is not implemented, so the log and a restart's
  replay grow with the shard's history.
- **Acknowledgement** (`CacheReplication.write`): once a majority holds the op
  durably and this replica applied it; the answer (the version written, the
  value deleted, the counter's new sum, a condition's result) is the one its
  application gave. No majority within FELIX_PUBLISH_QUORUM_TIMEOUT_MS:
  `quorum_timeout` (outcome unknown: it may still commit).
- **Reads** (get, counter_get, watch) are served only by the open leader, under
  its lease (`read_refusal`); with FELIX_QUORUM_READS=majority and
  ``lease_free_reads`` finalized, a get or counter_get is also confirmed by a
  majority read round before it is answered (`confirm_read`, reads.py). A
  replica that is not the leader answers `not_leader`; one named leader but
  still fencing or without a mark at its generation
  `shard_unavailable/not_ready`; one whose lease lapsed
  `shard_unavailable/fenced`. What it serves is what was applied, i.e.
  committed: never past the mark. Reads do not change the shard's recency order
  (eviction by the memory bound is a function of the writes alone, the same on
  every replica).
- **TTL**: only the leader expires entries, by appending `expire` ops (at most
  `CacheLimits.ttl_deletes_per_pass` per shard per pass, once a pass interval);
  an `expire` deletes the key only while it still holds the version that expired.
  Replicas never expire on their own clock, and replicated shards are never
  compacted by the cache service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from felix_broker.cache.shard import CacheLimits, CacheShard, EntryTooLargeError, now_ms
from felix_broker.catalog import CacheSpec, Catalog
from felix_broker.config import FsyncMode
from felix_broker.fleet.peer import PeerDialer
from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import CacheOpKind, ReplicatedCacheOp

from .core import Config, Effect, Entry
from .disk import ReplicaDisk
from .driver import ReplicaDriver, ReplicationRefusedError
from .manager import follow_route
from .reads import ReadRounds
from .service import Blocked, ReplicationService, peer_sender

__all__ = [
    "CacheApplier",
    "CacheOutcome",
    "CacheReplication",
    "CacheShards",
    "decode_op",
    "encode_op",
]

_log = logging.getLogger(__name__)

_SETTLING: tuple[ErrorCode, str | None] = (ErrorCode.SHARD_UNAVAILABLE, "not_ready")
_SETTLING_ERROR = (ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "not_ready")
# A cache shard's replication log is its only history: never compacted (see the module docs).
_NEVER_COMPACT = 1 << 62
# Outcomes of applied ops kept for the writers waiting on them (leader only). A writer
# takes its outcome as soon as its ack resolves; the bound only stops a leak.
_OUTCOMES_MAX = 65536

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ReplicatedCacheOp)


def encode_op(op: ReplicatedCacheOp) -> bytes:
    return _encoder.encode(op)


def decode_op(payload: bytes) -> ReplicatedCacheOp:
    return _decoder.decode(payload)


@dataclass(frozen=True, slots=True)
class CacheOutcome:
    """What applying one op gave: the answer its writer gets."""

    applied: bool = True
    version: int | None = None  # put: the version written; conditions: the current one
    value: bytes | None = None  # delete: the value removed
    total: int | None = None  # counter_add: the new sum
    error: tuple[ErrorCode, str] | None = None  # refused at its place in the log


class CacheShards:
    """What the cache service gives replication: its limits and eviction counter (so a
    replica's shard is bounded like any), and the seam to serve a replica's shard."""

    def __init__(
        self,
        limits: CacheLimits,
        evictions: Any,
        adopt: Callable[[CacheSpec, int, CacheShard], Awaitable[None]],
        release: Callable[[CacheSpec, int], Awaitable[None]],
    ) -> None:
        self.limits = limits
        self.evictions = evictions
        self.adopt = adopt
        self.release = release


class CacheApplier:
    """Applies committed ops to one replica's cache shard (the driver's `Applier`).

    The shard starts empty at every open and receives every committed op from the
    replication log's first record, so nothing of it is held before: see the
    module docs. Each applied op's outcome is kept (leader only, bounded) under
    the number `apply` returns for it, which the driver hands back to the writer
    (`Written.stream_offset`)."""

    def __init__(self, shard: CacheShard, leading: Callable[[], bool]) -> None:
        if shard.log is None:
            raise ValueError("a replicated cache shard needs its log (durable storage)")
        shard.replicated = True
        self.shard = shard
        self._leading = leading
        self._applied = 0
        self._outcomes: OrderedDict[int, CacheOutcome] = OrderedDict()

    def applied_entries(
        self, entries: Sequence[Entry], records_below: int, tails: list[int] | None = None
    ) -> int:
        return 0  # rebuilt from the first record: nothing is applied at open

    async def cut(self, records: int) -> None:
        # A replicated cache applies committed ops only (never above the commit mark),
        # and the commit mark is never truncated.
        raise ValueError("a replicated cache shard never applies what a truncation cuts")

    def records_of(self, entry: Entry) -> int:
        return 0  # never compacted, so never weighed

    def take(self, number: int | None) -> CacheOutcome | None:
        return None if number is None else self._outcomes.pop(number, None)

    async def apply(
        self, entries: Sequence[Entry], tails: list[int] | None = None
    ) -> list[int | None]:
        numbers: list[int | None] = []
        keep = self._leading()
        for entry in entries:
            if tails is not None:
                tails.append(self._applied)
            if entry.start:
                numbers.append(None)
                continue
            outcome = self._apply(decode_op(entry.payload))
            self._applied += 1
            numbers.append(self._applied)
            if keep:
                self._outcomes[self._applied] = outcome
                while len(self._outcomes) > _OUTCOMES_MAX:
                    self._outcomes.popitem(last=False)
        return numbers

    def _apply(self, op: ReplicatedCacheOp) -> CacheOutcome:
        """One op on the shard: deterministic given the shard and the op (every
        replica computes the same outcome). A storage error raises (the replica stops)."""
        shard, key, now = self.shard, op.key, op.now_ms
        kind = op.op
        try:
            if kind is CacheOpKind.PUT:
                entry = shard.put(key, op.value or b"", op.ttl_ms, now)
                return CacheOutcome(version=entry.version)
            if kind is CacheOpKind.DELETE:
                removed, _offset = shard.delete(key, now)
                return CacheOutcome(value=removed.value if removed is not None else None)
            if kind is CacheOpKind.PUT_IF:
                applied, version, _offset = shard.put_if(
                    key, op.value or b"", op.ttl_ms, op.version, now
                )
                return CacheOutcome(applied=applied, version=version)
            if kind is CacheOpKind.DELETE_IF:
                applied, version, _offset = shard.delete_if(key, op.version or 0, now)
                return CacheOutcome(applied=applied, version=version)
            if kind is CacheOpKind.COUNTER_ADD:
                total, _offset = shard.counter_add(key, op.delta or 0)
                return CacheOutcome(total=total)
            # expire: the leader's TTL delete, only of the version that expired
            current = shard.entries.get(key)
            if current is None or current.version != op.version:
                return CacheOutcome(applied=False)
            shard.delete(key, now)
            return CacheOutcome()
        except EntryTooLargeError as exc:
            return CacheOutcome(applied=False, error=(ErrorCode.LIMIT_EXCEEDED, str(exc)))
        except OverflowError as exc:
            return CacheOutcome(applied=False, error=(ErrorCode.INVALID_REQUEST, str(exc)))


@dataclass(slots=True)
class _Replica:
    spec: CacheSpec
    index: int
    driver: ReplicaDriver
    applier: CacheApplier


class CacheReplication:
    """A fleet member's replicas of Quorum cache shards: follows the routing view like
    `ReplicationManager` does for streams, sharing its `ReplicationService` (peer
    handlers: drivers are keyed by shard id, kind included) and its refusal reports."""

    def __init__(
        self,
        view: FleetView,
        catalog: Callable[[], Catalog],
        caches: CacheShards,
        dialer: PeerDialer,
        root: Path,
        config: Config,
        service: ReplicationService,
        *,
        blocked: Blocked | None = None,
        on_event: Callable[[ShardId, Effect], None] | None = None,
    ) -> None:
        self._view = view
        self._catalog = catalog
        self._caches = caches
        self._dialer = dialer
        self._root = root
        self._config = config
        self._service = service
        self._blocked = blocked
        self._on_event = on_event
        self._replicas: dict[ShardId, _Replica] = {}
        self.reads: ReadRounds | None = None  # majority read rounds (set by the broker)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def node_id(self) -> str:
        return self._view.snapshot.node_id

    def start(self) -> None:
        self._view.add_listener(lambda _old, _new: self._wake.set())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow(), name="cache-replication"))
        self._tasks.append(loop.create_task(self._expiry(), name="cache-replication-ttl"))
        self._wake.set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for shard in list(self._replicas):
            await self._drop(shard)

    def driver(self, shard: ShardId) -> ReplicaDriver | None:
        held = self._replicas.get(shard)
        return held.driver if held is not None else None

    # -- the cache service's hooks

    def read_refusal(self, spec: CacheSpec, index: int) -> tuple[ErrorCode, str | None] | None:
        """Why reads of a replicated cache shard are refused here (None: served)."""
        shard = _shard_id(spec, index)
        driver = self.driver(shard)
        refused = (ErrorCode.NOT_LEADER, None) if driver is None else driver.refusal()
        if refused is not None and refused[0] is ErrorCode.NOT_LEADER and self._named(shard):
            return _SETTLING
        return refused

    def reads_need_round(self) -> bool:
        """Whether gets and counter_gets wait for a majority read round now."""
        return self.reads is not None and self.reads.active

    async def confirm_read(self, spec: CacheSpec, index: int) -> None:
        """After a read's value was taken (`read_refusal` passed): returns once a
        majority read round confirmed this leader, when rounds are on; raises
        ReplicationRefusedError (leadership_lost) when the round failed."""
        driver = self.driver(_shard_id(spec, index))
        if self.reads is None or driver is None or not self.reads.active:
            return
        await self.reads.confirm(driver)

    async def write(self, spec: CacheSpec, index: int, op: ReplicatedCacheOp) -> CacheOutcome:
        """One write, acknowledged at the quorum mark once applied here; raises
        ReplicationRefusedError (not_leader, fenced, not_ready, quorum_timeout,
        leadership_lost)."""
        shard = _shard_id(spec, index)
        held = self._replicas.get(shard)
        if held is None:
            if self._named(shard):
                raise ReplicationRefusedError(
                    ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "not_ready"
                )
            raise ReplicationRefusedError(ErrorCode.NOT_LEADER, RetryClass.REDIRECT)
        try:
            written = await held.driver.append([encode_op(op)])
        except ReplicationRefusedError as exc:
            if exc.code is ErrorCode.NOT_LEADER and self._named(shard):
                raise ReplicationRefusedError(*_SETTLING_ERROR) from None
            raise
        outcome = held.applier.take(written.stream_offset)
        if outcome is None:  # applied while this replica was not leading (cannot be lost)
            raise ReplicationRefusedError(
                ErrorCode.LEADERSHIP_LOST, RetryClass.OUTCOME_UNKNOWN, "outcome_dropped"
            )
        return outcome

    # -- following the view

    def _named(self, shard: ShardId) -> bool:
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        return route is not None and route.leader == snapshot.node_id

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile(self._view.snapshot)
            except Exception:
                _log.exception("cache replication: reconciling with the routing view failed")

    async def _reconcile(self, snapshot: RoutingSnapshot) -> None:
        me = snapshot.node_id
        catalog = self._catalog()
        wanted: set[ShardId] = set()
        for shard, route in snapshot.routes.items():
            if shard.kind is not ShardKind.CACHE or me not in route.replicas:
                continue
            spec = catalog.cache(shard.tenant, shard.namespace, shard.name)
            if spec is None or not spec.replicated or shard.shard >= spec.shards:
                continue
            wanted.add(shard)
            held = self._replicas.get(shard) or await self._open(shard, spec, route.replicas)
            await follow_route(held.driver, route, me)
        for shard in set(self._replicas) - wanted:
            await self._drop(shard)

    async def _open(self, shard: ShardId, spec: CacheSpec, replicas: tuple[str, ...]) -> _Replica:
        folder = self._root / "@cache" / shard.tenant / shard.namespace / shard.name
        folder = folder / str(shard.shard)
        state = folder / "state"
        limits = self._caches.limits

        def rebuild() -> CacheShard:
            shutil.rmtree(state, ignore_errors=True)  # derived: rebuilt from the log
            return CacheShard.open(
                f"{spec.tenant_id}/{spec.namespace}/{spec.name}/{shard.shard}",
                state,
                limits=limits,
                evictions=self._caches.evictions,
                fsync_mode=FsyncMode.NONE,
            )

        cache_shard = await asyncio.to_thread(rebuild)
        members = self._view.snapshot.members

        def address_of(node: str) -> str | None:
            member = self._view.snapshot.members.get(node) or members.get(node)
            return member.peer_addr if member is not None else None

        holder: list[ReplicaDriver] = []

        def leading() -> bool:
            return bool(holder) and holder[0].replica.accepts_writes

        applier = CacheApplier(cache_shard, leading)
        driver = ReplicaDriver.open(
            shard,
            self.node_id,
            replicas,
            ReplicaDisk(folder, compact_every=_NEVER_COMPACT),
            peer_sender(self._dialer, address_of, self._blocked),
            config=self._config,
            applier=applier,
            on_event=self._on_event,
        )
        holder.append(driver)
        held = _Replica(spec, shard.shard, driver, applier)
        self._replicas[shard] = held
        self._service.add(driver)
        driver.start()
        await self._caches.adopt(spec, shard.shard, cache_shard)
        return held

    async def _drop(self, shard: ShardId) -> None:
        held = self._replicas.pop(shard, None)
        if held is None:
            return
        self._service.remove(shard)
        await held.driver.close()
        await self._caches.release(held.spec, held.index)

    # -- TTL: the leader writes expiry as ops

    async def _expiry(self) -> None:
        interval = self._caches.limits.ttl_pass_interval
        while True:
            await asyncio.sleep(interval)
            for shard, held in list(self._replicas.items()):
                if held.driver.refusal() is not None:
                    continue  # only the open leader expires
                due = held.applier.shard.expired(now_ms(), self._caches.limits.ttl_deletes_per_pass)
                if not due:
                    continue
                now = now_ms()
                ops = [
                    encode_op(
                        ReplicatedCacheOp(
                            op=CacheOpKind.EXPIRE, key=key, now_ms=now, version=version
                        )
                    )
                    for key, version in due
                ]
                with contextlib.suppress(ReplicationRefusedError):
                    await held.driver.append(ops)  # refused: the next pass asks again
                _log.debug("cache replication: %s: %d expiry deletes", shard, len(ops))


def _shard_id(spec: CacheSpec, index: int) -> ShardId:
    return ShardId(ShardKind.CACHE, spec.tenant_id, spec.namespace, spec.name, index)
