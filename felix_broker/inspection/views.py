"""The answers to ``shard_inspect`` and ``subscriptions_list``, as pure builders.

A standalone broker leads every shard it serves: a shard of a stream or cache
it knows is ``role: leader``, ``phase: active``, ``serving: true``, generation
0, with ``tail`` when its log is open here (durable streams, log-backed
caches). Anything else (unknown name, shard past the width) is
``role: none``, ``phase: unassigned``, ``serving: false``, reason
``not_assigned_here``, with ``shards: 0`` when the name is unknown. ``node_id``
is ``""`` outside a cluster.

``subscriptions_list`` pages through every subscription of the broker in
(tenant, namespace, stream, shard, subscriber id) order. The cursor names
the last entry of the previous page; a page holds ``limit`` entries (default
100, at most 1,000, at least 1) and carries ``next_cursor`` exactly when more
entries follow. Filters: equality on each field given; ``principal`` is the
token ``sub`` of the subscribing connection; ``dropping: true`` keeps the
subscribers that have dropped records. Subscriber ids are broker-wide
counters, so they are never reused within a shard either.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from felix_wire.messages import (
    InspectedSubscription,
    ShardInspection,
    SubscriptionCursor,
    SubscriptionFilter,
)

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "NODE_ID",
    "SubscriptionPage",
    "effective_limit",
    "held_shard",
    "page_subscriptions",
    "unassigned_shard",
]

NODE_ID = ""
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def held_shard(shards: int, *, tail: int | None) -> ShardInspection:
    """A shard this broker serves (it leads every shard it holds)."""
    return ShardInspection(
        node_id=NODE_ID,
        shards=shards,
        role="leader",
        phase="active",
        serving=True,
        generation=0,
        tail=tail,
    )


def unassigned_shard(shards: int) -> ShardInspection:
    """A shard this broker does not hold; ``shards`` 0 when the name is unknown."""
    return ShardInspection(
        node_id=NODE_ID,
        shards=shards,
        role="none",
        phase="unassigned",
        serving=False,
        reason="not_assigned_here",
    )


def _order(entry: InspectedSubscription) -> tuple[str, str, str, int, int]:
    return (entry.tenant_id, entry.namespace, entry.stream, entry.shard, entry.subscriber_id)


def _cursor_key(cursor: SubscriptionCursor) -> tuple[str, str, str, int, int]:
    return (cursor.tenant_id, cursor.namespace, cursor.stream, cursor.shard, cursor.subscriber_id)


def _matches(entry: InspectedSubscription, wanted: SubscriptionFilter) -> bool:
    return (
        (wanted.tenant_id is None or entry.tenant_id == wanted.tenant_id)
        and (wanted.namespace is None or entry.namespace == wanted.namespace)
        and (wanted.stream is None or entry.stream == wanted.stream)
        and (wanted.shard is None or entry.shard == wanted.shard)
        and (wanted.principal is None or entry.principal == wanted.principal)
        and (not wanted.dropping or entry.dropped > 0)
    )


@dataclass(frozen=True, slots=True)
class SubscriptionPage:
    """One page of the listing and where the next one starts (None on the last page)."""

    subscriptions: list[InspectedSubscription]
    next_cursor: SubscriptionCursor | None


def effective_limit(limit: int | None) -> int:
    """The page size asked for, defaulted and clamped to [1, MAX_LIMIT]."""
    if limit is None:
        return DEFAULT_LIMIT
    return max(1, min(limit, MAX_LIMIT))


def page_subscriptions(
    entries: Iterable[InspectedSubscription],
    wanted: SubscriptionFilter,
    *,
    cursor: SubscriptionCursor | None,
    limit: int | None,
) -> SubscriptionPage:
    """The page after ``cursor`` of the entries ``wanted`` selects, in listing order."""
    size = effective_limit(limit)
    after = _cursor_key(cursor) if cursor is not None else None
    # One more than a page tells whether a next page exists; a heap keeps that
    # O(n log limit) however many subscriptions the broker holds.
    selected = heapq.nsmallest(
        size + 1,
        (e for e in entries if _matches(e, wanted) and (after is None or _order(e) > after)),
        key=_order,
    )
    page = selected[:size]
    if len(selected) <= size:
        return SubscriptionPage(page, None)
    last = page[-1]
    return SubscriptionPage(
        page,
        SubscriptionCursor(
            tenant_id=last.tenant_id,
            namespace=last.namespace,
            stream=last.stream,
            shard=last.shard,
            subscriber_id=last.subscriber_id,
        ),
    )
