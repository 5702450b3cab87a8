"""The cache service: keys with values, TTLs and versions, counters and watches.

Scope: (tenant, namespace, cache, key); a key lives on shard
`shard_for_key(key, shards, CACHE_MODE)` of its cache. The state of each shard
is a `CacheShard` (cache_shard.py, which also says the memory bound, eviction
and compaction policies); this module answers requests and runs watches.

Requests. Every request is answered on the stream it came on and carries its
request_id, so many may be in flight on one stream: each is registered as a
concurrent handler (session/dispatch.py), runs as its own task under the
connection's request bound, and answers go out in completion order. Nothing here blocks the
event loop for long; a request waits only for the durability of its own write.

Conditional writes. The check and the write are one synchronous step on the
shard (no await between them), so they are atomic per key and two racing
`absent` puts cannot both apply. Under fsync mode on_commit the key's pending
writes are waited for first (K4).

Durable storage (config.durable_enabled): each shard has a log under
`<durable_storage_dir>/@cache/<tenant>/<namespace>/<cache>/<shard>/` ("@" is
outside the catalog's name alphabet, so no stream log can land there); a
version is the offset of the write that set it; counters and watches are
served (FEATURE_COUNTERS, FEATURE_CACHE_WATCH, FEATURE_CACHE_WATCH_RETAINED).
Without it the cache is in memory, versions count up from the wall clock in
microseconds, and counters and watches are not served.

TTL. An expired entry reads as absent at once. A pass every
`CacheLimits.ttl_pass_interval` (1 s) writes deletes for expired entries, at
most `ttl_deletes_per_pass` (1024) per shard per pass (K5), so watches
see expiry as a change.

Watches. `cache_watch_started` on the request stream, then a broker-opened
unidirectional stream: `event_stream_hello`, then retained or resnapshot values,
then the replay `[from_offset, tail)` (from the log; compaction copies are not
changes and are skipped), then live changes. The watch registers with its
shard before the tail is read, in the same synchronous step, so replay and
live meet without gap or duplicate. Its queue holds `watch_queue_capacity`
changes; past that it lags (cache_watch.py). It ends on STOP_SENDING, when the
connection goes, or when the service closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from prometheus_client import Counter

from felix_broker.cache.records import Kind, decode_record
from felix_broker.cache.shard import (
    ENTRY_OVERHEAD,
    CacheLimits,
    CacheShard,
    Entry,
    EntryTooLargeError,
    now_ms,
)
from felix_broker.cache.watch import Change, Watcher
from felix_broker.catalog import CacheSpec, Catalog
from felix_broker.config import BrokerConfig, FsyncMode
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.driver import ReplicationRefusedError
from felix_broker.session.context import RequestContext
from felix_broker.session.dispatch import DispatchTable, Handler
from felix_broker.session.protocol import StreamProtocol
from felix_broker.storage import OffsetOutOfRangeError, StorageError
from felix_broker.storage.paths import log_dir
from felix_common.permissions import Action, cache_object
from felix_transport import Stream, StreamClosedError
from felix_transport.events import ConnectionClosedError
from felix_wire.codec import encode_frame
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import Feature
from felix_wire.fleet import CacheOpKind, ReplicatedCacheOp
from felix_wire.messages import (
    CacheConditionResult,
    CacheDelete,
    CacheDeleteIf,
    CacheEvent,
    CacheGet,
    CacheOk,
    CachePut,
    CachePutIf,
    CacheValue,
    CacheWatch,
    CacheWatchLagged,
    CacheWatchStarted,
    CounterAdd,
    CounterGet,
    CounterValue,
    CursorErrorReason,
    ErrorDetail,
    EventStreamHello,
    ShardMoved,
    SubscribeCursorError,
    Unsupported,
    VersionCondition,
)
from felix_wire.routing import CACHE_MODE, shard_for_key

__all__ = ["WATCH_ID_BASE", "CacheLimits", "CacheService"]

_log = logging.getLogger(__name__)

AnyCacheRequest = (
    CachePut
    | CacheGet
    | CacheDelete
    | CachePutIf
    | CacheDeleteIf
    | CounterAdd
    | CounterGet
    | CacheWatch
)
R = TypeVar("R", bound=AnyCacheRequest)

# Watch ids share the connection's event-stream hellos with the engine's
# subscription ids, which count from 1; starting far above keeps them apart.
WATCH_ID_BASE = 1 << 40
# Changes per write on a watch's event stream.
_EVENT_BATCH = 256
_REPLAY_RECORDS = 512
_REPLAY_BYTES = 1024 * 1024

_MEMORY_FEATURES = int(Feature.FEATURE_CACHE_DELETE | Feature.FEATURE_CACHE_CONDITIONAL)
_DURABLE_FEATURES = _MEMORY_FEATURES | int(
    Feature.FEATURE_CACHE_WATCH | Feature.FEATURE_CACHE_WATCH_RETAINED | Feature.FEATURE_COUNTERS
)


class _Refused(Exception):
    """A request refused with an error frame."""

    def __init__(
        self,
        code: ErrorCode,
        text: str,
        *,
        retry: RetryClass | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.retry = retry
        self.reason = reason

    def frame(self, proto: StreamProtocol) -> bytes:
        detail = ErrorDetail(reason=self.reason) if self.reason else None
        return proto.error(self.code, self.text, retry=self.retry, detail=detail)


class Outcome(Protocol):
    """What applying one replicated write gave (felix_broker/replication/cache.py)."""

    @property
    def applied(self) -> bool: ...
    @property
    def version(self) -> int | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def total(self) -> int | None: ...
    @property
    def error(self) -> tuple[ErrorCode, str] | None: ...


class ReplicatedCaches(Protocol):
    """A fleet member's replication of Quorum caches (`CacheReplication`): the write
    path and the read gate of their shards."""

    def read_refusal(self, spec: CacheSpec, index: int) -> tuple[ErrorCode, str | None] | None: ...

    def reads_need_round(self) -> bool: ...

    async def confirm_read(self, spec: CacheSpec, index: int) -> None: ...

    async def write(self, spec: CacheSpec, index: int, op: ReplicatedCacheOp) -> Outcome: ...


class CacheService:
    """Every cache this broker serves. The server must call `start()` after
    construction (recovery, TTL pass, periodic fsync) and `close()` at stop."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        catalog: Catalog,
        metrics: BrokerMetrics,
        limits: CacheLimits | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self.limits = limits or CacheLimits()
        self._shards: dict[tuple[str, str, str, int], CacheShard] = {}
        self._watch_ids = itertools.count(WATCH_ID_BASE)
        self._watchers: set[Watcher] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._fsync = metrics.timed_fsync()
        # A fleet member's replication of Quorum caches (RF > 1); None: every cache is
        # written here directly (standalone, or Leader caches).
        self.replication: ReplicatedCaches | None = None
        registry = metrics.registry
        self.evictions = Counter(
            "felix_cache_evictions",
            "Cache entries evicted by the memory bound (least recently used first).",
            registry=registry,
        )
        self.expirations = Counter(
            "felix_cache_expirations",
            "Expired cache entries deleted by the TTL pass.",
            registry=registry,
        )
        self.watch_lags = Counter(
            "felix_cache_watch_lagged",
            "Cache watches ended with cache_watch_lagged (their queue overflowed).",
            registry=registry,
        )

    def failed_logs(self) -> int:
        """Open cache logs in the failed state (they take no writes until restart)."""
        return sum(1 for s in self._shards.values() if s.log is not None and s.log.failed)

    @property
    def durable(self) -> bool:
        return self._config.durable_enabled

    @property
    def features(self) -> int:
        """Feature bits this service answers (watches and counters need the log)."""
        return _DURABLE_FEATURES if self.durable else _MEMORY_FEATURES

    def committed_offsets(self) -> dict[tuple[str, str, str, int], int]:
        """Per log-backed cache shard: one past the last record a reader may see.

        Counters live in the same log as the entries, so ``/backup/offsets``
        names only ``records``.
        """
        return {
            scope: shard.log.readable_offset
            for scope, shard in self._shards.items()
            if shard.log is not None
        }

    # -- life cycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Recover every catalogued cache's shards from their logs (off the event loop),
        then start the TTL pass and, in fsync mode periodic, the fsync timer.

        Idempotent; a request before `start` opens its shard on first use.
        """
        if self._started or self._closed:
            return
        self._started = True
        if self.durable:
            for spec in self._catalog.caches():
                for index in range(spec.shards):
                    scope = (spec.tenant_id, spec.namespace, spec.name, index)
                    if scope not in self._shards:
                        self._shards[scope] = await asyncio.to_thread(self._open_shard, spec, index)
        self._run(self._every(self.limits.ttl_pass_interval, self._ttl_pass), "cache-ttl")
        if self.durable and self._config.durable_fsync_mode is FsyncMode.PERIODIC:
            self._run(self._every(self.limits.fsync_interval, self._sync_pass), "cache-fsync")

    async def close(self) -> None:
        """End every watch, stop upkeep, sync and close every log. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for watcher in list(self._watchers):
            watcher.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        shards = list(self._shards.values())
        self._shards.clear()
        results = await asyncio.gather(*(s.close() for s in shards), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                _log.error("closing a cache shard failed: %s", result)

    def _run(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _every(self, interval: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await action()
            except Exception:
                # One failed pass must not end the upkeep of every other shard.
                _log.exception("cache upkeep pass failed")

    async def _ttl_pass(self) -> None:
        now = now_ms()
        for shard in list(self._shards.values()):
            if shard.replicated:
                continue  # its leader writes expiry through replication
            try:
                expired = shard.expire_due(now)
            except StorageError as exc:
                _log.error("cache shard %s: TTL deletes failed: %s", shard.name, exc)
                continue
            if expired:
                self.expirations.inc(expired)
            self._maybe_compact(shard)

    async def _sync_pass(self) -> None:
        pending = [
            s.log.sync() for s in self._shards.values() if s.log is not None and s.log.needs_sync
        ]
        await asyncio.gather(*pending, return_exceptions=True)

    def _maybe_compact(self, shard: CacheShard) -> None:
        if shard.wants_compaction and not self._closed and not shard.replicated:
            # Marked now, not when the task first runs, so the writes before that
            # do not start a second compaction of the same shard.
            shard.compacting = True
            self._run(self._compact(shard), f"cache-compact-{shard.name}")

    async def _compact(self, shard: CacheShard) -> None:
        try:
            await shard.compact()
        except StorageError as exc:
            _log.error("cache shard %s: compaction failed: %s", shard.name, exc)

    # -- shards ---------------------------------------------------------------------

    def _open_shard(self, spec: CacheSpec, index: int) -> CacheShard:
        name = f"{spec.tenant_id}/{spec.namespace}/{spec.name}/{index}"
        if not self.durable:
            return CacheShard(name, limits=self.limits, evictions=self.evictions)
        root = self._config.durable_storage_dir
        assert root is not None
        directory = log_dir(root, "cache", spec.tenant_id, spec.namespace, spec.name, index)
        return CacheShard.open(
            name,
            directory,
            limits=self.limits,
            evictions=self.evictions,
            fsync_mode=self._config.durable_fsync_mode,
            fsync=self._fsync,
        )

    def shard(self, spec: CacheSpec, index: int) -> CacheShard:
        """The shard, opened now (blocking file I/O, once) if `start` did not."""
        if self._closed:
            raise _Refused(ErrorCode.DRAINING, "the cache is shutting down")
        scope = (spec.tenant_id, spec.namespace, spec.name, index)
        found = self._shards.get(scope)
        if found is None:
            found = self._shards[scope] = self._open_shard(spec, index)
        return found

    async def release_shard(self, tenant_id: str, namespace: str, cache: str, index: int) -> None:
        """Forget one shard and close its log (it moved, or a move's copy is about to
        replace its files); its watches end. The next use opens it from disk again."""
        found = self._shards.pop((tenant_id, namespace, cache, index), None)
        if found is None:
            return
        for watcher in found.watchers():
            watcher.close()
        try:
            await found.close()
        except StorageError as exc:
            _log.error("closing a moved cache shard failed: %s", exc)

    async def adopt(self, spec: CacheSpec, index: int, shard: CacheShard) -> None:
        """Serve `shard` (a replica's, rebuilt from its replication log) for one shard of
        a replicated cache; the one held before is closed (its watches end)."""
        scope = (spec.tenant_id, spec.namespace, spec.name, index)
        previous = self._shards.get(scope)
        self._shards[scope] = shard
        if previous is not None and previous is not shard:
            for watcher in previous.watchers():
                watcher.close()
            try:
                await previous.close()
            except StorageError as exc:
                _log.error("closing a replaced cache shard failed: %s", exc)

    async def release(self, spec: CacheSpec, index: int) -> None:
        """`release_shard` by spec (a replica of a replicated cache shard went)."""
        await self.release_shard(spec.tenant_id, spec.namespace, spec.name, index)

    def shard_watches(self, key: tuple[str, str, str, int]) -> int:
        """How many watches of one shard are still open."""
        found = self._shards.get(key)
        return 0 if found is None else sum(1 for w in found.watchers() if not w.closed)

    def end_shard_watches(
        self, key: tuple[str, str, str, int], moved_to: tuple[str | None, str | None, int]
    ) -> int:
        """This broker stopped serving one shard: each watch on it ends after what is
        queued, with shard_moved (resume_from: the shard log's tail). Returns how many."""
        found = self._shards.get(key)
        if found is None:
            return 0
        tail = found.tail if found.log is not None else None
        watchers = found.watchers()
        for watcher in watchers:
            watcher.end_moved(*moved_to, tail)
        return len(watchers)

    def shard_of_key(self, spec: CacheSpec, key: str) -> CacheShard:
        return self.shard(spec, shard_for_key(key.encode(), spec.shards, CACHE_MODE))

    # -- requests -------------------------------------------------------------------

    def register(self, table: DispatchTable) -> None:
        """Every cache request runs as its own task (concurrent): answers go out in
        completion order, matched by request_id, so one slow request holds back no other."""
        read, write = Action.CACHE_READ, Action.CACHE_WRITE
        # A get is answered from memory: from the reader, without a task, while
        # a request slot is free (DispatchTable's ready path).
        table.register(
            CacheGet,
            self._handler(self._get, read),
            concurrent=True,
            ready=self._ready(self._get_now, read),
        )
        # A put whose log need not be synced before the answer (fsync modes none and
        # periodic, or an in-memory cache) is written and answered from the reader
        # too: its append is synchronous, so its answer is ready at once.
        table.register(
            CachePut,
            self._handler(self._put_request, write),
            concurrent=True,
            ready=self._ready(self._put_now, write),
        )
        table.register(CacheDelete, self._handler(self._delete, write), concurrent=True)
        table.register(CachePutIf, self._handler(self._put_if, write), concurrent=True)
        table.register(CacheDeleteIf, self._handler(self._delete_if, write), concurrent=True)
        # Counters and watches need the log; without it they are not advertised.
        table.register(
            CounterAdd, self._handler(self._counter_add, write, needs_log=True), concurrent=True
        )
        table.register(
            CounterGet, self._handler(self._counter_get, read, needs_log=True), concurrent=True
        )
        table.register(
            CacheWatch, self._handler(self._watch, read, needs_log=True), concurrent=True
        )

    def _handler(
        self,
        op: Callable[[CacheSpec, R, RequestContext], Awaitable[bytes | None]],
        action: Action,
        *,
        needs_log: bool = False,
    ) -> Handler[R]:
        """The request handler around `op`: admission, refusals and storage errors
        answered as error frames; `op` returns its answer (None: it answered itself)."""

        async def handle(request: R, ctx: RequestContext) -> None:
            proto = ctx.proto
            try:
                if needs_log and not self.durable:
                    await ctx.write(self._not_served(proto, request))
                    return
                try:
                    spec = self._admit(ctx, request, action)
                    answer = await op(spec, request, ctx)
                except _Refused as refused:
                    answer = refused.frame(proto)
                except StorageError as exc:
                    _log.error("cache request failed in storage: %s", exc)
                    answer = proto.error(ErrorCode.STORAGE, f"cache storage failed: {exc}")
                if answer is not None:
                    await ctx.write(answer)
            except (StreamClosedError, ConnectionClosedError):
                return  # the client went; nobody is left to answer

        return handle

    def _ready(
        self, op: Callable[[CacheSpec, R, RequestContext], bytes | None], action: Action
    ) -> Callable[[R, RequestContext], bytes | None]:
        """`_handler` for an `op` that does not wait: the same admission, refusals
        and storage errors, the answer returned instead of written (`op` returns
        None, before it changes anything, when it would have to wait)."""

        def ready(request: R, ctx: RequestContext) -> bytes | None:
            proto = ctx.proto
            try:
                return op(self._admit(ctx, request, action), request, ctx)
            except _Refused as refused:
                return refused.frame(proto)
            except StorageError as exc:
                _log.error("cache request failed in storage: %s", exc)
                return proto.error(ErrorCode.STORAGE, f"cache storage failed: {exc}")

        return ready

    def _admit(self, ctx: RequestContext, request: AnyCacheRequest, action: Action) -> CacheSpec:
        """The cache the request names, if this principal may do `action` on it."""
        principal = ctx.principal
        tenant, namespace, cache = request.tenant_id, request.namespace, request.cache
        if tenant != principal.tenant_id:
            raise _Refused(ErrorCode.FORBIDDEN, "forbidden: the token is for another tenant")
        spec = self._catalog.cache(tenant, namespace, cache)
        if spec is None:
            raise _Refused(
                ErrorCode.NOT_FOUND,
                f"cache not found: tenant={tenant} namespace={namespace} cache={cache}",
            )
        obj = cache_object(tenant, namespace, cache)
        if not principal.permissions.allows(action, obj):
            raise _Refused(ErrorCode.FORBIDDEN, f"forbidden: {action.value} on {obj}")
        return spec

    def _not_served(self, proto: StreamProtocol, request: AnyCacheRequest) -> bytes:
        """Counters and watches without durable storage: not advertised, so answered
        like any request this broker does not serve."""
        request_type = str(type(request).__struct_config__.tag)
        if proto.negotiated(Feature.FEATURE_UNSUPPORTED):
            rid = None if isinstance(request, CacheWatch) else request.request_id
            return proto.message(Unsupported(request_type=request_type, request_id=rid))
        return proto.error(
            ErrorCode.INVALID_REQUEST, f"{request_type} needs durable storage on this broker"
        )

    async def _get(self, spec: CacheSpec, request: CacheGet, ctx: RequestContext) -> bytes:
        answer = self._get_answer(spec, request, ctx)
        await self._confirm_read(spec, request.key)
        return answer

    def _get_now(self, spec: CacheSpec, request: CacheGet, ctx: RequestContext) -> bytes | None:
        """The answer from memory, or None when the read waits for a majority round."""
        if self._replicated(spec) and self._needs_round():
            return None  # the handler runs (`_get`): the round needs a task
        return self._get_answer(spec, request, ctx)

    def _needs_round(self) -> bool:
        return self.replication is not None and self.replication.reads_need_round()

    async def _confirm_read(self, spec: CacheSpec, key: str) -> None:
        """A replicated read confirmed by a majority round, when rounds are on
        (FELIX_QUORUM_READS=majority, lease_free_reads): see replication/reads.py."""
        if self.replication is None or not spec.replicated:
            return
        index = shard_for_key(key.encode(), spec.shards, CACHE_MODE)
        try:
            await self.replication.confirm_read(spec, index)
        except ReplicationRefusedError as exc:
            raise _Refused(exc.code, str(exc), retry=exc.retry, reason=exc.reason) from None

    def _get_answer(self, spec: CacheSpec, request: CacheGet, ctx: RequestContext) -> bytes:
        key = request.key
        replicated = self._gate(spec, key)
        shard = self.shard_of_key(spec, key)
        # A replica's reads leave its recency order alone (eviction follows writes only).
        entry = shard.live(key, now_ms()) if replicated else shard.get(key, now_ms())
        return ctx.proto.message(
            CacheValue(
                tenant_id=request.tenant_id,
                namespace=request.namespace,
                cache=request.cache,
                key=key,
                value=entry.value if entry is not None else None,
                request_id=request.request_id,
                # Shaping drops it for clients that did not offer CACHE_CONDITIONAL.
                version=entry.version if entry is not None else None,
            )
        )

    async def _delete(self, spec: CacheSpec, request: CacheDelete, ctx: RequestContext) -> bytes:
        key = request.key
        if self._replicated(spec):
            op = ReplicatedCacheOp(op=CacheOpKind.DELETE, key=key, now_ms=now_ms())
            value = (await self._write(spec, op)).value
        else:
            shard = self.shard_of_key(spec, key)
            removed, offset = shard.delete(key, now_ms())
            await shard.wait_durable(offset)
            value = removed.value if removed is not None else None
        return ctx.proto.message(
            CacheValue(
                tenant_id=request.tenant_id,
                namespace=request.namespace,
                cache=request.cache,
                key=key,
                value=value,
                request_id=request.request_id,
            )
        )

    async def _put_request(self, spec: CacheSpec, request: CachePut, ctx: RequestContext) -> bytes:
        if self._replicated(spec):
            op = ReplicatedCacheOp(
                op=CacheOpKind.PUT,
                key=request.key,
                now_ms=now_ms(),
                value=request.value,
                ttl_ms=request.ttl_ms or None,
            )
            await self._write(spec, op)
            return ctx.proto.message(CacheOk(request_id=request.request_id or 0))
        shard = self.shard_of_key(spec, request.key)
        entry = self._put(shard, request.key, request.value, request.ttl_ms)
        await shard.wait_durable(entry.offset)
        self._maybe_compact(shard)
        # decision cache-put-answer: cache_ok always carries a request_id.
        return ctx.proto.message(CacheOk(request_id=request.request_id or 0))

    def _put_now(self, spec: CacheSpec, request: CachePut, ctx: RequestContext) -> bytes | None:
        """`_put_request` when nothing has to be waited for: the append is written at
        once and durable means written (none, periodic); None under on_commit (the
        answer waits for the fsync), and for a replicated cache (its ack waits for
        its replicas), which take the handler's path."""
        if spec.replication_factor > 1:
            return None
        shard = self.shard_of_key(spec, request.key)
        log = shard.log
        if log is not None and log.config.fsync_mode is FsyncMode.ON_COMMIT:
            return None
        # The append raised (a StorageError, answered `storage`) or it is written.
        self._put(shard, request.key, request.value, request.ttl_ms)
        self._maybe_compact(shard)
        return ctx.proto.message(CacheOk(request_id=request.request_id or 0))

    async def _put_if(self, spec: CacheSpec, request: CachePutIf, ctx: RequestContext) -> bytes:
        key = request.key
        condition = request.condition
        wanted = condition.version if isinstance(condition, VersionCondition) else None
        if self._replicated(spec):
            op = ReplicatedCacheOp(
                op=CacheOpKind.PUT_IF,
                key=key,
                now_ms=now_ms(),
                value=request.value,
                ttl_ms=request.ttl_ms or None,
                version=wanted,
            )
            outcome = await self._write(spec, op)
            return ctx.proto.message(
                CacheConditionResult(
                    applied=outcome.applied, version=outcome.version, request_id=request.request_id
                )
            )
        shard = self.shard_of_key(spec, key)
        await shard.settle(key)
        try:
            applied, version, offset = shard.put_if(
                key, request.value, request.ttl_ms, wanted, now_ms()
            )
        except EntryTooLargeError as exc:
            raise _Refused(ErrorCode.LIMIT_EXCEEDED, str(exc)) from None
        await shard.wait_durable(offset)
        self._maybe_compact(shard)
        return ctx.proto.message(
            CacheConditionResult(applied=applied, version=version, request_id=request.request_id)
        )

    async def _delete_if(
        self, spec: CacheSpec, request: CacheDeleteIf, ctx: RequestContext
    ) -> bytes:
        key = request.key
        if self._replicated(spec):
            op = ReplicatedCacheOp(
                op=CacheOpKind.DELETE_IF, key=key, now_ms=now_ms(), version=request.version
            )
            outcome = await self._write(spec, op)
            return ctx.proto.message(
                CacheConditionResult(
                    applied=outcome.applied, version=outcome.version, request_id=request.request_id
                )
            )
        shard = self.shard_of_key(spec, key)
        await shard.settle(key)
        applied, version, offset = shard.delete_if(key, request.version, now_ms())
        await shard.wait_durable(offset)
        return ctx.proto.message(
            CacheConditionResult(applied=applied, version=version, request_id=request.request_id)
        )

    async def _counter_add(
        self, spec: CacheSpec, request: CounterAdd, ctx: RequestContext
    ) -> bytes:
        if self._replicated(spec):
            op = ReplicatedCacheOp(
                op=CacheOpKind.COUNTER_ADD, key=request.key, now_ms=now_ms(), delta=request.delta
            )
            total = (await self._write(spec, op)).total
            return ctx.proto.message(CounterValue(value=total, request_id=request.request_id))
        shard = self.shard_of_key(spec, request.key)
        try:
            total, offset = shard.counter_add(request.key, request.delta)
        except OverflowError as exc:
            raise _Refused(ErrorCode.INVALID_REQUEST, str(exc)) from None
        await shard.wait_durable(offset)
        self._maybe_compact(shard)
        return ctx.proto.message(CounterValue(value=total, request_id=request.request_id))

    async def _counter_get(
        self, spec: CacheSpec, request: CounterGet, ctx: RequestContext
    ) -> bytes:
        self._gate(spec, request.key)
        shard = self.shard_of_key(spec, request.key)
        value = shard.counter(request.key)
        await self._confirm_read(spec, request.key)
        return ctx.proto.message(CounterValue(value=value, request_id=request.request_id))

    # -- replicated (Quorum) caches in a fleet -------------------------------------

    def _replicated(self, spec: CacheSpec) -> bool:
        return self.replication is not None and spec.replicated

    def _gate(self, spec: CacheSpec, key: str) -> bool:
        """For a read of `key`: raises the refusal of a replicated shard not served
        here; whether the shard is replicated."""
        if not self._replicated(spec):
            return False
        self._gate_index(spec, shard_for_key(key.encode(), spec.shards, CACHE_MODE))
        return True

    def _gate_index(self, spec: CacheSpec, index: int) -> None:
        if self.replication is None or not spec.replicated:
            return
        refused = self.replication.read_refusal(spec, index)
        if refused is not None:
            code, reason = refused
            text = f"{code.wire}: {reason}" if reason else code.wire
            raise _Refused(code, text, reason=reason)

    async def _write(self, spec: CacheSpec, op: ReplicatedCacheOp) -> Outcome:
        """One write of a replicated cache, answered at the quorum mark (see
        felix_broker/replication/cache.py); a refusal raises `_Refused`."""
        assert self.replication is not None
        key = op.key.encode()
        if op.value is not None:  # refused before it takes a place in the log
            size = len(key) + len(op.value) + ENTRY_OVERHEAD
            if size > self.limits.max_shard_bytes:
                raise _Refused(
                    ErrorCode.LIMIT_EXCEEDED,
                    f"an entry of {size} bytes exceeds the shard bound of "
                    f"{self.limits.max_shard_bytes} bytes",
                )
        index = shard_for_key(key, spec.shards, CACHE_MODE)
        try:
            outcome = await self.replication.write(spec, index, op)
        except ReplicationRefusedError as exc:
            raise _Refused(exc.code, str(exc), retry=exc.retry, reason=exc.reason) from None
        if outcome.error is not None:
            raise _Refused(*outcome.error)
        return outcome

    def _put(self, shard: CacheShard, key: str, value: bytes, ttl_ms: int | None) -> Entry:
        try:
            return shard.put(key, value, ttl_ms, now_ms())
        except EntryTooLargeError as exc:
            raise _Refused(ErrorCode.LIMIT_EXCEEDED, str(exc)) from None

    # -- watches --------------------------------------------------------------------

    async def _watch(self, spec: CacheSpec, request: CacheWatch, ctx: RequestContext) -> None:
        """Start a watch; it answers itself (cache_watch_started, then its event stream)."""
        proto = ctx.proto
        if (request.key is None) == (request.prefix is None):
            raise _Refused(
                ErrorCode.INVALID_REQUEST, "cache_watch needs exactly one of key, prefix"
            )
        if request.retained and request.from_offset is not None:
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                "cache_watch: retained and from_offset exclude each other",
            )
        if request.key is not None:
            # A key watch follows its key's shard; `shard` is ignored (K7).
            self._gate(spec, request.key)
            shard = self.shard_of_key(spec, request.key)
        else:
            if request.shard is None and spec.shards > 1:
                raise _Refused(
                    ErrorCode.INVALID_REQUEST,
                    f"a prefix watch on cache {spec.name} ({spec.shards} shards) must name a shard",
                )
            index = request.shard or 0
            if index >= spec.shards:
                raise _Refused(
                    ErrorCode.INVALID_REQUEST,
                    f"cache {spec.name} has {spec.shards} shard(s), not {index + 1}",
                )
            self._gate_index(spec, index)
            shard = self.shard(spec, index)
        log = shard.log
        assert log is not None
        tail = log.next_offset
        start = request.from_offset
        if start is not None and start > tail:
            cursor = SubscribeCursorError(
                reason=CursorErrorReason.IN_FUTURE, requested=start, available=tail
            )
            await ctx.write(proto.message(cursor))
            return
        # Register, read the tail and take any snapshot in one step: every change
        # from `tail` on reaches the watch's queue, everything before comes from
        # the snapshot or the replay.
        watcher = Watcher(
            key=request.key, prefix=request.prefix, capacity=self.limits.watch_queue_capacity
        )
        shard.register(watcher)
        resnapshot = start is not None and start < log.start_offset
        snapshot = shard.snapshot(watcher, now_ms()) if request.retained or resnapshot else []
        replay_from = start if start is not None and not resnapshot else None
        subscription_id = next(self._watch_ids)
        started = CacheWatchStarted(
            subscription_id=subscription_id,
            resume_offset=replay_from if replay_from is not None else tail,
            resnapshot=resnapshot,
            retained_count=len(snapshot) if request.retained else None,
        )
        try:
            await ctx.write(proto.message(started))
            uni = await ctx.open_uni_stream()
        except BaseException:
            shard.unregister(watcher)
            raise
        self._watchers.add(watcher)
        # The watch ends when the token it was opened under expires (plus the leeway).
        ctx.io.on_expire.append(watcher.close)
        ctx.spawn(
            self._deliver(shard, watcher, uni, proto, subscription_id, snapshot, replay_from, tail),
            "cache_watch_delivery",
        )

    async def _deliver(
        self,
        shard: CacheShard,
        watcher: Watcher,
        uni: Stream,
        proto: StreamProtocol,
        subscription_id: int,
        snapshot: list[Change],
        replay_from: int | None,
        tail: int,
    ) -> None:
        """Feed one watch's event stream until it ends (see the module docs)."""
        stopper = asyncio.get_running_loop().create_task(uni.wait_stopped())
        stopper.add_done_callback(lambda _t: watcher.close())
        finished = False
        try:
            await uni.write(encode_frame(EventStreamHello(subscription_id=subscription_id)))
            for at in range(0, len(snapshot), _EVENT_BATCH):
                batch = snapshot[at : at + _EVENT_BATCH]
                await uni.write(b"".join(_event(proto, change) for change in batch))
            if replay_from is not None:
                lost = await self._replay(shard, watcher, uni, proto, replay_from, tail)
                if lost is not None:
                    # Compaction removed history this replay still needed: the
                    # client re-watches from there and gets a resnapshot.
                    watcher.lagged_from = lost
                    watcher.close()
            while True:
                changes = await watcher.take(_EVENT_BATCH)
                if not changes:
                    break
                # Under on_commit nothing a crash could lose is delivered.
                await shard.wait_durable(changes[-1].offset)
                await uni.write(b"".join(_event(proto, change) for change in changes))
            moved = watcher.moved
            if moved is not None and watcher.lagged_from is None and not watcher.closed:
                if proto.client.has_feature(Feature.FEATURE_SHARD_MOVED):
                    node_id, addr, generation, resume = moved
                    ended = ShardMoved(
                        subscription_id=subscription_id,
                        resume_from=resume,
                        node_id=node_id,
                        addr=addr,
                        generation=generation,
                    )
                    await uni.write(proto.message(ended), end_stream=True)
                elif uni.stop_sending_code is None:
                    await uni.finish()
                finished = True
            elif watcher.lagged_from is not None and uni.stop_sending_code is None:
                self.watch_lags.inc()
                lagged = CacheWatchLagged(resume_from=watcher.lagged_from)
                await uni.write(proto.message(lagged), end_stream=True)
                finished = True
        except (StreamClosedError, ConnectionClosedError):
            pass
        except StorageError as exc:
            _log.error("cache watch %d ended by a storage error: %s", subscription_id, exc)
        finally:
            stopper.cancel()
            watcher.close()
            shard.unregister(watcher)
            self._watchers.discard(watcher)
            if not finished:
                with contextlib.suppress(Exception):
                    uni.reset(0)

    async def _replay(
        self,
        shard: CacheShard,
        watcher: Watcher,
        uni: Stream,
        proto: StreamProtocol,
        start: int,
        end: int,
    ) -> int | None:
        """Send the changes in [start, end) the watch matches. Returns the offset
        reached if compaction removed the rest meanwhile, else None."""
        log = shard.log
        assert log is not None
        if end > start and log.readable_offset < end:
            await log.wait_durable(end - 1)
        offset = start
        while offset < end and not watcher.closed:
            try:
                records = await log.aread(
                    offset, max_records=_REPLAY_RECORDS, max_bytes=_REPLAY_BYTES, end=end
                )
            except OffsetOutOfRangeError:
                return offset
            if not records:
                break
            frames: list[bytes] = []
            for stored in records:
                record = decode_record(stored.payload)
                if record.kind is Kind.PUT and watcher.matches(record.key):
                    change = Change(record.key, record.value, stored.offset, record.expires_at_ms)
                    frames.append(_event(proto, change))
                elif record.kind is Kind.DELETE and watcher.matches(record.key):
                    frames.append(_event(proto, Change(record.key, None, stored.offset)))
            offset = records[-1].offset + 1
            if frames:
                await uni.write(b"".join(frames))
        return None


def _event(proto: StreamProtocol, change: Change) -> bytes:
    return proto.message(
        CacheEvent(
            key=change.key,
            value=change.value,
            offset=change.offset,
            expires_at_millis=change.expires_at_ms,
        )
    )
