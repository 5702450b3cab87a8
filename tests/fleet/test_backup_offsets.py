"""`cluster_backup_offsets`: a fleet member's /backup/offsets from its routing view
(every route state and the local logs), without QUIC or etcd."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from felix_broker.fleet.backup import cluster_backup_offsets, scope_key
from felix_broker.fleet.routing import AssignmentState, Route, RoutingSnapshot, ShardId, ShardKind

T, NS = "t1", "ns"


def _shard(name: str, index: int = 0, kind: ShardKind = ShardKind.STREAM) -> ShardId:
    return ShardId(kind, T, NS, name, index)


def _entry(name: str, index: int = 0, kind: str = "stream") -> dict[str, Any]:
    return {"tenant_id": T, "namespace": NS, "name": name, "shard": index, "kind": kind}


def _snapshot(routes: dict[ShardId, Route]) -> RoutingSnapshot:
    return RoutingSnapshot(node_id="me", routes=MappingProxyType(routes))


LOCAL = {
    "node_id": "",
    "shards": [
        _entry("served") | {"generation": 0, "logs": {"records": 7, "group_cursors": 2}},
        _entry("elsewhere") | {"generation": 0, "logs": {"records": 3}},
        _entry("prices", kind="cache") | {"generation": 0, "logs": {"records": 4}},
        _entry("fenced") | {"generation": 0, "logs": {"records": 1}},
        _entry("broken") | {"generation": 0, "logs": {"records": 1}},
    ],
    "skipped": [_entry("memory") | {"reason": "not_durable"}],
}


def test_every_route_state_gets_its_answer() -> None:
    active = AssignmentState.ACTIVE
    routes = {
        _shard("served"): Route(11, active, leader="me"),
        _shard("elsewhere"): Route(12, active, leader="other"),
        _shard("prices", kind=ShardKind.CACHE): Route(13, active, leader="me"),
        _shard("memory"): Route(14, active, leader="me"),
        _shard("fenced"): Route(15, AssignmentState.UNAVAILABLE, leader="me", reason="fenced"),
        _shard("leaving"): Route(16, AssignmentState.MOVING, leader="me", successor="b"),
        _shard("draining"): Route(17, AssignmentState.DRAINING, leader="me"),
        _shard("broken"): Route(18, active, leader="me"),
        _shard("fresh"): Route(19, active, leader="me"),
    }
    answer = cluster_backup_offsets(
        _snapshot(routes), LOCAL, failed=[scope_key(ShardKind.STREAM, T, NS, "broken", 0)]
    )
    assert answer["node_id"] == "me"
    assert answer["shards"] == [
        _entry("prices", kind="cache") | {"generation": 13, "logs": {"records": 4}},
        _entry("fresh") | {"generation": 19, "logs": {"records": 0}},
        _entry("served") | {"generation": 11, "logs": {"records": 7, "group_cursors": 2}},
    ]
    skipped = {e["name"]: e for e in answer["skipped"]}
    assert set(skipped) == {"memory", "fenced", "leaving", "draining", "broken"}
    assert skipped["memory"]["reason"] == "not_durable"
    assert skipped["fenced"] == _entry("fenced") | {"reason": "refused", "detail": "fenced"}
    assert skipped["leaving"] == _entry("leaving") | {"reason": "moved", "detail": "moving to b"}
    assert skipped["draining"] == _entry("draining") | {"reason": "moved"}
    assert skipped["broken"]["reason"] == "error" and "failed" in skipped["broken"]["detail"]


def test_a_led_shard_outside_the_catalog_is_an_error_and_no_routes_is_empty() -> None:
    routes = {_shard("gone"): Route(3, AssignmentState.ACTIVE, leader="me")}
    answer = cluster_backup_offsets(_snapshot(routes), LOCAL, catalogued=set())
    assert answer["shards"] == []
    assert answer["skipped"][0]["reason"] == "error"
    assert "not in this broker's catalog" in answer["skipped"][0]["detail"]
    assert cluster_backup_offsets(_snapshot({}), LOCAL) == {
        "node_id": "me",
        "shards": [],
        "skipped": [],
    }
