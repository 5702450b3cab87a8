"""Backup points and fleet features on a real fleet: etcd, a control plane that places
(its SQLite catalog, the fleet's etcd) and three brokers that joined through etcd.

- every broker's /backup/offsets lists exactly the shards it leads, at the assignment
  key's mod_revision, and the three together cover every durable shard once;
- `felix-controlplane admin backup-point` (etcd or the control plane's admin API as
  the source of members) prints one point; an unreachable broker and a fenced one are
  typed failures with their exit codes;
- fleet features: listed per broker, finalized one-way (409 while a live broker lacks
  one, idempotent after), brokers refuse commits until atomic_commit is finalized and
  store publishers only once publisher_principal is, and a broker lacking a finalized
  feature may not join.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.features import FeatureMissingError
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_controlplane import backup_point
from felix_controlplane.cli import parse_args, run
from felix_transport import default_impl, generate_ca
from felix_wire.messages import (
    AckMode,
    Commit,
    CommitOk,
    Error,
    Publish,
    PublishOk,
    StreamRead,
    StreamRecords,
)
from tests.controlplane.support import call

from ..support.wire import NS, TENANT, WireClient
from .harness import NODES, Entry
from .support import eventually

pytestmark = pytest.mark.timeout(180)

KEYS = Keyspace("/felix")
DURABLE = ("orders", 3)
LEDGER = ("ledger", 1)
MEMORY = ("ticks", 1)
CATALOG = StaticCatalog(
    streams=[
        StreamSpec(TENANT, NS, DURABLE[0], durable=True, shards=DURABLE[1]),
        StreamSpec(TENANT, NS, LEDGER[0], durable=True, shards=LEDGER[1]),
        StreamSpec(TENANT, NS, MEMORY[0], durable=False, shards=MEMORY[1]),
    ],
    caches=[],
)
SHARDS = [
    ShardId(ShardKind.STREAM, TENANT, NS, s.name, i)
    for s in CATALOG.streams()
    for i in range(s.shards)
]


@dataclass
class Plane:
    url: str
    admin_url: str
    secret: str
    secret_file: Path

    async def admin(self, method: str, path: str) -> tuple[int, Any]:
        return await call(method, f"{self.admin_url}{path}", token=self.secret)


@asynccontextmanager
async def control_plane(tmp: Path, endpoint: str | None) -> AsyncIterator[Plane]:
    """`felix-controlplane` on SQLite; with `endpoint`, the fleet's etcd (placer and
    fleet routes). The catalog created through its API is the brokers' CATALOG."""
    ready = tmp / "ready.json"
    fleet_args = ["--etcd-endpoints", endpoint, "--placer-id", "cp-1"] if endpoint else []
    args = parse_args(
        [
            *("--db", str(tmp / "cp.db"), *fleet_args, "--placer-lease-ttl", "2"),
            *("--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"),
            *("--ready-file", str(ready)),
        ]
    )
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(run(args, stop))
    try:
        await eventually(ready.exists, what="control plane up")
        urls = json.loads(ready.read_text())
        secret_file = tmp / "cp.db.bootstrap-secret"
        secret = secret_file.read_text().strip()
        status, answer = await call(
            "POST",
            f"{urls['admin_url']}/v1/bootstrap",
            token=secret,
            body={"tenant": TENANT, "admin": {"subjects": [f"admin@{TENANT}"]}},
        )
        assert status == 201, answer
        admin = answer["admin_token"]
        base = f"{urls['url']}/v1/tenants/{TENANT}/namespaces"
        assert (await call("POST", base, token=admin, body={"name": NS}))[0] == 201
        for spec in CATALOG.streams():
            body = {
                "name": spec.name,
                "shards": spec.shards,
                "durability": "durable" if spec.durable else "memory",
            }
            status, answer = await call("POST", f"{base}/{NS}/streams", token=admin, body=body)
            assert status == 201, answer
        yield Plane(urls["url"], urls["admin_url"], secret, secret_file)
    finally:
        stop.set()
        await task


async def start_broker(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer, **extra: Any
) -> Broker:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",  # a specific host: the ops address is registered
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "durable_storage_dir": str(tmp / node_id / "durable"),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": endpoint,
        "node_lease_ttl_ms": 3000,
        **extra,
    }
    config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=CATALOG)
    fleet = FleetNode(
        tls=PeerTls.issue(fleet_ca, node_id), view=FleetView(RoutingSnapshot(node_id=node_id))
    )
    broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
    await broker.start()
    return broker


