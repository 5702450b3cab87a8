"""Operators' view of replicas: `shard_inspect` of a replicated shard on real fleet
brokers, and `/replication/halted` (empty on a healthy broker; a halted replica listed
with what to do), over the real ops listener."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from felix_broker.metrics import BrokerMetrics
from felix_broker.ops_http import Health, HttpListener
from felix_broker.replication.core import Entry, Ship
from felix_broker.replication.inspect import halts, inspection
from felix_transport import generate_ca
from felix_wire.messages import PublishOk, ShardInspect, ShardInspectInfo

from ..fleet.harness import running_fleet
from ..support.wire import NS, TENANT, WireClient
from .driver_support import NODES as DRIVER_NODES
from .driver_support import SHARD as DRIVER_SHARD
from .driver_support import Fleet as DriverFleet
from .driver_support import opened, until
from .in_process import CATALOG, driver, publish
from .in_process import opened as quorum_opened

pytestmark = pytest.mark.timeout(90)

OPERATOR = {"perms": ["node.view:cluster:*"]}
INSPECT = ShardInspect(
    tenant_id=TENANT, namespace=NS, name="q", kind="stream", shard=0, request_id=7
)


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(5):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_shard_inspect_reports_replicas_their_offsets_lag_and_the_cores_state(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await quorum_opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        pub = await client.session()
        for i in range(3):
            await pub.send(publish(b"m%d" % i, i + 1))
            assert isinstance(await pub.recv(), PublishOk)
        leader = driver(fleet, "node-a").replica
        await until(lambda: all(driver(fleet, n).replica.commit == 4 for n in ("node-b", "node-c")))
        await until(lambda: all(p.durable == 4 for p in leader.progress()))
        views = {}
        for node in ("node-a", "node-b"):
            operator = await WireClient.connect(fleet.entry(node))
            info = await operator.request(INSPECT, **OPERATOR)
            assert isinstance(info, ShardInspectInfo), info
            views[node] = info.view
            operator.close()
        client.close()
        at_leader, at_follower = views["node-a"], views["node-b"]
        assert (at_leader.role, at_leader.replica_state, at_leader.serving) == (
            "leader",
            "leader",
            True,
        )
        assert at_leader.accepted_generation == 1
        # A generation-start record, then three batches: all fsynced, all committed.
        assert (
            at_leader.replication_tail,
            at_leader.replication_durable,
            at_leader.replication_mark,
        ) == (4, 4, 4)
        followers = {r.node_id: r for r in at_leader.replicas}
        assert sorted(followers) == ["node-b", "node-c"]
        for view in followers.values():
            assert (view.role, view.state, view.matched, view.durable, view.lag) == (
                "follower",
                "shipping",
                4,
                4,
                0,
            )
        assert (at_follower.role, at_follower.replica_state, at_follower.serving) == (
            "follower",
            "follower",
            False,
        )
        assert at_follower.replication_mark == 4 and at_follower.replicas == []
        # A healthy fleet member's /replication/halted is [], not 404.
        status, body = await http_get(fleet.brokers["node-b"].http_port, "/replication/halted")
        assert (status, json.loads(body)) == (200, [])


async def test_a_halted_replica_is_listed_on_replication_halted_and_inspected_as_halted(
    tmp_path: Path,
) -> None:
    fleet = DriverFleet(tmp_path, generate_ca("halts"))
    for node in DRIVER_NODES:
        await fleet.start(node)
    listener = HttpListener(
        metrics=BrokerMetrics(),
        health=Health(),
        replication_halted=lambda: halts("b2", [fleet.driver("b2")]),
    )
    await listener.start("127.0.0.1", 0)
    try:
        leader = await opened(fleet, "b1", 1)
        await leader.append([b"a", b"b"])
        follower = fleet.driver("b2")
        await until(lambda: follower.replica.commit == 3)
        assert json.loads((await http_get(listener.port, "/replication/halted"))[1]) == []
        # A ship that contradicts a committed record (no correct leader sends one).
        forged = Ship(1, "b1", 1, 1, (Entry(1, b"not-a"),), 3)
        await follower.receive(forged)
        assert follower.halted is not None
        status, body = await http_get(listener.port, "/replication/halted")
        [halt] = json.loads(body)
        assert status == 200
        assert halt["shard"] == {
            "kind": "stream",
            "tenant": DRIVER_SHARD.tenant,
            "namespace": DRIVER_SHARD.namespace,
            "name": DRIVER_SHARD.name,
            "shard": 0,
        }
        assert (halt["node"], halt["generation"], halt["progress"], halt["reason"]) == (
            "b2",
            1,
            1,
            "below_commit",
        )
        assert halt["suggested_action"]
        assert inspection(follower)["replica_state"] == "halted"
        assert [e.payload for e in fleet.on_disk("b2")][1:] == [b"a", b"b"]  # nothing lost
    finally:
        await listener.close()
        await fleet.close()
