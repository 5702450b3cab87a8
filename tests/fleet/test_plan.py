"""The placement rule as a pure function: spread by count, durable shards kept for their
broker, in-memory shards re-placed at once, gone streams unassigned."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from felix_broker.fleet.routing import ShardId, ShardKind
from felix_common.fleet import Assignment
from felix_controlplane.placement import Held, ShardSpec, plan, shard_specs
from felix_wire.fleet import AssignmentState as RecordState


def specs(count: int, *, durable: bool = False, name: str = "s") -> list[ShardSpec]:
    return shard_specs([("t", "ns", name, count, durable)], [])


def applied(writes: list, current: dict[ShardId, Held] | None = None) -> dict[ShardId, Held]:
    out = dict(current or {})
    for i, w in enumerate(writes, start=1000):
        if w.record is None:
            out.pop(w.shard, None)
        else:
            out[w.shard] = Held(w.record, i)
    return out


@given(shards=st.integers(1, 40), members=st.integers(1, 7))
def test_new_shards_are_spread_by_count(shards: int, members: int) -> None:
    live = [f"n{i}" for i in range(members)]
    writes = plan(specs(shards), live, {})
    assert all(w.expected == 0 and w.record.state == "active" for w in writes)
    load = Counter(w.record.leader for w in writes)
    assert max(load.values()) <= -(-shards // members)
    assert set(load) <= set(live)
    assert plan(specs(shards), live, applied(writes)) == []  # a placed fleet is left alone


def test_placement_is_the_same_on_any_placer() -> None:
    live = ["a", "b", "c"]
    assert plan(specs(12), live, {}) == plan(specs(12), list(reversed(live)), {})


def test_a_lost_members_memory_shards_move_and_durable_ones_wait_for_it() -> None:
    memory, durable = specs(4, name="mem"), specs(4, durable=True, name="dur")
    caches = shard_specs([], [("t", "ns", "c", 2)])
    everything = memory + durable + caches
    current = {
        s.shard: Held(Assignment(replicas=[], state=RecordState.ACTIVE, leader="a"), 7)
        for s in everything
    }
    writes = {w.shard: w for w in plan(everything, ["b"], current)}
    for s in memory:
        w = writes[s.shard]
        assert (w.record.state, w.record.leader, w.expected) == ("active", "b", 7)
    for s in durable + caches:  # never served empty elsewhere
        w = writes[s.shard]
        assert (w.record.state, w.record.leader, w.record.reason) == (
            "unavailable",
            "a",
            "owner_unavailable",
        )
    after = applied(list(writes.values()), current)
    assert plan(everything, ["b"], after) == []  # nothing to do twice
    back = {w.shard: w for w in plan(everything, ["a", "b"], after)}
    assert set(back) == {s.shard for s in durable + caches}
    assert all((w.record.state, w.record.leader) == ("active", "a") for w in back.values())


def test_no_member_means_not_assigned_and_gone_streams_lose_their_keys() -> None:
    writes = plan(specs(2), [], {})
    assert [(w.record.state, w.record.reason) for w in writes] == [
        ("unavailable", "not_assigned")
    ] * 2
    assert plan(specs(2), [], applied(writes)) == []
    placed = applied(plan(specs(2), ["a"], applied(writes)))
    gone = plan([], ["a"], placed)
    assert [(w.record, w.expected) for w in gone] == [
        (None, placed[w.shard].mod_revision) for w in gone
    ]
    assert len(gone) == 2


def test_moves_in_progress_are_left_alone() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "s", 0)
    current = {shard: Held(Assignment(replicas=[], state=RecordState.MOVING, leader="gone"), 3)}
    assert plan(specs(1), ["a"], current) == []


def _moving(leader: str, successor: str, revision: int = 50) -> Held:
    record = Assignment(state=RecordState.MOVING, leader=leader, replicas=[], successor=successor)
    return Held(record, revision)


def test_a_drained_brokers_shards_catch_up_toward_the_others_and_nothing_lands_on_it() -> None:
    placed = applied(plan(specs(6, durable=True), ["a", "b", "c"], {}))
    writes = plan(specs(6, durable=True), ["a", "b", "c"], placed, draining=["a"])
    led_by_a = {s for s, h in placed.items() if h.record.leader == "a"}
    assert {w.shard for w in writes} == led_by_a
    for w in writes:
        # The catch-up: still served by a (active) while a copies it to its successor.
        assert w.record.state == "active" and w.record.leader == "a"
        assert w.record.successor in ("b", "c")
        assert w.expected == placed[w.shard].mod_revision
    # A new stream while a drains: none of it on a.
    fresh = plan(specs(4, name="new"), ["a", "b", "c"], {}, draining=["a"])
    assert {w.record.leader for w in fresh} <= {"b", "c"}


def test_a_drain_starts_at_most_max_moves_copies_and_queues_the_rest() -> None:
    spec = specs(12, durable=True)
    placed = {s.shard: Held(Assignment(state=RecordState.ACTIVE, leader="a", replicas=[]), 10 + i)
              for i, s in enumerate(spec)}  # fmt: skip
    first = plan(spec, ["a", "b", "c"], placed, draining=["a"], max_moves=3)
    assert len(first) == 3 and all(w.record.successor in ("b", "c") for w in first)
    current = applied(first, placed)
    # Nothing more while three are in progress (catching up, then fenced).
    assert plan(spec, ["a", "b", "c"], current, draining=["a"], max_moves=3) == []
    one = first[0].shard
    fenced = plan(
        spec, ["a", "b", "c"], current, draining=["a"], max_moves=3,
        copied={(str(current[one].record.successor), one): current[one].mod_revision},
    )  # fmt: skip
    assert [(w.shard, w.record.state) for w in fenced] == [(one, "moving")]
    current = applied(fenced, current)
    assert plan(spec, ["a", "b", "c"], current, draining=["a"], max_moves=3) == []
    # One cut over: one more starts.
    successor = str(current[one].record.successor)
    cut = plan(
        spec, ["a", "b", "c"], current, draining=["a"], max_moves=3,
        copied={(successor, one): current[one].mod_revision},
    )  # fmt: skip
    assert [(w.shard, w.record.state, w.record.leader) for w in cut] == [(one, "active", successor)]
    current = applied(cut, current)
    (started,) = plan(spec, ["a", "b", "c"], current, draining=["a"], max_moves=3)
    assert started.shard not in {w.shard for w in first} and started.record.successor
    # No cap: every shard of a at once.
    assert len(plan(spec, ["a", "b", "c"], placed, draining=["a"], max_moves=0)) == 12


def _catching_up(leader: str, successor: str, revision: int = 40) -> Held:
    record = Assignment(state=RecordState.ACTIVE, leader=leader, replicas=[], successor=successor)
    return Held(record, revision)


def test_a_catch_up_is_fenced_only_for_a_copy_of_its_own_generation() -> None:
    spec = specs(1, durable=True)
    shard = spec[0].shard
    current = {shard: _catching_up("a", "b", revision=40)}
    assert plan(spec, ["a", "b"], current) == []
    assert plan(spec, ["a", "b"], current, copied={("b", shard): 39}) == []
    (fence,) = plan(spec, ["a", "b"], current, copied={("b", shard): 40})
    assert (fence.record.state, fence.record.leader, fence.record.successor) == ("moving", "a", "b")
    # Its successor left: served by a alone again; its leader lost: unavailable, kept.
    (back,) = plan(spec, ["a"], current)
    assert (back.record.state, back.record.leader, back.record.successor) == ("active", "a", None)
    (lost,) = plan(spec, ["b", "c"], current)
    assert (lost.record.state, lost.record.reason, lost.record.successor) == (
        "unavailable",
        "owner_unavailable",
        None,
    )


def test_a_move_cuts_over_only_for_a_copy_of_its_own_generation() -> None:
    spec = specs(1, durable=True)
    shard = spec[0].shard
    current = {shard: _moving("a", "b", revision=50)}
    assert plan(spec, ["a", "b"], current) == []  # no copy reported yet
    stale = {("b", shard): 49}  # a copy made for an older fence
    assert plan(spec, ["a", "b"], current, copied=stale) == []
    (cut,) = plan(spec, ["a", "b"], current, copied={("b", shard): 50})
    assert (cut.record.state, cut.record.leader, cut.expected) == ("active", "b", 50)


def test_a_move_whose_successor_left_is_retaken_and_a_fence_waits() -> None:
    spec = specs(1, durable=True)
    shard = spec[0].shard
    (retake,) = plan(spec, ["a"], {shard: _moving("a", "b")})
    assert (retake.record.state, retake.record.leader) == ("active", "a")
    (lost,) = plan(spec, ["c"], {shard: _moving("a", "b")})
    assert (lost.record.state, lost.record.reason) == ("unavailable", "owner_unavailable")
    assert plan(spec, ["a", "b"], {shard: _moving("a", "a")}) == []  # a fence: until cancelled


def _quorum(name: str = "q") -> list[ShardSpec]:
    streams = [("t", "ns", name, 1, True)]
    named = (ShardKind.STREAM, "t", "ns", name)
    return shard_specs(streams, [], {named: 3}, frozenset({named}))


def test_a_drained_leader_of_a_replicated_shard_hands_it_to_a_replica_keeping_the_set() -> None:
    spec = _quorum()
    shard = spec[0].shard
    placed = Held(Assignment(state=RecordState.ACTIVE, leader="a", replicas=["a", "b", "c"]), 7)
    (handoff,) = plan(spec, ["a", "b", "c", "d"], {shard: placed}, draining=["a"])
    # A promotion at a new generation, never a file copy (no ``moving``, no successor).
    assert handoff.record.state == "active" and handoff.record.successor is None
    assert handoff.record.leader in ("b", "c")
    assert handoff.record.replicas == ["a", "b", "c"]
    assert handoff.expected == 7
    # Only the drained broker and nobody else of its set live: it stays (no majority).
    assert plan(spec, ["a", "d"], {shard: placed}, draining=["a"]) == []
    # Back after a loss while drained: served again with its set, then handed off.
    lost = Assignment(
        state=RecordState.UNAVAILABLE,
        leader="a",
        replicas=["a", "b", "c"],
        reason="owner_unavailable",
    )
    (back,) = plan(spec, ["a", "d"], {shard: Held(lost, 8)}, draining=["a"])
    assert (back.record.state, back.record.leader) == ("active", "a")
    assert back.record.replicas == ["a", "b", "c"]


def test_a_fence_and_its_cancel_keep_a_replica_set() -> None:
    spec = _quorum()
    shard = spec[0].shard
    fenced = Assignment(
        state=RecordState.MOVING, leader="a", replicas=["a", "b", "c"], successor="x"
    )
    (retake,) = plan(spec, ["a", "b", "c"], {shard: Held(fenced, 9)})  # its successor left
    assert (retake.record.leader, retake.record.replicas) == ("a", ["a", "b", "c"])
