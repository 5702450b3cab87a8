"""``GET /backup/offsets`` on a fleet member: the shards this broker leads, by the routing view.

Sans-IO: `cluster_backup_offsets` takes the routing snapshot the broker serves by
and the broker's local answer (the standalone one: every open log's committed
offsets, group offsets read before the records', and ``not_durable`` for
in-memory shards) and keeps what the seed asks of a cluster member:

- ``shards``: every shard the snapshot names this broker leader of and that it
  serves (state ``active``), with the route's ``generation`` and its logs. A
  durable shard led here with no log written yet has ``records: 0``.
- ``skipped``, with a reason, for every other shard whose leader the snapshot
  names this broker:

  ============  =================================================================
  not_durable   an in-memory stream or cache: nothing on disk to back up
  refused       the broker does not serve it now (``unavailable``: its lease is
                lost, the owner is unavailable, ...; ``detail`` is the reason)
  moved         its leadership is changing (``draining`` or ``moving``: a planned
                move; ``detail`` names the successor when the record has one)
  error         its log failed, or the shard is not in this broker's catalog
                (``detail`` says which)
  settling      a replicated (Quorum) shard whose replica here is not an open
                leader yet: just promoted and still fencing a majority, its stream
                log behind the mark, or its promotion refused (``detail`` is the
                replica's reason); its committed offset is not known here yet. A
                ``Leader`` shard is never settling: its committed offset is the
                leader's own
  ============  =================================================================

  All but ``not_durable`` are worth asking again shortly.

Shards led elsewhere are not listed, even when this broker still holds a log of
them from an earlier leadership: their committed offsets are the leader's to say.
The whole answer is read in one step of the event loop, so no route changes
between reading the offsets and naming their generation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot, ShardId, ShardKind

__all__ = ["SKIP_REASONS", "cluster_backup_offsets"]

SKIP_REASONS = ("settling", "refused", "moved", "error", "not_durable")

Scope = tuple[str, str, str, int]


def _scope_of(entry: Mapping[str, Any]) -> tuple[str, Scope]:
    return entry["kind"], (entry["tenant_id"], entry["namespace"], entry["name"], entry["shard"])


def _describe(shard: ShardId) -> dict[str, Any]:
    return {
        "tenant_id": shard.tenant,
        "namespace": shard.namespace,
        "name": shard.name,
        "shard": shard.shard,
        "kind": shard.kind.value,
    }


def cluster_backup_offsets(
    snapshot: RoutingSnapshot,
    local: Mapping[str, Any],
    *,
    failed: Collection[tuple[str, Scope]] = (),
    catalogued: Collection[tuple[str, Scope]] | None = None,
    settling: Mapping[tuple[str, Scope], str] | None = None,
) -> dict[str, Any]:
    """The cluster answer from the served `snapshot` and the broker's `local` answer.

    `failed` names (kind, scope) of logs in the failed state; `catalogued`, when
    given, every (kind, scope) this broker's catalog knows (a led shard outside it
    is an ``error``); `settling`, the replicated shards led here whose replica is not
    open yet, each with why."""
    settling = settling or {}
    logs: dict[tuple[str, Scope], Any] = {}
    for entry in local.get("shards", []):
        logs[_scope_of(entry)] = entry["logs"]
    in_memory = {
        _scope_of(entry)
        for entry in local.get("skipped", [])
        if entry.get("reason") == "not_durable"
    }
    failed_set = set(failed)
    shards: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    me = snapshot.node_id
    for shard, route in sorted(snapshot.routes.items()):
        if route.leader != me:
            continue
        key = (shard.kind.value, (shard.tenant, shard.namespace, shard.name, shard.shard))
        described = _describe(shard)
        if catalogued is not None and key not in catalogued:
            detail = f"{shard.kind.value} {shard.name!r} is not in this broker's catalog"
            skipped.append(described | {"reason": "error", "detail": detail})
        elif key in in_memory:
            skipped.append(described | {"reason": "not_durable"})
        elif route.state is AssignmentState.UNAVAILABLE:
            refused = described | {"reason": "refused"}
            if route.reason:
                refused["detail"] = route.reason
            skipped.append(refused)
        elif route.state in (AssignmentState.DRAINING, AssignmentState.MOVING):
            moved = described | {"reason": "moved"}
            if route.successor:
                moved["detail"] = f"moving to {route.successor}"
            skipped.append(moved)
        elif key in failed_set:
            detail = "its log failed; it takes no writes until the broker restarts"
            skipped.append(described | {"reason": "error", "detail": detail})
        elif key in settling:
            skipped.append(described | {"reason": "settling", "detail": settling[key]})
        else:
            shard_logs = logs.get(key, {"records": 0})
            shards.append(described | {"generation": route.generation, "logs": shard_logs})
    return {"node_id": me, "shards": shards, "skipped": skipped}


def scope_key(
    kind: ShardKind, tenant: str, namespace: str, name: str, shard: int
) -> tuple[str, Scope]:
    """The (kind, scope) key `failed` and `catalogued` are given in."""
    return kind.value, (tenant, namespace, name, shard)
