"""Cache operations: a handle on one cache (`client.cache("sessions")`).

Every request carries a request id and is pipelined over the request pool,
spread by key, so many are in flight at once. Each call is checked against the
broker's advertised features first (delete, conditional writes, watches and
counters each have their own bit) and raises `NotSupportedByBrokerError`
without sending anything when the broker lacks it.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, overload

from felix_wire.messages import (
    CacheCondition,
    CacheConditionResult,
    CacheDelete,
    CacheDeleteIf,
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
    Message,
    ShardMoved,
    VersionCondition,
)

from ._events import CacheChange, Item, StreamEnd
from ._fleet import ShardRef
from ._pool import EventHandoff
from .errors import ProtocolViolationError
from .subscription import Feed, ShardedFeed

__all__ = ["Cache", "CacheEntry", "CacheWatchFeed", "ConditionResult", "ShardedCacheWatch"]

M = TypeVar("M", bound=Message)


class _Requester(Protocol):
    """What a cache handle needs from the client."""

    tenant_id: str

    def _require(self, message: Message) -> None: ...

    async def _call(
        self,
        build: Callable[[int], Message],
        answer_type: type[M],
        *,
        hint: int | None = None,
        timeout: float | None = None,
    ) -> M: ...

    async def _open_event_stream(
        self, build: Callable[[int], Message], started: type[M], *, resuming: bool = False
    ) -> tuple[M, EventHandoff]: ...

    def _moved_hook(self, ref: ShardRef | None) -> Callable[[ShardMoved], None]: ...

    async def cache_shards(self, cache: str, *, namespace: str | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """A value and, when the broker reports it, its version (for conditional writes)."""

    value: bytes
    version: int | None


@dataclass(frozen=True, slots=True)
class ConditionResult:
    """Applied: `version` is what the write produced (None for a delete). Refused:
    the key's current version (None when it has none)."""

    applied: bool
    version: int | None


def _ttl_ms(ttl: float | None) -> int | None:
    if ttl is None:
        return None
    if ttl <= 0:
        raise ValueError("ttl must be positive seconds (None: no expiry)")
    return max(1, round(ttl * 1000))


def _hint(key: str) -> int:
    return zlib.crc32(key.encode())


