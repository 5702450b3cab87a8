"""A broker whose lease expires stops serving before anyone else starts: recorded writes
of two brokers never overlap on a shard, and no generation is served by two brokers."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from felix_broker.fleet.etcd_node import EtcdNode
from felix_broker.fleet.routing import AssignmentState
from felix_common.etcd_process import EtcdProcess
from felix_controlplane.placement import shard_specs
from tests.support.tcp_proxy import TcpProxy

from .support import Accepted, Applied, check_no_two_leaders, eventually, node, placer

pytestmark = pytest.mark.timeout(90)

SPECS = shard_specs([("t", "ns", "mem", 4, False), ("t", "ns", "dur", 2, True)], [])
MEMORY = [s.shard for s in SPECS if not s.durable]
DURABLE = [s.shard for s in SPECS if s.durable]


async def writer(fleet: EtcdNode, log: list[Accepted]) -> None:
    """What a service does before admitting a write: ask the served snapshot."""
    while True:
        snap = fleet.view.snapshot
        now = time.monotonic()
        for spec in SPECS:
            if snap.leads(spec.shard):
                route = snap.route(spec.shard)
                assert route is not None
                log.append(Accepted(spec.shard, fleet.node_id, route.generation, now))
        await asyncio.sleep(0.005)


async def test_an_expired_lease_stops_the_broker_and_its_shards_are_replaced(
    etcd_server: EtcdProcess,
) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    proxy = TcpProxy(*ep)
    await proxy.start()
    a, b = node(proxy.endpoint, "a", ttl_ms=1500), node(ep, "b", ttl_ms=1500)
    applied_a, applied_b = Applied("a"), Applied("b")
    a.view.add_listener(applied_a)
    b.view.add_listener(applied_b)
    p = placer(ep, "p1", SPECS)
    log: list[Accepted] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await a.start()
        tasks.append(asyncio.create_task(p.run()))
        await eventually(
            lambda: all(a.view.snapshot.leads(s.shard) for s in SPECS), what="a leads all"
        )
        await b.start()
        tasks += [asyncio.create_task(writer(a, log)), asyncio.create_task(writer(b, log))]
        await asyncio.sleep(0.3)

        first = a.membership.incarnation
        proxy.cut()  # a can no longer reach etcd: its lease runs out
        cut_at = time.monotonic()
        await eventually(lambda: a.view.fenced, within=5, what="a fences itself")
        assert time.monotonic() - cut_at < 2.0  # before etcd can expire the lease (its TTL)
        assert not any(a.view.snapshot.leads(s.shard) for s in SPECS)
        await eventually(
            lambda: all(b.view.snapshot.leads(s) for s in MEMORY), within=10, what="b takes memory"
        )
        for shard in DURABLE:  # kept for a, not served empty by b
            await eventually(
                lambda shard=shard: (
                    (r := b.view.snapshot.route(shard)) is not None
                    and r.state is AssignmentState.UNAVAILABLE
                ),
                what="durable shard unavailable",
            )
            route = b.view.snapshot.route(shard)
            assert route is not None
            assert (route.leader, route.reason) == ("a", "owner_unavailable")

        proxy.heal()  # a comes back: a new incarnation, its durable shards again
        await eventually(lambda: a.membership.held, within=10, what="a re-registers")
        assert a.membership.incarnation > first
        await eventually(
            lambda: all(a.view.snapshot.leads(s) for s in DURABLE), within=10, what="a serves dur"
        )
        assert not any(a.view.snapshot.leads(s) for s in MEMORY)
        await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await a.stop()
        await b.stop()
        await proxy.close()
    check_no_two_leaders(log)
    assert {e.node_id for e in log if e.shard in MEMORY} == {"a", "b"}
    applied_a.check_never_twice_nor_backwards()
    applied_b.check_never_twice_nor_backwards()
    with contextlib.suppress(Exception):
        await p._client.close()
