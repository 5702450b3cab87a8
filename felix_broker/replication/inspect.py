"""What operators see of this broker's replicas: `shard_inspect` fields and halts.

`inspection(driver)` gives the fields a replicated shard adds to its
`ShardInspection` (spec/messages.yaml): `replica_state` (the core's state:
leader, settling, fencing, follower, halted), `accepted_generation` (its
ballot), `replication_tail` (its replication log's length),
`replication_durable` (of which fsynced), `replication_mark` (the quorum mark
it knows) and, at a leader or candidate, one
`ReplicaView` per follower: `next_offset`, `matched`, `durable` and `lag` (the
leader's log length less `matched`), `state` `shipping` (or `fencing` while the
candidate waits for its answer). A follower knows only itself: no `replicas`.

`halts(drivers)` is `/replication/halted`: one `ReplicationHalt`
(spec/fleet.yaml) per replica of this broker that halted, as JSON builtins; a
healthy broker answers `[]`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from felix_wire.fleet import ReplicationHalt
from felix_wire.messages import ReplicaView

from .core import Phase
from .driver import ReplicaDriver
from .wire import wire_shard

__all__ = ["halts", "inspection"]

_ACTION = (
    "the replica holds committed records the leader's log contradicts: remove it from "
    "the replica set (or wipe its replication folder) and let it be placed anew; check "
    "the disk it ran on"
)


def inspection(driver: ReplicaDriver) -> dict[str, Any]:
    """The `ShardInspection` fields of `driver`'s replica (see the module docstring)."""
    replica = driver.replica
    views: list[ReplicaView] = []
    if replica.phase in (Phase.LEADER, Phase.FENCING):
        length = replica.length
        for peer in replica.progress():
            fencing = peer.fenced is not None
            views.append(
                ReplicaView(
                    node_id=peer.node_id,
                    role="follower",
                    next_offset=peer.next_offset,
                    lag=max(length - peer.matched, 0),
                    fence=peer.fenced,
                    state="fencing" if fencing and not peer.fenced else "shipping",
                    matched=peer.matched,
                    durable=peer.durable,
                )
            )
    return {
        "replica_state": "halted" if driver.halted is not None else replica.state,
        "accepted_generation": replica.generation,
        "replication_tail": replica.length,
        "replication_durable": replica.synced_length,
        "replication_mark": replica.commit,
        "replicas": views,
    }


def halts(node_id: str, drivers: Iterable[ReplicaDriver]) -> list[Any]:
    """`/replication/halted`: every halted replica here, as JSON-ready builtins."""
    found: list[ReplicationHalt] = []
    for driver in drivers:
        halt = driver.halted
        if halt is None:
            continue
        found.append(
            ReplicationHalt(
                shard=wire_shard(driver.shard),
                node=node_id,
                generation=halt.generation,
                progress=halt.offset,
                reason="below_commit",
                suggested_action=_ACTION,
            )
        )
    result: list[Any] = msgspec.to_builtins(found)
    return result