@dataclass
class Running:
    plane: Plane
    brokers: dict[str, Broker]
    issuer: DevIssuer
    endpoint: str
    fleet_ca: Any
    stack: AsyncExitStack

    def leader(self, shard: ShardId) -> str:
        view = next(iter(self.brokers.values())).fleet
        assert view is not None
        route = view.view.snapshot.routes[shard]
        assert route.leader is not None
        return route.leader

    async def client(self, node: str) -> WireClient:
        client = await WireClient.connect(Entry(self.brokers[node], self.issuer))
        self.stack.callback(client.close)
        return client


@asynccontextmanager
async def running(
    etcd: EtcdProcess, tmp: Path, nodes: tuple[str, ...] = NODES
) -> AsyncIterator[Running]:
    endpoint = etcd.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp / "issuer")
    async with AsyncExitStack() as stack:
        plane = await stack.enter_async_context(control_plane(tmp, endpoint))
        brokers: dict[str, Broker] = {}
        for node in nodes:
            brokers[node] = await start_broker(tmp, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)

        def settled() -> bool:
            for broker in brokers.values():
                assert broker.fleet is not None
                snap = broker.fleet.view.snapshot
                if len(snap.members) != len(nodes):
                    return False
                for shard in SHARDS:
                    route = snap.routes.get(shard)
                    if route is None or route.leader is None or route.state.value != "active":
                        return False
            return True

        await eventually(settled, within=30, what="every shard placed and seen by all")
        yield Running(plane, brokers, issuer, endpoint, fleet_ca, stack)


async def _offsets(broker: Broker) -> dict[str, Any]:
    status, body = await call("GET", f"http://127.0.0.1:{broker.http_port}/backup/offsets")
    assert status == 200, body
    return dict(body)


