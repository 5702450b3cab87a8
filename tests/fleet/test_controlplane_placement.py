"""`felix-controlplane --store etcd --etcd-endpoints`: the control plane keeps its store in
etcd and places the catalog's shards on the brokers that joined the fleet (a real broker,
configured with FELIX_NODE_ID and FELIX_ETCD_ENDPOINTS)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.config import load_config
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace, decode_assignment, decode_member
from felix_controlplane.cli import parse_args, run
from felix_transport import default_impl
from felix_transport.certs import generate_ca
from tests.controlplane.support import call
from tests.fleet.support import eventually

pytestmark = pytest.mark.timeout(90)

KEYS = Keyspace("/felix")


@asynccontextmanager
async def fleet_broker(tmp: Path, node_id: str, **overrides: Any) -> AsyncIterator[Broker]:
    """A real broker with its peer certificate, joining the fleet through etcd."""
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp),
        "quic_impl": default_impl(),
        "node_id": node_id,
        **overrides,
    }
    config = load_config(environ={}, overrides=settings)
    tls = PeerTls.issue(generate_ca("test fleet"), node_id)
    fleet = FleetNode(tls=tls, view=FleetView(RoutingSnapshot(node_id=node_id)))
    broker = Broker(config, fleet=fleet)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_a_broker_with_a_node_id_but_no_peer_certificate_refuses_to_start(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    settings = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(tmp_path),
        "node_id": "b1",
        "etcd_endpoints": etcd_server.endpoint,
    }
    broker = Broker(load_config(environ={}, overrides=settings))
    with pytest.raises(ValueError, match="peer_tls_cert"):
        await broker.start()
    await broker.stop()


async def test_the_control_plane_places_a_new_streams_shards_on_the_live_broker(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    endpoint = etcd_server.endpoint
    ready = tmp_path / "ready.json"
    args = parse_args(
        [
            *("--db", str(tmp_path / "cp.db"), "--store", "etcd"),
            *("--etcd-endpoints", endpoint, "--placer-id", "cp-1", "--placer-lease-ttl", "2"),
            *("--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"),
            *("--ready-file", str(ready)),
        ]
    )
    stop = asyncio.Event()
    plane = asyncio.get_running_loop().create_task(run(args, stop))
    probe = EtcdClient([("127.0.0.1", etcd_server.client_port)])
    try:
        await eventually(ready.exists, what="control plane up")
        urls = json.loads(ready.read_text())
        secret = (tmp_path / "cp.db.bootstrap-secret").read_text().strip()
        status, answer = await call(
            "POST",
            f"{urls['admin_url']}/v1/bootstrap",
            token=secret,
            body={"tenant": "acme", "admin": {"subjects": ["admin@acme"]}},
        )
        assert status == 201, answer
        admin = answer["admin_token"]
        base = f"{urls['url']}/v1/tenants/acme/namespaces"
        assert (await call("POST", base, token=admin, body={"name": "ns"}))[0] == 201
        stream = {"name": "orders", "shards": 3}
        assert (await call("POST", f"{base}/ns/streams", token=admin, body=stream))[0] == 201
        shards = [ShardId(ShardKind.STREAM, "acme", "ns", "orders", i) for i in range(3)]

        async with fleet_broker(
            tmp_path / "b1",
            "b1",
            etcd_endpoints=endpoint,
            node_lease_ttl_ms=2000,
            client_advertise_addr="127.0.0.1:7777",
        ) as broker:
            assert broker.etcd is not None
            member = await probe.get(KEYS.member("b1"))
            assert member is not None
            assert decode_member(member.value).client_addr == "127.0.0.1:7777"
            view = broker.etcd.view
            await eventually(lambda: all(view.snapshot.leads(s) for s in shards), what="placed")
            # The store lives in etcd too: the catalog is under the prefix's cp/.
            _, stored = await probe.get_prefix("/felix/cp/res/acme/stream/")
            assert [kv.key.rsplit("/", 1)[1] for kv in stored] == ["orders"]

        # The broker left (its lease revoked): in-memory shards have nobody to go to.
        async def unassigned() -> bool:
            for shard in shards:
                kv = await probe.get(KEYS.assignment(shard))
                if kv is None or decode_assignment(kv.value).reason != "not_assigned":
                    return False
            return True

        for _ in range(200):
            if await unassigned():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("shards of a gone broker not unassigned")
    finally:
        stop.set()
        await plane
    try:  # the stopped control plane released placement at once (its lease revoked)
        assert await probe.get(KEYS.placer) is None
    finally:
        await probe.close()


def test_a_standalone_broker_imports_nothing_of_etcd() -> None:
    code = (
        "import sys, felix_broker.app, felix_broker.cli\n"
        "assert 'aetcd' not in sys.modules and 'felix_common.etcd' not in sys.modules, "
        "sorted(m for m in sys.modules if 'etcd' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
