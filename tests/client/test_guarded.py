"""publish_if, commit / state_get and operator inspection over real QUIC: typed
results and typed refusals."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

import felix_client

from .conftest import connect_client
from .support import operator_token

pytestmark = pytest.mark.timeout(120)


async def test_publish_if_appends_only_at_the_expected_tail(
    felix_fixture: dict[str, Any],
) -> None:
    stream = felix_fixture["durable_stream"]
    key = os.urandom(6)
    async with await connect_client(felix_fixture) as client:
        with pytest.raises(felix_client.OffsetMismatchError) as caught:
            await client.publish_if(stream, [b"a"], expected_offset=10**12, key=key)
        tail = caught.value.tail
        assert caught.value.expected == 10**12
        first = await client.publish_if(stream, [b"a", b"b"], expected_offset=tail, key=key)
        assert first == tail
        # Racers expecting the same tail: exactly one wins, the others learn the new tail.
        results = await asyncio.gather(
            *(
                client.publish_if(stream, b"r%d" % i, expected_offset=tail + 2, key=key)
                for i in range(8)
            ),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, int)]
        losers = [r for r in results if isinstance(r, felix_client.OffsetMismatchError)]
        assert winners == [tail + 2] and len(losers) == 7
        assert {e.tail for e in losers} == {tail + 3}
        with pytest.raises(ValueError):
            await client.publish_if(stream, [], expected_offset=0)
        with pytest.raises(felix_client.InvalidRequestError):
            await client.publish_if(felix_fixture["memory_stream"], b"x", expected_offset=0)


async def test_commit_and_state_get(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    entity = b"order-" + os.urandom(4).hex().encode()
    async with await connect_client(felix_fixture) as client:
        nothing = await client.state_get(stream, entity, "status")
        assert nothing.value is None and nothing.version is None
        offset = await client.commit(
            stream, entity, b"created", changes={"status": b"new", "total": b"42"}
        )
        entry = await client.state_get(stream, entity, "status")
        assert (entry.value, entry.version) == (b"new", offset)
        assert entry.as_of is not None and entry.as_of >= offset

        # Conditional: only at the expected tail, and a refusal writes nothing.
        with pytest.raises(felix_client.OffsetMismatchError) as caught:
            await client.commit(
                stream, entity, b"paid", changes={"status": b"paid"}, expected_offset=offset
            )
        assert caught.value.tail == offset + 1
        assert (await client.state_get(stream, entity, "status")).value == b"new"
        paid = await client.commit(
            stream,
            entity,
            b"paid",
            changes={"status": b"paid", "total": None},
            expected_offset=caught.value.tail,
        )
        assert paid == offset + 1
        assert (await client.state_get(stream, entity, "status")).value == b"paid"
        assert (await client.state_get(stream, entity, "total")).value is None

        # The commit's event is a record like any other, at commit_ok's offset.
        shard = await client.shard_for_key(stream, entity)
        pages = client.stream_read(stream, start=offset, end=paid + 1, shard=shard)
        events = [(r.offset, r.payload) async for page in pages for r in page.records]
        assert events[0] == (offset, b"created") and events[-1] == (paid, b"paid")

        with pytest.raises(felix_client.InvalidRequestError):
            await client.commit(felix_fixture["memory_stream"], entity, b"x")


async def test_shard_inspect_needs_the_exact_permission(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    async with await connect_client(felix_fixture) as client:
        with pytest.raises(felix_client.ForbiddenError):
            await client.shard_inspect(stream, shard=1)
        assert await client.stream_shards(stream) == 4  # the client stays usable
    wildcard = await operator_token(felix_fixture, "node.view:*")
    async with await connect_client(felix_fixture, token=wildcard) as client:
        with pytest.raises(felix_client.ForbiddenError):
            await client.shard_inspect(stream)
    async with await connect_client(
        felix_fixture, token=await operator_token(felix_fixture)
    ) as client:
        # A shard reports its tail once its log is open here: write to one first, so the
        # test does not depend on what earlier tests happened to publish.
        key = b"inspected"
        await client.publish(stream, b"x", key=key)
        shard = await client.shard_for_key(stream, key)
        view = await client.shard_inspect(stream, shard=shard)
        assert (view.node_id, view.role, view.phase, view.serving) == ("", "leader", "active", True)
        assert view.shards == 4 and view.tail is not None and view.tail >= 1
        cache = await client.shard_inspect(felix_fixture["cache"], kind="cache")
        assert cache.role == "leader"


async def test_subscriptions_list_pages(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    token = await operator_token(felix_fixture)
    async with await connect_client(felix_fixture, token=token) as client:
        async with client.subscribe(stream):  # one subscription per shard: 4
            pages = [p async for p in client.subscriptions_list(stream=stream, limit=1)]
            entries = [s for p in pages for s in p.subscriptions]
            assert len(entries) >= 4 and all(len(p.subscriptions) <= 1 for p in pages)
            assert pages[-1].next_cursor is None and pages[0].next_cursor is not None
            keys = [(s.shard, s.subscriber_id) for s in entries]
            assert keys == sorted(keys) and len(set(keys)) == len(keys)
            assert {s.shard for s in entries} == {0, 1, 2, 3}
            # A later listing resumes from a page's cursor.
            resumed = client.subscriptions_list(stream=stream, cursor=pages[0].next_cursor)
            rest = [s async for p in resumed for s in p.subscriptions]
            assert [(s.shard, s.subscriber_id) for s in rest] == keys[1:]
            one = [p async for p in client.subscriptions_list(stream=stream, shard=2)]
            assert {s.shard for p in one for s in p.subscriptions} == {2}
        with pytest.raises(ValueError):
            client.subscriptions_list(limit=1001)
    async with await connect_client(felix_fixture) as client:
        with pytest.raises(felix_client.ForbiddenError):
            async for _page in client.subscriptions_list():
                pass
