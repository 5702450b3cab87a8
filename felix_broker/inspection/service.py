"""Operator inspection over QUIC: ``shard_inspect`` and ``subscriptions_list``.

Both need exactly the grant ``node.view:cluster:*`` (a wildcard such as
``node.view:*`` does not count; permissions.py): without it the answer is
``error`` ``forbidden`` and the stream stays open. Neither opens a log, routes
anything elsewhere or changes anything: they read what the broker already
holds (open shards, open logs, live subscriptions). The answers are built by
views.py.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable, Iterable

from felix_broker.catalog import Catalog
from felix_broker.inspection.views import (
    NODE_ID,
    held_shard,
    page_subscriptions,
    unassigned_shard,
)
from felix_broker.session.context import ConnectionState, RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_broker.storage import LogStore, ShardKey
from felix_common.permissions import Action, cluster_object
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.messages import (
    InspectedSubscription,
    ShardInspect,
    ShardInspectInfo,
    ShardInspection,
    ShardKind,
    SubscriptionsList,
    SubscriptionsListInfo,
)

__all__ = ["INSPECT_FEATURES", "InspectionService"]

INSPECT_FEATURES = int(Feature.FEATURE_INSPECT)


class InspectionService:
    """Read-only views of this broker's shards and subscriptions, for operators."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        store: LogStore | None,
        connections: Callable[[], Iterable[ConnectionState]],
    ) -> None:
        self._catalog = catalog
        # A number per client connection, given the first time a listing shows it and
        # kept for the connection's life (held weakly: it goes with the connection).
        self._numbers: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self._next_number = itertools.count(1)
        self._store = store
        self._connections = connections
        self.node_id = NODE_ID  # a fleet member's subclass names its node (fleet/inspection.py)

    @property
    def features(self) -> int:
        return INSPECT_FEATURES

    def register(self, table: DispatchTable) -> None:
        table.register(ShardInspect, self.shard_inspect)
        table.register(SubscriptionsList, self.subscriptions_list)

    async def _allowed(self, ctx: RequestContext) -> bool:
        if ctx.principal.permissions.allows(Action.NODE_VIEW, cluster_object()):
            return True
        await ctx.write(
            ctx.proto.error(ErrorCode.FORBIDDEN, "forbidden: needs node.view:cluster:*")
        )
        return False

    async def shard_inspect(self, request: ShardInspect, ctx: RequestContext) -> None:
        if not await self._allowed(ctx):
            return
        view = self._view(request)
        await ctx.write(
            ctx.proto.message(ShardInspectInfo(view=view, request_id=request.request_id))
        )

    def _view(self, request: ShardInspect) -> ShardInspection:
        tenant, namespace, name, index = (
            request.tenant_id,
            request.namespace,
            request.name,
            request.shard,
        )
        if request.kind == ShardKind.CACHE:
            cache = self._catalog.cache(tenant, namespace, name)
            if cache is None:
                return unassigned_shard(0)
            if index >= cache.shards:
                return unassigned_shard(cache.shards)
            return held_shard(cache.shards, tail=None)
        spec = self._catalog.stream(tenant, namespace, name)
        if spec is None:
            return unassigned_shard(0)
        if index >= spec.shards:
            return unassigned_shard(spec.shards)
        tail = None
        if spec.durable and self._store is not None:
            log = self._store.get(ShardKey(tenant, namespace, name, index))
            if log is not None and not log.closed:
                tail = log.next_offset
        return held_shard(spec.shards, tail=tail)

    async def subscriptions_list(self, request: SubscriptionsList, ctx: RequestContext) -> None:
        if not await self._allowed(ctx):
            return
        page = page_subscriptions(
            self._entries(), request.filter, cursor=request.cursor, limit=request.limit
        )
        await ctx.write(
            ctx.proto.message(
                SubscriptionsListInfo(
                    node_id=self.node_id,
                    subscriptions=page.subscriptions,
                    next_cursor=page.next_cursor,
                    request_id=request.request_id,
                )
            )
        )

    def _entries(self) -> Iterable[InspectedSubscription]:
        now = time.monotonic()
        for state in self._connections():
            number = self._numbers.get(state.connection)
            if number is None:
                number = self._numbers[state.connection] = next(self._next_number)
            address = state.connection.peer_address
            peer = f"{address[0]}:{address[1]}" if address is not None else None
            for sub, identity in list(state.subscriptions.items()):
                shard = sub.shard
                spec = shard.spec
                _tenant, _, subject = identity.partition("/")
                yield InspectedSubscription(
                    tenant_id=spec.tenant_id,
                    namespace=spec.namespace,
                    stream=spec.name,
                    shard=shard.index,
                    subscriber_id=sub.subscription_id,
                    subscription_id=sub.subscription_id,
                    connection=number,
                    peer=peer,
                    principal=subject,
                    policy=sub.policy.value,
                    depth=sub.depth,
                    capacity=sub.capacity,
                    dropped=sub.dropped,
                    position=sub.position if shard.durable else None,
                    tail=shard.next_offset,
                    age_ms=int((now - sub.created) * 1000),
                )
