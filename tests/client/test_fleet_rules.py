"""The fleet rules without I/O: additive topology, generations per shard, and one
request's walk (hop limit, no broker twice, back to the entry once)."""

from __future__ import annotations

from felix_client._fleet import ENTRY, MAX_HOPS, Attempt, Fleet, Owner
from felix_wire.messages import BrokerEndpoint

REF = ("stream", "default", "log", 0)


def test_topology_is_additive_and_keeps_the_seeds() -> None:
    fleet = Fleet(seeds=("s:1",))
    assert fleet.learn([BrokerEndpoint(node_id="a", addr="a:1")]) == ["a:1"]
    assert fleet.learn([]) == []
    assert fleet.learn([BrokerEndpoint(node_id="s", addr="s:1")]) == []
    assert fleet.addrs == ["s:1", "a:1"]


def test_an_owner_older_than_the_generation_held_is_refused() -> None:
    fleet = Fleet(seeds=("s:1",))
    assert fleet.note(REF, Owner("a", "a:1", 5))
    assert not fleet.note(REF, Owner("b", "b:1", 4))
    assert fleet.owner(REF) == Owner("a", "a:1", 5)
    assert fleet.note(REF, Owner("b", "b:1", 5))  # same generation: taken
    fleet.forget(REF)
    assert fleet.owner(REF) is None
    assert not fleet.note(REF, Owner("c", "c:1", 3))  # the generation outlives the owner


def test_the_owner_table_is_bounded() -> None:
    fleet = Fleet(seeds=("s:1",), max_shards=2)
    for shard in range(3):
        fleet.note(("stream", "ns", "x", shard), Owner("a", "a:1", 1))
    assert fleet.owner(("stream", "ns", "x", 0)) is None
    assert fleet.owner(("stream", "ns", "x", 2)) is not None


def test_an_attempt_takes_at_most_three_hops_and_no_broker_twice() -> None:
    fleet = Fleet(seeds=("s:1",))
    attempt = Attempt(fleet, REF, ENTRY)
    attempt.at("s:1")
    assert attempt.redirected(Owner("s", "s:1", 1)) is False  # the entry itself
    for hop in range(MAX_HOPS):
        assert attempt.redirected(Owner(f"n{hop}", f"n{hop}:1", hop + 1)) == f"n{hop}:1"
    assert attempt.redirected(Owner("late", "late:1", 9)) is False
    assert attempt.hops == MAX_HOPS


def test_a_redirect_without_an_address_or_older_than_held_is_not_followed() -> None:
    fleet = Fleet(seeds=("s:1",))
    fleet.note(REF, Owner("a", "a:1", 5))
    attempt = Attempt(fleet, REF, "a:1")
    assert attempt.redirected(Owner("b", "b:1", 4)) is False  # held owner already tried
    assert attempt.redirected(Owner("b", None, 6)) is False
    assert fleet.generation(REF) == 6


def test_back_to_the_entry_once() -> None:
    fleet = Fleet(seeds=("s:1",))
    attempt = Attempt(fleet, REF, ENTRY)
    assert attempt.refused_here() is False  # the entry's own refusal is the answer
    attempt = Attempt(fleet, REF, ENTRY)
    assert attempt.redirected(Owner("a", "a:1", 1)) == "a:1"
    assert attempt.refused_here() is ENTRY
    assert fleet.owner(REF) is None  # forgotten at once
    assert attempt.redirected(Owner("b", "b:1", 2)) == "b:1"
    assert attempt.refused_here() is False