def _backup_point(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = backup_point.main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else json.loads(err)


async def test_backup_offsets_and_backup_point_on_a_real_fleet(
    etcd_server: EtcdProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = EtcdClient([("127.0.0.1", etcd_server.client_port)])
    async with running(etcd_server, tmp_path) as fleet:
        fleet.stack.push_async_callback(probe.close)
        # Records on every durable shard, published through whichever broker.
        published: dict[int, int] = {}
        client = await fleet.client(NODES[0])
        for i in range(12):
            key = f"k{i}".encode()
            answer = await client.request(
                Publish(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream=DURABLE[0],
                    payload=b"r",
                    key=key,
                    request_id=i + 1,
                    ack=AckMode.PER_MESSAGE,
                )
            )
            assert answer == PublishOk(request_id=i + 1)
        # Each broker lists what it leads (at the key's mod_revision), nothing else.
        seen: dict[ShardId, str] = {}
        for node, broker in fleet.brokers.items():
            answer = await _offsets(broker)
            assert answer["node_id"] == node
            for entry in answer["shards"]:
                shard = ShardId(
                    ShardKind(entry["kind"]),
                    entry["tenant_id"],
                    entry["namespace"],
                    entry["name"],
                    entry["shard"],
                )
                assert fleet.leader(shard) == node
                stored = await probe.get(KEYS.assignment(shard))
                assert stored is not None and entry["generation"] == stored.mod_revision
                assert shard not in seen
                seen[shard] = node
                if shard.name == DURABLE[0]:
                    published[shard.shard] = entry["logs"]["records"]
            for entry in answer["skipped"]:
                assert entry["reason"] == "not_durable", entry
                assert entry["name"] == MEMORY[0]
                assert fleet.leader(ShardId(ShardKind.STREAM, TENANT, NS, MEMORY[0], 0)) == node
        assert set(seen) == {s for s in SHARDS if s.name != MEMORY[0]}
        assert sum(published.values()) == 12

        # backup-point, members from etcd and from the control plane's admin API.
        for source in (
            ["--etcd-endpoints", fleet.endpoint],
            [
                "--admin-url",
                fleet.plane.admin_url,
                "--bootstrap-secret-file",
                str(fleet.plane.secret_file),
            ],
        ):
            code, point = await asyncio.to_thread(_backup_point, capsys, *source)
            assert code == 0, point
            assert [m["node_id"] for m in point["members"]] == list(NODES)
            assert {(s["name"], s["shard"]): s["node_id"] for s in point["shards"]} == {
                (s.name, s.shard): n for s, n in seen.items()
            }
            assert (
                sum(s["logs"]["records"] for s in point["shards"] if s["name"] == DURABLE[0]) == 12
            )
            assert [s["name"] for s in point["not_durable"]] == [MEMORY[0]]

        # A fenced broker (its lease lost) skips what it leads as `refused`: no point.
        fenced = fleet.leader(ShardId(ShardKind.STREAM, TENANT, NS, LEDGER[0], 0))
        view = fleet.brokers[fenced].fleet
        assert view is not None
        view.view.fence()
        answer = await _offsets(fleet.brokers[fenced])
        assert answer["shards"] == []
        assert {e["reason"] for e in answer["skipped"]} <= {"refused", "not_durable"}
        assert any(e["reason"] == "refused" and e["detail"] == "fenced" for e in answer["skipped"])
        code, failure = await asyncio.to_thread(
            _backup_point,
            capsys,
            "--etcd-endpoints",
            fleet.endpoint,
            "--attempts",
            "2",
            "--retry-delay",
            "0.05",
        )
        assert code == backup_point.EXIT_NOT_CONSISTENT
        assert failure["error"] == "not_consistent" and "refused" in failure["message"]
        # Asked again while the broker is still fenced, it retries; once the broker
        # serves again, the point is collected (after more than one attempt).
        listener = fleet.brokers[fenced]._http
        assert listener is not None
        provider = listener._backup_offsets
        asked: list[int] = []

        def counted() -> Any:
            asked.append(1)
            return provider()

        listener._backup_offsets = counted
        collecting = asyncio.create_task(
            asyncio.to_thread(
                _backup_point,
                capsys,
                *("--etcd-endpoints", fleet.endpoint, "--attempts", "50", "--retry-delay", "0.1"),
            )
        )
        await eventually(lambda: len(asked) >= 1, what="the fenced broker asked once")
        view.view.unfence()
        code, point = await collecting
        assert code == 0, point
        assert point["attempts"] > 1
        assert {(s["name"], s["shard"]) for s in point["shards"]} == {
            (s.name, s.shard) for s in seen
        }

        # A broker whose ops listener is gone: broker_unreachable, naming it.
        http = fleet.brokers[NODES[2]]._http
        assert http is not None
        await http.close()
        code, failure = await asyncio.to_thread(
            _backup_point,
            capsys,
            "--etcd-endpoints",
            fleet.endpoint,
            "--attempts",
            "2",
            "--retry-delay",
            "0.05",
        )
        assert code == backup_point.EXIT_BROKER_UNREACHABLE
        assert failure["error"] == "broker_unreachable" and NODES[2] in failure["message"]


async def test_backup_point_without_a_reachable_fleet_is_a_typed_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Port 1 on loopback: nothing listens there.
    code, failure = await asyncio.to_thread(
        _backup_point,
        capsys,
        "--etcd-endpoints",
        "127.0.0.1:1",
        "--timeout",
        "0.5",
        "--attempts",
        "1",
    )
    assert code == backup_point.EXIT_FLEET_UNREACHABLE
    assert failure["error"] == "fleet_unreachable"


def _publish(request_id: int, payload: bytes) -> Publish:
    return Publish(
        tenant_id=TENANT,
        namespace=NS,
        stream=LEDGER[0],
        payload=payload,
        request_id=request_id,
        ack=AckMode.PER_MESSAGE,
    )


def _commit(request_id: int) -> Commit:
    return Commit(
        tenant_id=TENANT,
        namespace=NS,
        stream=LEDGER[0],
        entity_key=b"account-1",
        event=b"opened",
        request_id=request_id,
    )


async def test_fleet_features_finalize_one_way_and_brokers_act_on_the_enabled_set(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with running(etcd_server, tmp_path) as fleet:
        plane = fleet.plane
        # A fourth broker that does not implement atomic_commit (a mixed fleet).
        lagging = await start_broker(
            tmp_path,
            "node-d",
            fleet.endpoint,
            fleet.fleet_ca,
            fleet.issuer,
            fleet_features_override="publisher_principal",
        )
        fleet.stack.push_async_callback(lagging.stop)
        status, listing = await plane.admin("GET", "/v1/fleet/features")
        assert status == 200, listing
        assert listing["serving_nodes"] == [*NODES, "node-d"]
        assert listing["enabled"] == []
        assert listing["supported"] == ["publisher_principal"]
        by_name = {f["name"]: f for f in listing["features"]}
        assert by_name["atomic_commit"]["implemented_by"] == list(NODES)
        assert by_name["atomic_commit"]["lacking"] == ["node-d"]
        assert by_name["atomic_commit"]["finalized"] is False

        # Commits are refused before atomic_commit is finalized, on the shard's leader.
        ledger = ShardId(ShardKind.STREAM, TENANT, NS, LEDGER[0], 0)
        owner = await fleet.client(fleet.leader(ledger))
        refused = await owner.request(_commit(1))
        assert isinstance(refused, Error) and refused.code == "invalid_request"
        assert "atomic_commit" in refused.message
        # And a durable stream stores no publisher before publisher_principal is.
        assert await owner.request(_publish(10, b"before")) == PublishOk(request_id=10)

        # 409 while a live broker lacks it (dry run says so too); unknown words likewise.
        status, dry = await plane.admin(
            "POST", "/v1/fleet/features/atomic_commit/finalize?dry_run=true"
        )
        assert status == 200 and dry["would_enable"] is False and dry["lacking"] == ["node-d"]
        status, answer = await plane.admin("POST", "/v1/fleet/features/atomic_commit/finalize")
        assert (
            status == 409 and answer["error"] == "not_supported" and answer["lacking"] == ["node-d"]
        )
        status, answer = await plane.admin("POST", "/v1/fleet/features/warp_drive/finalize")
        assert status == 409 and answer["error"] == "not_supported"

        # The lagging broker leaves: finalizing works, once; again is idempotent.
        await lagging.stop()

        async def four_gone() -> bool:
            status, body = await plane.admin("GET", "/v1/fleet/features")
            return status == 200 and body["serving_nodes"] == list(NODES)

        for _ in range(100):
            if await four_gone():
                break
            await asyncio.sleep(0.05)
        status, answer = await plane.admin("POST", "/v1/fleet/features/atomic_commit/finalize")
        assert status == 200 and answer["enabled"] is True and answer["already"] is False, answer
        status, answer = await plane.admin("POST", "/v1/fleet/features/atomic_commit/finalize")
        assert status == 200 and answer["already"] is True
        status, answer = await plane.admin(
            "POST", "/v1/fleet/features/publisher_principal/finalize"
        )
        assert status == 200 and answer["enabled"] is True

        def enabled_everywhere() -> bool:
            return all(
                b.fleet_features is not None
                and b.fleet_features.enabled == {"atomic_commit", "publisher_principal"}
                for b in fleet.brokers.values()
            )

        await eventually(enabled_everywhere, what="every broker enabled both features")
        status, listing = await plane.admin("GET", "/v1/fleet/features")
        assert listing["enabled"] == ["atomic_commit", "publisher_principal"]
        assert set(listing["supported"]) >= {"atomic_commit", "publisher_principal"}
        answer = await owner.request(_commit(2))
        assert isinstance(answer, CommitOk), answer
        assert await owner.request(_publish(11, b"after")) == PublishOk(request_id=11)
        read = await owner.request(
            StreamRead(
                tenant_id=TENANT, namespace=NS, stream=LEDGER[0], shard=0, from_=0, request_id=12
            )
        )
        assert isinstance(read, StreamRecords), read
        assert [r.payload for r in read.records] == [b"before", b"opened", b"after"]
        assert read.records[0].publisher is None
        assert read.records[1].publisher and read.records[2].publisher

        # One-way: a broker without a finalized feature may not join.
        with pytest.raises(FeatureMissingError, match="atomic_commit"):
            await start_broker(
                tmp_path,
                "node-e",
                fleet.endpoint,
                fleet.fleet_ca,
                fleet.issuer,
                fleet_features_override="publisher_principal",
            )


async def test_fleet_features_without_a_fleet_are_409_no_fleet(tmp_path: Path) -> None:
    async with control_plane(tmp_path, None) as plane:
        for method, path in (
            ("GET", "/v1/fleet/features"),
            ("POST", "/v1/fleet/features/atomic_commit/finalize"),
            ("GET", "/v1/fleet/members"),
        ):
            status, answer = await plane.admin(method, path)
            assert status == 409 and answer["error"] == "no_fleet", (path, answer)
        # The admin listener's secret still guards them.
        status, _ = await call("GET", f"{plane.admin_url}/v1/fleet/features", token="wrong")
        assert status == 401