class Cache:
    """Operations on one cache of the client's tenant."""

    def __init__(self, client: _Requester, name: str, namespace: str) -> None:
        self._client = client
        self.name = name
        self.namespace = namespace

    def _scope(self) -> dict[str, str]:
        return {
            "tenant_id": self._client.tenant_id,
            "namespace": self.namespace,
            "cache": self.name,
        }

    async def get(self, key: str, *, timeout: float | None = None) -> bytes | None:
        """The value, or None (missing, expired or evicted)."""
        entry = await self.get_entry(key, timeout=timeout)
        return None if entry is None else entry.value

    async def get_entry(self, key: str, *, timeout: float | None = None) -> CacheEntry | None:
        """The value with its version, or None."""
        scope = self._scope()
        answer = await self._client._call(
            lambda rid: CacheGet(**scope, key=key, request_id=rid),
            CacheValue,
            hint=_hint(key),
            timeout=timeout,
        )
        if answer.value is None:
            return None
        return CacheEntry(answer.value, answer.version)

    async def put(
        self, key: str, value: bytes, *, ttl: float | None = None, timeout: float | None = None
    ) -> None:
        """Store `value`; `ttl` in seconds (None: no expiry)."""
        scope = self._scope()
        ttl_ms = _ttl_ms(ttl)
        await self._client._call(
            lambda rid: CachePut(**scope, key=key, value=value, request_id=rid, ttl_ms=ttl_ms),
            CacheOk,
            hint=_hint(key),
            timeout=timeout,
        )

    async def delete(self, key: str, *, timeout: float | None = None) -> bytes | None:
        """Remove `key`; returns the value removed, None if there was none."""
        scope = self._scope()
        answer = await self._client._call(
            lambda rid: CacheDelete(**scope, key=key, request_id=rid),
            CacheValue,
            hint=_hint(key),
            timeout=timeout,
        )
        return answer.value

    async def put_if(
        self,
        key: str,
        value: bytes,
        *,
        absent: bool = False,
        version: int | None = None,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> ConditionResult:
        """Store only if the key is absent (`absent=True`) or at `version`."""
        if absent == (version is not None):
            raise ValueError("give exactly one of absent=True and version=")
        condition: CacheCondition = "absent" if absent else VersionCondition(version=version or 0)
        scope = self._scope()
        ttl_ms = _ttl_ms(ttl)
        answer = await self._client._call(
            lambda rid: CachePutIf(
                **scope, key=key, value=value, ttl_ms=ttl_ms, condition=condition, request_id=rid
            ),
            CacheConditionResult,
            hint=_hint(key),
            timeout=timeout,
        )
        return ConditionResult(answer.applied, answer.version)

    async def delete_if(
        self, key: str, *, version: int, timeout: float | None = None
    ) -> ConditionResult:
        """Delete only if the key is at `version`."""
        scope = self._scope()
        answer = await self._client._call(
            lambda rid: CacheDeleteIf(**scope, key=key, version=version, request_id=rid),
            CacheConditionResult,
            hint=_hint(key),
            timeout=timeout,
        )
        return ConditionResult(answer.applied, answer.version)

    async def counter_add(self, key: str, delta: int, *, timeout: float | None = None) -> int:
        """Add `delta` (may be negative); returns the sum including it. At least once:
        a retried add counts twice."""
        scope = self._scope()
        answer = await self._client._call(
            lambda rid: CounterAdd(**scope, key=key, delta=delta, request_id=rid),
            CounterValue,
            hint=_hint(key),
            timeout=timeout,
        )
        if answer.value is None:
            raise ProtocolViolationError("counter_add answered without a value")
        return answer.value

    async def counter_get(self, key: str, *, timeout: float | None = None) -> int | None:
        """The counter's sum; None when it was never written (distinct from 0)."""
        scope = self._scope()
        answer = await self._client._call(
            lambda rid: CounterGet(**scope, key=key, request_id=rid),
            CounterValue,
            hint=_hint(key),
            timeout=timeout,
        )
        return answer.value

    @overload
    def watch(
        self,
        *,
        key: str,
        prefix: None = None,
        shard: int | None = None,
        from_offset: int | None = None,
        retained: bool = False,
    ) -> CacheWatchFeed: ...

    @overload
    def watch(
        self,
        *,
        key: None = None,
        prefix: str,
        shard: int,
        from_offset: int | None = None,
        retained: bool = False,
    ) -> CacheWatchFeed: ...

    @overload
    def watch(
        self,
        *,
        key: None = None,
        prefix: str,
        shard: None = None,
        from_offset: int | Mapping[int, int | None] | None = None,
        retained: bool = False,
    ) -> ShardedCacheWatch: ...

    def watch(
        self,
        *,
        key: str | None = None,
        prefix: str | None = None,
        shard: int | None = None,
        from_offset: int | Mapping[int, int | None] | None = None,
        retained: bool = False,
    ) -> CacheWatchFeed | ShardedCacheWatch:
        """Changes to one key, or to a prefix, as an async iterator of
        `CacheChange` (value None = deleted). `from_offset` replays from there;
        `retained` starts with the current values. Checked against the broker's
        features now; opened when awaited, entered or iterated.

        A key watch follows the key's shard. A prefix watch reads the `shard`
        named, or every shard of the cache without one (one watch per shard,
        per-shard order; `from_offset` may then be a vector of offsets, one per
        shard, as `positions` returns)."""
        if (key is None) == (prefix is None):
            raise ValueError("give exactly one of key and prefix")
        if retained and from_offset is not None:
            raise ValueError("retained and from_offset cannot be combined")
        if prefix is not None and shard is None:
            return self._sharded_watch(prefix, from_offset, retained)
        if isinstance(from_offset, Mapping):
            raise ValueError("an offset vector needs a prefix watch of every shard")
        return self._watch(key, prefix, shard, from_offset, retained)

    def _sharded_watch(
        self, prefix: str, from_offset: int | Mapping[int, int | None] | None, retained: bool
    ) -> ShardedCacheWatch:
        self._watch(None, prefix, 0, None, retained)  # the feature checks, now

        async def open_parts() -> dict[int, Feed[CacheChange]]:
            count = max(1, await self._client.cache_shards(self.name, namespace=self.namespace))
            parts: dict[int, Feed[CacheChange]] = {}
            for index in range(count):
                start = from_offset.get(index) if isinstance(from_offset, Mapping) else from_offset
                parts[index] = self._watch(None, prefix, index, start, retained)
            return parts

        def reopen(index: int, position: int | None) -> Feed[CacheChange]:
            return self._watch(None, prefix, index, position, False)

        return ShardedCacheWatch(f"watch {self.name}/{prefix}*", open_parts, reopen)

    def _watch(
        self,
        key: str | None,
        prefix: str | None,
        shard: int | None,
        from_offset: int | None,
        retained: bool,
    ) -> CacheWatchFeed:
        scope = self._scope()
        client = self._client

        def build_for(resume: int | None, with_retained: bool) -> Callable[[int], CacheWatch]:
            def build(_request_id: int) -> CacheWatch:
                return CacheWatch(
                    tenant_id=scope["tenant_id"],
                    namespace=scope["namespace"],
                    cache=scope["cache"],
                    key=key,
                    prefix=prefix,
                    shard=shard,
                    from_offset=resume,
                    retained=with_retained,
                )

            return build

        client._require(build_for(from_offset, retained)(0))

        async def opener(resume: int | None, first: bool) -> tuple[CacheWatchStarted, EventHandoff]:
            # Retained values are asked for once; a resumed watch replays from its offset.
            build = build_for(resume, retained and first)
            return await client._open_event_stream(
                build, CacheWatchStarted, resuming=feed.resumes > 0
            )

        where = key if key is not None else f"{prefix}*"
        label = f"watch {self.name}/{where}" + (f" shard {shard}" if prefix is not None else "")
        feed = CacheWatchFeed(opener, label, from_offset, shard=shard)
        probe = build_for(from_offset, retained)(0)
        where_ref: ShardRef | None = (
            ("cache", probe.namespace, probe.cache, shard)
            if shard is not None
            else ("cache", probe.namespace, probe.cache, f"key:{key}")
            if key is not None
            else None
        )
        feed.on_moved = client._moved_hook(where_ref)
        return feed


class ShardedCacheWatch(ShardedFeed[CacheChange]):
    """A prefix watch over every shard of a cache (see `ShardedFeed`): `positions`
    gives, per shard, the offset to resume from."""


class CacheWatchFeed(Feed[CacheChange]):
    """A cache watch: current values (when retained) then every change."""

    def __init__(
        self,
        opener: Callable[[int | None, bool], Awaitable[tuple[CacheWatchStarted, EventHandoff]]],
        label: str,
        from_offset: int | None,
        *,
        shard: int | None = None,
    ) -> None:
        super().__init__(label)
        self._opener = opener
        self._from = from_offset
        self.shard = shard
        self._opened = False
        self.resume_offset: int | None = None
        self.resnapshot = False
        self.resumes = 0

    async def _open_stream(self) -> EventHandoff:
        started, handoff = await self._opener(self._from, not self._opened)
        self._opened = True
        self.resume_offset = started.resume_offset
        if self._from is None:
            self._from = started.resume_offset
        self.resnapshot = started.resnapshot
        return handoff

    @property
    def position(self) -> int | None:
        """The offset to watch from again without missing or repeating a change."""
        return self._from

    def _accept(self, item: Item) -> None:
        if isinstance(item, CacheChange):
            self._buffer.append(item)
            # Retained values carry older offsets: the position never goes back.
            self._from = max(self._from or 0, item.offset + 1)
        elif isinstance(item, StreamEnd) and isinstance(item.terminal, CacheWatchLagged):
            # The watch fell behind and the broker ended it; watch again from where
            # its changes resume, so the caller sees every change once.
            self._from = item.terminal.resume_from
            self.resumes += 1
            self._restart()
        elif isinstance(item, StreamEnd) and isinstance(item.terminal, ShardMoved):
            # Resume at max(offset after the last change, resume_from) (A.11).
            if item.terminal.resume_from is not None:
                self._from = max(self._from or 0, item.terminal.resume_from)
            if self.on_moved is not None:
                self.on_moved(item.terminal)
            self.resumes += 1
            self._restart()
        else:
            raise ProtocolViolationError(f"{self.label}: unexpected {type(item).__name__}")
