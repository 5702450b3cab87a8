"""The cache: keys with values, TTLs and versions, scoped to (tenant, namespace, cache, key).

Every request is answered on the stream it came on and carries its request_id,
so many may be in flight on one stream; the server runs each as its own task
and answers arrive in completion order.

Versions. In memory, versions come from one counter seeded with the wall clock
in microseconds, so a restarted broker never reissues a version a client may
still hold. A conditional write's check and write happen in one synchronous
step (no await between them), which is what makes them atomic per key on the
single event loop: two racing `absent` puts cannot both apply.

TTL. An expired entry reads as absent at once (checked on every access) and is
removed when next touched.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.messages import (
    CacheConditionResult,
    CacheDelete,
    CacheDeleteIf,
    CacheGet,
    CacheOk,
    CachePut,
    CachePutIf,
    CacheValue,
    Message,
    VersionCondition,
)

from felix_transport import Stream

from .catalog import Catalog
from .config import BrokerConfig
from .metrics import BrokerMetrics
from .permissions import Action, cache_object
from .protocol import StreamProtocol

__all__ = ["CACHE_REQUESTS", "CacheCall", "CacheService"]

CACHE_REQUESTS = (CachePut, CacheGet, CacheDelete, CachePutIf, CacheDeleteIf)


@dataclass(frozen=True, slots=True)
class CacheCall:
    """What a cache request needs from the stream it arrived on."""

    proto: StreamProtocol
    write: Callable[[bytes], Awaitable[None]]
    spawn: Callable[[Coroutine[Any, Any, None]], None]  # a task that ends with the connection
    open_uni_stream: Callable[[], Awaitable[Stream]]  # a broker-opened event stream (watches)


@dataclass(slots=True)
class _Entry:
    value: bytes
    version: int
    expires_at_ms: int  # 0 = never


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CacheService:
    """Every cache this broker serves, in memory."""

    def __init__(self, *, config: BrokerConfig, catalog: Catalog, metrics: BrokerMetrics) -> None:
        self._config = config
        self._catalog = catalog
        self._metrics = metrics
        self._entries: dict[tuple[str, str, str, str], _Entry] = {}
        self._next_version = time.time_ns() // 1000

    @property
    def features(self) -> int:
        """Feature bits this service answers (watches and counters need the log)."""
        return int(Feature.FEATURE_CACHE_DELETE | Feature.FEATURE_CACHE_CONDITIONAL)

    async def handle(self, request: Message, call: CacheCall) -> None:
        assert isinstance(request, CACHE_REQUESTS)
        proto = call.proto
        action = Action.CACHE_READ if isinstance(request, CacheGet) else Action.CACHE_WRITE
        refusal = self._refusal(proto, request.tenant_id, request.namespace, request.cache, action)
        if refusal is not None:
            await call.write(proto.error(*refusal))
            return
        await call.write(self._answer(proto, request))

    def _refusal(
        self, proto: StreamProtocol, tenant: str, namespace: str, cache: str, action: Action
    ) -> tuple[ErrorCode, str] | None:
        principal = proto.principal
        assert principal is not None
        if tenant != principal.tenant_id:
            return ErrorCode.FORBIDDEN, "forbidden: the token is for another tenant"
        if self._catalog.cache(tenant, namespace, cache) is None:
            return (
                ErrorCode.NOT_FOUND,
                f"cache not found: tenant={tenant} namespace={namespace} cache={cache}",
            )
        obj = cache_object(tenant, namespace, cache)
        if not principal.permissions.allows(action, obj):
            return ErrorCode.FORBIDDEN, f"forbidden: {action.value} on {obj}"
        return None

    def _live(self, key: tuple[str, str, str, str]) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at_ms and entry.expires_at_ms <= _now_ms():
            del self._entries[key]
            return None
        return entry

    def _version(self) -> int:
        self._next_version += 1
        return self._next_version

    def _put(self, key: tuple[str, str, str, str], value: bytes, ttl_ms: int | None) -> int:
        version = self._version()
        expires = _now_ms() + ttl_ms if ttl_ms else 0
        self._entries[key] = _Entry(value, version, expires)
        return version

    def _answer(
        self,
        proto: StreamProtocol,
        request: CachePut | CacheGet | CacheDelete | CachePutIf | CacheDeleteIf,
    ) -> bytes:
        key = (request.tenant_id, request.namespace, request.cache, request.key)
        if isinstance(request, CachePut):
            self._put(key, request.value, request.ttl_ms)
            # decision cache-put-answer: cache_ok always carries a request_id.
            return proto.message(CacheOk(request_id=request.request_id or 0))
        if isinstance(request, CacheGet | CacheDelete):
            entry = self._live(key)
            if isinstance(request, CacheDelete) and entry is not None:
                del self._entries[key]
            return proto.message(
                CacheValue(
                    tenant_id=request.tenant_id,
                    namespace=request.namespace,
                    cache=request.cache,
                    key=request.key,
                    value=entry.value if entry else None,
                    request_id=request.request_id,
                    # version only on a get's hit (shaping drops it for non-offerers)
                    version=entry.version if entry and isinstance(request, CacheGet) else None,
                )
            )
        entry = self._live(key)
        current = entry.version if entry else None
        if isinstance(request, CachePutIf):
            condition = request.condition
            if isinstance(condition, VersionCondition):
                applies = current == condition.version
            else:
                applies = entry is None
            if applies:
                version = self._put(key, request.value, request.ttl_ms)
                return proto.message(
                    CacheConditionResult(
                        applied=True, version=version, request_id=request.request_id
                    )
                )
            return proto.message(
                CacheConditionResult(applied=False, version=current, request_id=request.request_id)
            )
        if current is not None and current == request.version:
            del self._entries[key]
            return proto.message(CacheConditionResult(applied=True, request_id=request.request_id))
        return proto.message(
            CacheConditionResult(applied=False, version=current, request_id=request.request_id)
        )
