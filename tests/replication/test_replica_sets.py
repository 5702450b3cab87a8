"""Replica sets and consistency in the catalog, and the placer spreading replicas."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.catalog import CatalogError, load_catalog
from felix_common.catalog import MAX_REPLICATION_FACTOR, CacheSpec, Consistency, StreamSpec
from felix_common.feed import (
    InvalidDefinition,
    cache_body,
    stream_body,
    validate_cache,
    validate_stream,
)
from felix_common.fleet import Assignment, ShardId, ShardKind
from felix_controlplane.placement import Held, plan, shard_specs
from felix_wire.fleet import AssignmentState as RecordState
from felix_wire.fleet import PromotionRefusal


def test_defaults_are_one_replica_and_leader_consistency() -> None:
    spec = StreamSpec("t1", "ns", "s")
    assert (spec.replication_factor, spec.consistency) == (1, Consistency.LEADER)
    cache = CacheSpec("t1", "ns", "c")
    assert (cache.replication_factor, cache.consistency) == (1, Consistency.LEADER)


@pytest.mark.parametrize("factor", [0, -1, MAX_REPLICATION_FACTOR + 1, True, "3"])
def test_a_replication_factor_out_of_range_is_refused_by_name(factor: object) -> None:
    with pytest.raises(ValueError, match="replication_factor must be an integer between 1"):
        StreamSpec("t1", "ns", "s", replication_factor=factor)  # type: ignore[arg-type]


def test_quorum_needs_a_durable_stream() -> None:
    with pytest.raises(ValueError, match="Quorum consistency needs a durable stream"):
        StreamSpec("t1", "ns", "s", consistency=Consistency.QUORUM)
    assert StreamSpec("t1", "ns", "s", durable=True, consistency=Consistency.QUORUM)


def test_the_api_body_takes_both_spellings_and_stores_one() -> None:
    body = {"name": "o", "durability": "durable", "consistency": "Quorum", "replication_factor": 3}
    definition = validate_stream("t1", "ns", body)
    assert definition.spec.consistency is Consistency.QUORUM
    assert definition.spec.replication_factor == 3
    stored = stream_body(definition)
    assert (stored["consistency"], stored["replication_factor"]) == ("quorum", 3)
    assert validate_stream("t1", "ns", stored) == definition  # the stored form reads back
    cache = validate_cache("t1", "ns", {"name": "c", "replication_factor": 5})
    assert cache_body(cache) == {
        "name": "c",
        "shards": 1,
        "consistency": "leader",
        "replication_factor": 5,
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "s", "consistency": "strong"}, "stream.consistency: consistency must be"),
        ({"name": "s", "replication_factor": 0}, "stream.replication_factor: must be between"),
        ({"name": "s", "consistency": "quorum"}, "Quorum needs durability durable"),
    ],
)
def test_the_api_refuses_a_bad_replication_setting_naming_the_field(
    body: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidDefinition, match=message):
        validate_stream("t1", "ns", body)


def test_the_static_catalog_reads_replication_and_names_the_bad_path() -> None:
    section = {
        "tenants": {
            "t1": {
                "namespaces": {
                    "ns": {
                        "streams": {
                            "q": {"durable": True, "replication_factor": 3, "consistency": "Quorum"}
                        },
                        "caches": {"c": {"replication_factor": 3}},
                    }
                }
            }
        }
    }
    catalog = load_catalog(section)
    stream = catalog.stream("t1", "ns", "q")
    assert stream is not None
    assert (stream.replication_factor, stream.consistency) == (3, Consistency.QUORUM)
    bad = {"tenants": {"t1": {"namespaces": {"ns": {"streams": {"q": {"consistency": "Quorum"}}}}}}}
    with pytest.raises(CatalogError, match=r"streams\.q\.consistency"):
        load_catalog(bad)


def _specs(count: int, factor: int) -> list:
    return shard_specs(
        [("t", "ns", "q", count, True)], [], {(ShardKind.STREAM, "t", "ns", "q"): factor}
    )


@given(shards=st.integers(1, 24), members=st.integers(3, 7), factor=st.sampled_from([3, 5]))
def test_replicas_are_distinct_live_brokers_led_by_the_leader_and_spread(
    shards: int, members: int, factor: int
) -> None:
    live = [f"n{i}" for i in range(members)]
    if factor > members:
        factor = 3
    writes = plan(_specs(shards, factor), live, {})
    held: Counter[str] = Counter()
    for w in writes:
        assert w.record is not None and w.record.state == "active"
        replicas = w.record.replicas
        assert len(replicas) == factor == len(set(replicas))
        assert replicas[0] == w.record.leader and set(replicas) <= set(live)
        held.update(replicas)
    # Spread: no broker holds more than its even share plus one.
    assert max(held.values()) <= -(-shards * factor // members) + 1
    current = {w.shard: Held(w.record, 10 + i) for i, w in enumerate(writes) if w.record}
    assert plan(_specs(shards, factor), live, current) == []  # a placed fleet is left alone


def test_a_replicated_shard_waits_for_enough_brokers_and_is_not_rewritten_meanwhile() -> None:
    writes = plan(_specs(1, 3), ["a", "b"], {})
    assert [(w.record.state, w.record.reason) for w in writes if w.record] == [
        ("unavailable", "not_assigned")
    ]
    current = {w.shard: Held(w.record, 5) for w in writes if w.record}
    assert plan(_specs(1, 3), ["a", "b"], current) == []
    placed = plan(_specs(1, 3), ["a", "b", "c"], current)
    assert placed[0].record is not None and sorted(placed[0].record.replicas) == ["a", "b", "c"]


def test_the_replica_set_is_kept_through_the_leaders_loss_and_return() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "q", 0)
    record = Assignment(replicas=["a", "b", "c"], state=RecordState.ACTIVE, leader="a")
    lost = plan(_specs(1, 3), ["b", "c"], {shard: Held(record, 7)})
    assert lost[0].record is not None
    assert (lost[0].record.state, lost[0].record.replicas) == ("unavailable", ["a", "b", "c"])
    back = plan(_specs(1, 3), ["a", "b", "c"], {shard: Held(lost[0].record, 8)})
    assert back[0].record is not None
    assert (back[0].record.state, back[0].record.replicas) == ("active", ["a", "b", "c"])


def _quorum_specs() -> list:
    named = (ShardKind.STREAM, "t", "ns", "q")
    return shard_specs([("t", "ns", "q", 1, True)], [], {named: 3}, frozenset({named}))


def test_a_replicated_shards_lost_leader_is_succeeded_by_a_live_replica() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "q", 0)
    record = Assignment(replicas=["a", "b", "c"], state=RecordState.ACTIVE, leader="a")
    writes = plan(_quorum_specs(), ["b", "c"], {shard: Held(record, 7)})
    assert len(writes) == 1 and writes[0].record is not None and writes[0].expected == 7
    promoted = writes[0].record
    assert (promoted.state, promoted.replicas) == ("active", ["a", "b", "c"])
    assert promoted.leader in ("b", "c")
    # The old leader returns: the successor keeps the shard.
    assert plan(_quorum_specs(), ["a", "b", "c"], {shard: Held(promoted, 8)}) == []


def test_no_promotion_without_a_live_majority_or_for_a_leader_consistency_shard() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "q", 0)
    record = Assignment(replicas=["a", "b", "c"], state=RecordState.ACTIVE, leader="a")
    alone = plan(_quorum_specs(), ["b"], {shard: Held(record, 7)})
    assert alone[0].record is not None
    assert (alone[0].record.state, alone[0].record.leader) == ("unavailable", "a")
    leader_level = plan(_specs(1, 3), ["b", "c"], {shard: Held(record, 7)})
    assert leader_level[0].record is not None
    assert (leader_level[0].record.state, leader_level[0].record.leader) == ("unavailable", "a")


def test_a_refused_promotion_moves_to_the_live_replica_named_ahead() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "q", 0)
    promoted = Assignment(replicas=["a", "b", "c"], state=RecordState.ACTIVE, leader="b")
    refusal = PromotionRefusal(generation=9, ahead=["c"])
    writes = plan(
        _quorum_specs(), ["b", "c"], {shard: Held(promoted, 9)}, refused={("b", shard): refusal}
    )
    assert len(writes) == 1 and writes[0].expected == 9
    again = writes[0].record
    assert again is not None and (again.state, again.leader) == ("active", "c")
    # A refusal of an older generation is history: the newer assignment stands.
    assert (
        plan(
            _quorum_specs(),
            ["b", "c"],
            {shard: Held(promoted, 10)},
            refused={("b", shard): refusal},
        )
        == []
    )


def test_a_refused_promotion_with_nobody_ahead_live_stays_unavailable_never_served_short() -> None:
    shard = ShardId(ShardKind.STREAM, "t", "ns", "q", 0)
    promoted = Assignment(replicas=["a", "b", "c"], state=RecordState.ACTIVE, leader="b")
    refused = {("b", shard): PromotionRefusal(generation=9, ahead=["a"])}
    writes = plan(_quorum_specs(), ["b", "c"], {shard: Held(promoted, 9)}, refused=refused)
    kept = writes[0].record
    assert kept is not None
    assert (kept.state, kept.reason, kept.leader) == ("unavailable", "owner_unavailable", "a")
    # Meanwhile the replica that refused is not tried again (it is behind); another
    # live one not known to be behind may be (its core opens only if none is ahead).
    [tried] = plan(_quorum_specs(), ["b", "c"], {shard: Held(kept, 10)}, refused=refused)
    assert tried.record is not None and (tried.record.state, tried.record.leader) == (
        "active",
        "c",
    )
    both = {**refused, ("c", shard): PromotionRefusal(generation=11, ahead=["a"])}
    [still] = plan(_quorum_specs(), ["b", "c"], {shard: Held(tried.record, 11)}, refused=both)
    assert still.record is not None and (still.record.state, still.record.leader) == (
        "unavailable",
        "a",
    )
    assert plan(_quorum_specs(), ["b", "c"], {shard: Held(still.record, 12)}, refused=both) == []
    # The one ahead returns: it takes the shard back.
    back = plan(_quorum_specs(), ["a", "b", "c"], {shard: Held(kept, 10)}, refused=refused)
    assert back[0].record is not None
    assert (back[0].record.state, back[0].record.leader) == ("active", "a")
