"""The inspection answers: a standalone broker's shard views and the paged subscription list."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.inspection.views import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    effective_limit,
    held_shard,
    page_subscriptions,
    unassigned_shard,
)
from felix_wire.codec import encode_frame
from felix_wire.messages import (
    InspectedSubscription,
    ShardInspectInfo,
    SubscriptionCursor,
    SubscriptionFilter,
)


def _entry(stream: str, shard: int, subscriber: int, **extra: object) -> InspectedSubscription:
    fields: dict[str, object] = {
        "tenant_id": "t1",
        "namespace": "default",
        "stream": stream,
        "shard": shard,
        "subscriber_id": subscriber,
        "subscription_id": subscriber,
        "policy": "drop_new",
        "depth": 0,
        "capacity": 10,
        "dropped": 0,
        "tail": 0,
        "age_ms": 1,
    }
    fields.update(extra)
    return InspectedSubscription(**fields)  # type: ignore[arg-type]


def _body(message: object) -> dict[str, object]:
    decoded: dict[str, object] = msgspec.json.decode(encode_frame(message)[12:])  # type: ignore[arg-type]
    return decoded


def test_shard_views_on_the_wire() -> None:
    held = _body(ShardInspectInfo(view=held_shard(4, tail=17), request_id=1))
    assert held["view"] == {
        "node_id": "",
        "shards": 4,
        "role": "leader",
        "phase": "active",
        "serving": True,
        "generation": 0,
        "tail": 17,
    }
    in_memory = _body(ShardInspectInfo(view=held_shard(1, tail=None), request_id=1))
    assert "tail" not in in_memory["view"]  # type: ignore[operator]
    assert _body(ShardInspectInfo(view=unassigned_shard(0), request_id=1))["view"] == {
        "node_id": "",
        "shards": 0,
        "role": "none",
        "phase": "unassigned",
        "serving": False,
        "reason": "not_assigned_here",
    }


def test_limit_defaults_and_caps() -> None:
    assert effective_limit(None) == DEFAULT_LIMIT == 100
    assert effective_limit(5000) == MAX_LIMIT == 1000
    assert effective_limit(0) == 1


def test_filters() -> None:
    entries = [
        _entry("a", 0, 1, principal="alice"),
        _entry("a", 1, 2, principal="bob", dropped=3),
        _entry("b", 0, 3),
        _entry("b", 0, 4, tenant_id="t2"),
    ]

    def ids(wanted: SubscriptionFilter) -> list[int]:
        page = page_subscriptions(entries, wanted, cursor=None, limit=None)
        return [e.subscriber_id for e in page.subscriptions]

    assert ids(SubscriptionFilter()) == [1, 2, 3, 4]
    assert ids(SubscriptionFilter(tenant_id="t1", stream="a")) == [1, 2]
    assert ids(SubscriptionFilter(shard=0, namespace="default", tenant_id="t1")) == [1, 3]
    assert ids(SubscriptionFilter(principal="bob")) == [2]
    assert ids(SubscriptionFilter(dropping=True)) == [2]


@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 50)),
        unique_by=lambda t: (t[0], t[1], t[2]),
        max_size=40,
    ),
    st.integers(1, 7),
)
def test_paging_visits_everything_once_in_order(
    keys: list[tuple[str, int, int]], limit: int
) -> None:
    entries = [_entry(stream, shard, sub) for stream, shard, sub in keys]
    seen: list[tuple[str, int, int]] = []
    cursor: SubscriptionCursor | None = None
    for _ in range(len(entries) + 2):
        page = page_subscriptions(entries, SubscriptionFilter(), cursor=cursor, limit=limit)
        assert len(page.subscriptions) <= limit
        seen += [(e.stream, e.shard, e.subscriber_id) for e in page.subscriptions]
        if page.next_cursor is None:
            break
        assert len(page.subscriptions) == limit
        cursor = page.next_cursor
    assert seen == sorted(keys)
