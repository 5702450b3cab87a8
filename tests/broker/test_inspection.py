"""Operator inspection over real QUIC: the exact node.view:cluster:* grant, shard views,
and the paged subscription listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_broker.cli import full_rights
from felix_wire.messages import (
    Error,
    ShardInspect,
    ShardKind,
    Subscribe,
    Subscribed,
    SubscriptionCursor,
    SubscriptionFilter,
    SubscriptionsList,
    SubscriptionsListInfo,
)

from ..fleet.harness import TOPOLOGIES
from ..support.wire import NS, TENANT, Feature, WireClient, token
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)

OPERATOR = [*full_rights(TENANT), "node.view:cluster:*"]


def inspect(
    name: str, shard: int = 0, kind: ShardKind = ShardKind.STREAM, rid: int = 1
) -> ShardInspect:
    return ShardInspect(
        tenant_id=TENANT, namespace=NS, name=name, kind=kind, shard=shard, request_id=rid
    )


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("perms", [full_rights(TENANT), [*full_rights(TENANT), "node.view:*"]])
async def test_without_the_exact_grant_forbidden_and_the_stream_stays_open(
    tmp_path: Path, perms: list[str], topology: str
) -> None:
    """Inspection is answered where it arrives (docs/architecture.md: local), so the grant
    is checked there too, at an owner and at a non-owner alike."""
    async with running_broker(tmp_path, topology=topology) as broker:
        assert broker.features & Feature.FEATURE_INSPECT
        client = await WireClient.connect(broker)
        stream, _ = await client.authed(tok=token(broker, perms=perms))
        for request in (inspect("log"), SubscriptionsList(request_id=2)):
            await stream.send(request)
            answer = await stream.recv()
            assert isinstance(answer, Error) and answer.code == "forbidden"
        await stream.send(inspect("log"))  # still open: answered again
        assert isinstance(await stream.recv(), Error)
        client.close()


async def test_shard_views_of_a_standalone_broker(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed(tok=token(broker, perms=OPERATOR))
        await stream.send(inspect("orders"))
        view = (await stream.recv()).view  # type: ignore[union-attr]
        assert (view.node_id, view.shards, view.role, view.phase, view.serving) == (
            "",
            1,
            "leader",
            "active",
            True,
        )
        assert view.tail is None  # in memory: no log here
        await stream.send(inspect("wide", shard=7))
        view = (await stream.recv()).view  # type: ignore[union-attr]
        assert (view.shards, view.role, view.phase, view.serving, view.reason) == (
            4,
            "none",
            "unassigned",
            False,
            "not_assigned_here",
        )
        await stream.send(inspect("missing"))
        view = (await stream.recv()).view  # type: ignore[union-attr]
        assert view.shards == 0 and view.role == "none"
        await stream.send(inspect("c", shard=1, kind=ShardKind.CACHE))
        view = (await stream.recv()).view  # type: ignore[union-attr]
        assert (view.shards, view.role) == (2, "leader")
        client.close()


async def test_subscriptions_are_listed_filtered_and_paged(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        ids = []
        for name, shard in [("wide", 2), ("wide", 0), ("orders", 0), ("wide", 0)]:
            control, _ = await client.authed()
            await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream=name, shard=shard))
            subscribed = await control.recv()
            assert isinstance(subscribed, Subscribed)
            ids.append(subscribed.subscription_id)
        stream, _ = await client.authed(tok=token(broker, perms=OPERATOR))
        await stream.send(SubscriptionsList(request_id=1))
        listed = await stream.recv()
        assert isinstance(listed, SubscriptionsListInfo) and listed.node_id == ""
        order = [(s.stream, s.shard, s.subscriber_id) for s in listed.subscriptions]
        assert order == sorted(order) and len(order) == 4
        assert listed.next_cursor is None
        entry = listed.subscriptions[0]
        assert entry.principal == "tester" and entry.policy == "drop_new"
        assert entry.peer is not None and entry.peer.startswith("127.0.0.1:")
        assert {s.connection for s in listed.subscriptions} == {1}  # one client connection
        await stream.send(
            SubscriptionsList(
                filter=SubscriptionFilter(stream="wide", shard=0), limit=1, request_id=2
            )
        )
        first = await stream.recv()
        assert isinstance(first, SubscriptionsListInfo) and len(first.subscriptions) == 1
        assert first.next_cursor == SubscriptionCursor(
            tenant_id=TENANT, namespace=NS, stream="wide", shard=0, subscriber_id=ids[1]
        )
        await stream.send(
            SubscriptionsList(
                filter=SubscriptionFilter(stream="wide", shard=0),
                limit=1,
                cursor=first.next_cursor,
                request_id=3,
            )
        )
        second = await stream.recv()
        assert isinstance(second, SubscriptionsListInfo)
        assert [s.subscriber_id for s in second.subscriptions] == [ids[3]]
        assert second.next_cursor is None
        client.close()
