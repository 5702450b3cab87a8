"""A Quorum stream end to end: a real etcd, the control plane (its store in etcd, the
placer running) with the stream defined through its API at replication_factor 3, and
three brokers that joined through etcd. Nothing sets a route by hand.

- the placer gives the shard three distinct replicas; a publish to the leader is
  acknowledged (at the quorum mark) and the followers' stream logs equal the leader's;
- the leader stops (its lease is revoked): the placer promotes a live replica at a
  new generation, and the successor holds every acknowledged record.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.fleet.routing import AssignmentState
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer
from felix_transport import generate_ca
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import eventually
from .support import SHARD, control_plane, publish_all, records, serving, start_broker

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(150)


async def test_a_quorum_stream_survives_its_leaders_loss_with_every_acked_record(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    endpoint = etcd_server.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp_path / "issuer")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(control_plane(tmp_path, endpoint))
        brokers: dict[str, Broker] = {}
        for node in NODES:
            brokers[node] = await start_broker(tmp_path, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)

        def route_seen() -> tuple[str, int] | None:
            routes = [b.fleet.view.snapshot.routes.get(SHARD) for b in brokers.values() if b.fleet]
            if any(r is None or r.state is not AssignmentState.ACTIVE for r in routes):
                return None
            first = routes[0]
            assert first is not None and first.leader is not None
            if any(r != first for r in routes):
                return None
            assert sorted(first.replicas) == sorted(NODES)
            return first.leader, first.generation

        await eventually(lambda: route_seen() is not None, within=30, what="a placed replica set")
        placed = route_seen()
        assert placed is not None
        leader, generation = placed
        await eventually(lambda: serving(brokers[leader]), within=15, what="the leader open")
        acked = [b"acked-%d" % i for i in range(8)]
        await publish_all(brokers[leader], issuer, acked)
        want = records(brokers[leader])
        assert [p for _, _, p in want] == acked
        followers = [n for n in NODES if n != leader]
        await eventually(
            lambda: all(records(brokers[n]) == want for n in followers),
            within=15,
            what="followers' logs equal the leader's",
        )

        await brokers[leader].stop()  # revokes its lease: the placer acts at once

        def successor() -> str | None:
            route = brokers[followers[0]].fleet.view.snapshot.routes.get(SHARD)  # type: ignore[union-attr]
            if route is None or route.generation <= generation or route.leader == leader:
                return None
            return route.leader if route.state is AssignmentState.ACTIVE else None

        await eventually(lambda: successor() is not None, within=30, what="a successor placed")
        new = successor()
        assert new in followers
        await eventually(lambda: serving(brokers[new]), within=15, what="the successor open")
        await publish_all(brokers[new], issuer, [b"after"], first=len(acked))
        assert [p for _, _, p in records(brokers[new])] == [*acked, b"after"]


async def test_a_refused_promotion_is_reported_and_the_replica_ahead_is_promoted(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    """The placer's first choice after the leader's loss lags (it was down while the
    others acknowledged writes): its core refuses, it reports the refusal under its
    own lease in etcd, and the placer promotes the replica it names as ahead, at a
    new generation; every acknowledged record is there."""
    from felix_controlplane.placement import rendezvous

    endpoint = etcd_server.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp_path / "issuer")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(control_plane(tmp_path, endpoint))
        brokers: dict[str, Broker] = {}
        for node in NODES:
            brokers[node] = await start_broker(tmp_path, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)

        def route_of(node: str) -> Any:
            fleet = brokers[node].fleet
            return fleet.view.snapshot.routes.get(SHARD) if fleet is not None else None

        def placed() -> bool:
            route = route_of(NODES[0])
            return route is not None and route.state is AssignmentState.ACTIVE

        await eventually(placed, within=30, what="a placed replica set")
        leader = route_of(NODES[0]).leader
        await eventually(lambda: serving(brokers[leader]), within=15, what="the leader open")
        followers = [n for n in NODES if n != leader]
        # The one the placer will pick first once the leader is gone: make it lag.
        lagging = max(followers, key=lambda n: (rendezvous(SHARD, n), n))
        ahead = next(n for n in followers if n != lagging)
        await publish_all(brokers[leader], issuer, [b"early"])
        await eventually(
            lambda: len(records(brokers[lagging])) == 1, within=15, what="the laggard has 1"
        )
        await brokers[lagging].stop()
        acked = [b"early", *(b"while-away-%d" % i for i in range(4))]
        await publish_all(brokers[leader], issuer, acked[1:], first=1)
        await eventually(
            lambda: len(records(brokers[ahead])) == len(acked), within=15, what="ahead applied"
        )
        await brokers[leader].stop()
        brokers[lagging] = await start_broker(tmp_path, lagging, endpoint, fleet_ca, issuer)
        stack.push_async_callback(brokers[lagging].stop)

        def led_by_ahead() -> bool:
            route = route_of(ahead)
            return (
                route is not None
                and route.leader == ahead
                and route.state is AssignmentState.ACTIVE
                and serving(brokers[ahead])
            )

        await eventually(led_by_ahead, within=45, what="the replica ahead promoted")
        replication = brokers[lagging].replication
        assert replication is not None
        refused = replication.driver(SHARD)
        assert refused is not None and refused.promotion_refused is not None
        assert refused.promotion_refused.ahead == (ahead,)
        assert route_of(ahead).generation > refused.promotion_refused.generation
        await publish_all(brokers[ahead], issuer, [b"after"], first=len(acked))
        assert [p for _, _, p in records(brokers[ahead])] == [*acked, b"after"]
        # Past the refused generation, the laggard withdrew its report from etcd.
        etcd = brokers[lagging].etcd
        assert etcd is not None
        key = etcd.keys.promotion_refused(lagging, SHARD)
        await eventually(
            lambda: refused.replica.generation > refused.promotion_refused.generation,  # type: ignore[union-attr]
            within=15,
            what="the laggard follows the new leader",
        )

        async def withdrawn() -> bool:
            return await etcd.client.get(key) is None

        for _ in range(100):
            if await withdrawn():
                break
            await asyncio.sleep(0.1)
        assert await withdrawn()
