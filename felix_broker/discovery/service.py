"""The discovery service: stream_shards, cache_shards and shard_owners.

Answers are scoped to the client's tenant (D4): another tenant's names are
unknown here, answered as zero shards rather than refused, so discovery tells
nobody what exists elsewhere. A standalone broker owns every shard it knows,
at generation 0 and with no cluster identity (D3); `topology` is cluster only
and not served (dispatch.NOT_SERVED). The cluster extends this service with
the fleet's view of owners.
"""

from __future__ import annotations

from felix_broker.catalog import Catalog, Routing, StreamSpec
from felix_broker.session.context import RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_wire.features import Feature
from felix_wire.messages import (
    CacheShards,
    CacheShardsView,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    ShardRouting,
    StreamShards,
    StreamShardsView,
)

__all__ = ["DISCOVERY_FEATURES", "DiscoveryService"]

DISCOVERY_FEATURES = int(
    Feature.FEATURE_STREAM_SHARDS | Feature.FEATURE_CACHE_SHARDS | Feature.FEATURE_SHARD_OWNERS
)


class DiscoveryService:
    """Shard counts and owners from the catalog the broker serves."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    @property
    def features(self) -> int:
        return DISCOVERY_FEATURES

    def register(self, table: DispatchTable) -> None:
        table.register(StreamShards, self.stream_shards)
        table.register(CacheShards, self.cache_shards)
        table.register(ShardOwners, self.shard_owners)

    def _visible_stream(
        self, ctx: RequestContext, tenant: str, namespace: str, name: str
    ) -> StreamSpec | None:
        if tenant != ctx.principal.tenant_id:
            return None
        return self._catalog.stream(tenant, namespace, name)

    def _visible_cache_shards(
        self, ctx: RequestContext, tenant: str, namespace: str, name: str
    ) -> int:
        if tenant != ctx.principal.tenant_id:
            return 0
        spec = self._catalog.cache(tenant, namespace, name)
        return spec.shards if spec else 0

    async def stream_shards(self, request: StreamShards, ctx: RequestContext) -> None:
        spec = self._visible_stream(ctx, request.tenant_id, request.namespace, request.stream)
        # routing is sent only for jump-hash streams; absent means modulo.
        jump_hash = spec is not None and spec.routing is Routing.JUMP_HASH
        view = StreamShardsView(
            shards=spec.shards if spec else 0,
            request_id=request.request_id,
            routing=ShardRouting.JUMP_HASH if jump_hash else None,
        )
        await ctx.write(ctx.proto.message(view))

    async def cache_shards(self, request: CacheShards, ctx: RequestContext) -> None:
        shards = self._visible_cache_shards(
            ctx, request.tenant_id, request.namespace, request.cache
        )
        view = CacheShardsView(shards=shards, request_id=request.request_id)
        await ctx.write(ctx.proto.message(view))

    async def shard_owners(self, request: ShardOwners, ctx: RequestContext) -> None:
        if request.kind == "stream":
            stream = self._visible_stream(ctx, request.tenant_id, request.namespace, request.name)
            shards = stream.shards if stream else 0
        else:
            shards = self._visible_cache_shards(
                ctx, request.tenant_id, request.namespace, request.name
            )
        # A standalone broker owns every shard it knows, with no cluster identity (D3).
        owners = [ShardOwner(shard=i, generation=0) for i in range(shards)]
        view = ShardOwnersView(owners=owners, request_id=request.request_id)
        await ctx.write(ctx.proto.message(view))
