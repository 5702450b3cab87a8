"""Planned moves of a replicated (Quorum, RF 3) shard, end to end: a real etcd, the
control plane (store in etcd, placer running) and three brokers that joined through
etcd. A replicated shard's truth is its replication log, so a drain hands it to a
caught-up replica by promotion (a new generation, the replica set kept) and a move
is a promotion to a member of the set; a move outside the set is 409 ``replicated``.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.fleet.routing import AssignmentState, Route
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer
from felix_transport import generate_ca
from tests.controlplane.support import call
from tests.replication.support import (
    SHARD,
    control_plane,
    publish_all,
    records,
    serving,
    start_broker,
)
from tests.support.etcd import etcd_server

from .harness import NODES
from .support import eventually

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(150)


def route_of(broker: Broker) -> Route | None:
    assert broker.fleet is not None
    return broker.fleet.view.snapshot.routes.get(SHARD)


def agreed(brokers: dict[str, Broker]) -> Route | None:
    routes = [route_of(b) for b in brokers.values()]
    first = routes[0]
    if first is None or first.state is not AssignmentState.ACTIVE or first.leader is None:
        return None
    return first if all(r == first for r in routes) else None


async def test_a_drained_leader_hands_a_quorum_shard_to_a_replica_and_moves_stay_in_the_set(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    endpoint = etcd_server.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp_path / "issuer")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(control_plane(tmp_path, endpoint))
        admin_url = json.loads((tmp_path / "ready.json").read_text())["admin_url"]
        secret = (tmp_path / "cp.db.bootstrap-secret").read_text().strip()
        brokers: dict[str, Broker] = {}
        for node in (*NODES, "node-d"):  # four brokers: one outside the replica set
            brokers[node] = await start_broker(tmp_path, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)

        await eventually(lambda: agreed(brokers) is not None, within=30, what="a replica set")
        placed = agreed(brokers)
        assert placed is not None and placed.leader is not None
        leader, generation, replicas = placed.leader, placed.generation, placed.replicas
        assert len(set(replicas)) == 3
        outsider = next(n for n in brokers if n not in replicas)
        await eventually(lambda: serving(brokers[leader]), within=15, what="the leader open")
        acked = [b"acked-%d" % i for i in range(8)]
        await publish_all(brokers[leader], issuer, acked)
        want = records(brokers[leader])
        followers = [n for n in replicas if n != leader]
        await eventually(
            lambda: all(records(brokers[n]) == want for n in followers),
            within=15,
            what="followers caught up",
        )

        # A move outside the replica set would copy files its log does not follow: 409.
        body = {"kind": "stream", "tenant": SHARD.tenant, "namespace": SHARD.namespace}
        body |= {"name": SHARD.name, "shard": 0, "to": outsider}
        status, answer = await call("POST", f"{admin_url}/v1/fleet/moves", token=secret, body=body)
        assert status == 409 and answer["error"] == "replicated", answer
        assert agreed(brokers) == placed  # nothing written

        async def admin(method: str, path: str) -> tuple[int, Any]:
            status, answer = await call(method, f"{admin_url}{path}", token=secret, body={})
            return status, answer

        # Its other replicas draining too: no majority of the set could take it, so the
        # leader's drain leaves it in place and says so.
        for node in followers:
            assert (await admin("POST", f"/v1/fleet/drains/{node}")) == (
                202,
                {"node_id": node, "skipped": []},
            )
        status, answer = await admin("POST", f"/v1/fleet/drains/{leader}")
        assert status == 202, answer
        assert answer["skipped"] == [
            {
                "kind": "stream",
                "tenant": SHARD.tenant,
                "namespace": SHARD.namespace,
                "name": SHARD.name,
                "shard": 0,
                "reason": "replicated: no majority of its replica set live outside draining"
                " brokers",
            }
        ]
        await asyncio.sleep(1.0)  # placer passes (interval 1 s, woken by the drains)
        assert agreed(brokers) == placed
        for node in followers:
            assert (await admin("DELETE", f"/v1/fleet/drains/{node}"))[0] == 200

        def handed() -> Route | None:
            route = agreed(brokers)
            if route is None or route.generation <= generation or route.leader == leader:
                return None
            return route

        await eventually(lambda: handed() is not None, within=30, what="a replica promoted")
        after = handed()
        assert after is not None and after.leader in followers
        assert after.successor is None  # a promotion, not a copy
        assert sorted(after.replicas) == sorted(replicas)  # the set is kept, drained one in it
        new = after.leader
        await eventually(lambda: serving(brokers[new]), within=15, what="the new leader open")
        assert not serving(brokers[leader])
        await publish_all(brokers[new], issuer, [b"after"], first=len(acked))
        assert [p for _, _, p in records(brokers[new])] == [*acked, b"after"]
        await eventually(
            lambda: [p for _, _, p in records(brokers[leader])] == [*acked, b"after"],
            within=15,
            what="the drained broker still follows the log",
        )

        # A planned move inside the set is a promotion too: back to another member.
        status, answer = await call("DELETE", f"{admin_url}/v1/fleet/drains/{leader}", token=secret)
        assert status == 200, answer
        body["to"] = leader
        status, answer = await call("POST", f"{admin_url}/v1/fleet/moves", token=secret, body=body)
        assert status == 202, answer
        await eventually(
            lambda: (r := agreed(brokers)) is not None and r.leader == leader,
            within=30,
            what="moved back by promotion",
        )
        await eventually(lambda: serving(brokers[leader]), within=15, what="open again")
        await publish_all(brokers[leader], issuer, [b"back"], first=len(acked) + 1)
        assert [p for _, _, p in records(brokers[leader])] == [*acked, b"after", b"back"]
