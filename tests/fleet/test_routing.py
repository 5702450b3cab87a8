"""The routing snapshot applies assignment changes by generation, and never in place."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from felix_broker.fleet.routing import (
    AssignmentState,
    Member,
    Route,
    RoutingSnapshot,
    ShardId,
    ShardKind,
)

S0 = ShardId(ShardKind.STREAM, "t1", "default", "orders", 0)
S1 = ShardId(ShardKind.CACHE, "t1", "default", "orders", 0)
A = Member("a", "127.0.0.1:5000", "127.0.0.1:6000")
B = Member("b", "", "127.0.0.1:6001")


def active(generation: int, leader: str) -> Route:
    return Route(generation=generation, state=AssignmentState.ACTIVE, leader=leader)


def test_a_change_at_or_below_the_held_generation_is_dropped() -> None:
    snap = RoutingSnapshot("a").with_routes([(S0, active(5, "a"))])
    assert snap.with_routes([(S0, active(5, "b"))]) is snap
    assert snap.with_routes([(S0, active(4, "b"))]) is snap
    newer = snap.with_routes([(S0, active(6, "b"))])
    assert newer.route(S0) == active(6, "b")
    assert snap.route(S0) == active(5, "a")  # the old snapshot is unchanged


def test_leads_only_an_active_assignment_naming_this_broker() -> None:
    snap = RoutingSnapshot("a").with_routes(
        [(S0, active(1, "a")), (S1, Route(2, AssignmentState.MOVING, leader="a"))]
    )
    assert snap.leads(S0)
    assert not snap.leads(S1)
    assert not RoutingSnapshot("b", routes=snap.routes).leads(S0)


def test_members_and_topology() -> None:
    snap = RoutingSnapshot("a").with_member(B).with_member(A)
    assert snap.routable_members() == [A]  # b has no client address
    snap = snap.with_routes([(S0, active(3, "b"))])
    assert snap.leader_of(S0) == B
    assert snap.without_member("b").leader_of(S0) is None
    assert snap.without_member("zzz") is snap


def test_a_deletion_applies_only_when_newer() -> None:
    snap = RoutingSnapshot("a").with_routes([(S0, active(5, "a"))])
    assert snap.without_route(S0, 5) is snap
    assert snap.without_route(S0, 6).route(S0) is None


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 50), st.sampled_from("abc"))))
def test_any_delivery_order_keeps_the_highest_generation(
    events: list[tuple[int, int, str]],
) -> None:
    """However the watch delivers (late, duplicated, reordered), the held route is the
    one with the highest generation seen for each shard."""
    shards = [S0, S1]
    snap = RoutingSnapshot("a")
    for index, generation, leader in events:
        snap = snap.with_routes([(shards[index], active(generation, leader))])
    for index, shard in enumerate(shards):
        seen = [(g, leader) for i, g, leader in events if i == index]
        if not seen:
            assert snap.route(shard) is None
            continue
        best = max(g for g, _ in seen)
        first_leader = next(leader for g, leader in seen if g == best)
        assert snap.route(shard) == active(best, first_leader)
