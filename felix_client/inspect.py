"""Operator inspection: what a broker knows of a shard, and who subscribes where.

Both need the token permission `node.view:cluster:*` exactly (a wildcard such
as `node.view:*` does not count); without it the broker refuses with
`ForbiddenError` and the client stays usable. Neither changes anything.

`subscriptions_list` pages through the broker's listing (ordered by tenant,
namespace, stream, shard, then subscriber id): an async iterator of
`SubscriptionsPage`s, each with the cursor of the next (None on the last).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from felix_wire.messages import (
    InspectedSubscription,
    ShardInspect,
    ShardInspectInfo,
    ShardInspection,
    ShardKind,
    SubscriptionCursor,
    SubscriptionFilter,
    SubscriptionsList,
    SubscriptionsListInfo,
)

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "MAX_PAGE",
    "InspectedSubscription",
    "ShardInspection",
    "SubscriptionCursor",
    "SubscriptionFilter",
    "SubscriptionsPage",
    "shard_inspect",
    "subscriptions_page",
    "subscriptions_pages",
]

# The broker's cap on one page (its default is 100).
MAX_PAGE = 1000
# Bound on pages one listing walks, so a broker that never ends a listing
# cannot keep a caller looping (1,000 pages of up to 1,000 entries).
MAX_PAGES = 1000


@dataclass(frozen=True, slots=True)
class SubscriptionsPage:
    """One page of the listing; `next_cursor` is None on the last page."""

    node_id: str
    subscriptions: list[InspectedSubscription]
    next_cursor: SubscriptionCursor | None


async def shard_inspect(
    client: Client, ns: str, name: str, shard: int, kind: ShardKind, timeout: float | None
) -> ShardInspection:
    if shard < 0:
        raise ValueError("shard is never negative")
    answer = await client._exclusive_call(
        lambda rid: ShardInspect(
            tenant_id=client.tenant_id,
            namespace=ns,
            name=name,
            kind=kind,
            shard=shard,
            request_id=rid,
        ),
        ShardInspectInfo,
        timeout=timeout,
    )
    return answer.view


async def subscriptions_page(
    client: Client,
    filter: SubscriptionFilter,
    *,
    limit: int | None,
    cursor: SubscriptionCursor | None,
    timeout: float | None,
) -> SubscriptionsPage:
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE}")
    answer = await client._exclusive_call(
        lambda rid: SubscriptionsList(filter=filter, limit=limit, cursor=cursor, request_id=rid),
        SubscriptionsListInfo,
        timeout=timeout,
    )
    return SubscriptionsPage(answer.node_id, list(answer.subscriptions), answer.next_cursor)


async def subscriptions_pages(
    client: Client,
    filter: SubscriptionFilter,
    *,
    limit: int | None,
    cursor: SubscriptionCursor | None,
    timeout: float | None,
) -> AsyncIterator[SubscriptionsPage]:
    for _ in range(MAX_PAGES):
        page = await subscriptions_page(client, filter, limit=limit, cursor=cursor, timeout=timeout)
        yield page
        if page.next_cursor is None:
            return
        if page.next_cursor == cursor:
            return  # a broker that does not move on: stop rather than loop
        cursor = page.next_cursor
