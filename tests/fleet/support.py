"""Helpers for the fleet tests: fleet nodes (the broker's real fleet part, without QUIC),
a placer over a fixed catalog, a control plane on etcd, and bounded waits."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.etcd_node import EtcdNode
from felix_broker.fleet.node import FleetNode
from felix_broker.fleet.peer import PeerTls
from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient
from felix_common.fleet import Keyspace
from felix_common.tokens import DevIssuer, TokenVerifier
from felix_controlplane.cli import parse_args, run
from felix_controlplane.placement import Placer, ShardSpec
from felix_transport import default_impl
from tests.controlplane.support import call

from ..support.wire import NS, TENANT

PREFIX = "/felix-test"


def node(endpoint: tuple[str, int], node_id: str, *, ttl_ms: int = 1500) -> EtcdNode:
    return EtcdNode(
        view=FleetView(RoutingSnapshot(node_id)),
        endpoints=[endpoint],
        prefix=PREFIX,
        lease_ttl_ms=ttl_ms,
        client_addr=f"127.0.0.1:{5000 + len(node_id)}",
        peer_addr="",
        features=[],
    )


# The etcd clients placers were given: a Placer does not own its client, so the tests
# close them, on the loop that made them, before it closes.
PLACER_CLIENTS: list[EtcdClient] = []


def placer(
    endpoint: tuple[str, int], holder: str, specs: list[ShardSpec], *, ttl_s: int = 2
) -> Placer:
    async def catalog() -> list[ShardSpec]:
        return specs

    client = EtcdClient([endpoint], timeout_s=1.0)
    PLACER_CLIENTS.append(client)  # closed after each test (conftest.py)
    return Placer(client, Keyspace(PREFIX), holder, catalog, lease_ttl_s=ttl_s, interval_s=0.2)


async def eventually(check: Callable[[], bool], *, within: float = 10.0, what: str = "") -> None:
    """Wait (bounded) until `check()` holds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what or check}")
        await asyncio.sleep(0.02)


async def replica_set_placed(
    route_at: Callable[[str], Any], leader_serves: Callable[[str], bool], nodes: Sequence[str]
) -> Any:
    """Wait (bounded) until every one of `nodes` sees the same active assignment of the
    shard (`route_at(node)`) and its leader serves it (`leader_serves(leader)`); that
    route."""

    def placed() -> bool:
        routes = [route_at(n) for n in nodes]
        first = routes[0]
        return (
            first is not None
            and first.state is AssignmentState.ACTIVE
            and all(r == first for r in routes)
        )

    await eventually(placed, within=30, what="a placed replica set")
    route = route_at(nodes[0])
    await eventually(lambda: leader_serves(route.leader), within=15, what="the leader open")
    return route


@dataclass
class Applied:
    """Every route change one node's view accepted: (shard, generation) in order."""

    node_id: str
    seen: list[tuple[ShardId, int]] = field(default_factory=list)

    def __call__(self, previous: RoutingSnapshot, current: RoutingSnapshot) -> None:
        for shard, route in current.routes.items():
            held = previous.routes.get(shard)
            if held is None or held.generation != route.generation:
                self.seen.append((shard, route.generation))

    def check_never_twice_nor_backwards(self) -> None:
        last: dict[ShardId, int] = {}
        for shard, generation in self.seen:
            assert generation > last.get(shard, 0), (self.node_id, shard, generation, last)
            last[shard] = generation


@asynccontextmanager
async def etcd_control_plane(
    tmp: Path, endpoint: str, stream: dict[str, Any], cache: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, str]]:
    """`felix-controlplane --store etcd` with its placer, the tests' tenant and namespace
    bootstrapped and `stream` (a stream body of its API) created, and `cache` (a cache
    body) if given; yields (admin URL, bootstrap secret)."""
    ready = tmp / "ready.json"
    args = parse_args(
        [
            *("--db", str(tmp / "cp.db"), "--store", "etcd"),
            *("--etcd-endpoints", endpoint, "--placer-id", "cp-1", "--placer-lease-ttl", "2"),
            *("--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"),
            *("--ready-file", str(ready)),
        ]
    )
    stop = asyncio.Event()
    plane = asyncio.get_running_loop().create_task(run(args, stop))
    try:
        await eventually(ready.exists, what="control plane up")
        urls = json.loads(ready.read_text())
        secret = (tmp / "cp.db.bootstrap-secret").read_text().strip()
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
        assert (await call("POST", f"{base}/{NS}/streams", token=admin, body=stream))[0] == 201
        if cache is not None:
            created = await call("POST", f"{base}/{NS}/caches", token=admin, body=cache)
            assert created[0] == 201, created
        yield urls["admin_url"], secret
    finally:
        stop.set()
        await plane


@dataclass(frozen=True)
class Accepted:
    shard: ShardId
    node_id: str
    generation: int
    at: float


def check_no_two_leaders(log: list[Accepted]) -> None:
    by_generation: dict[tuple[ShardId, int], set[str]] = {}
    spans: dict[tuple[ShardId, str], list[float]] = {}
    for entry in log:
        by_generation.setdefault((entry.shard, entry.generation), set()).add(entry.node_id)
        spans.setdefault((entry.shard, entry.node_id), []).append(entry.at)
    for key, nodes in by_generation.items():
        assert len(nodes) == 1, f"{key} served by {nodes}"
    # Per shard, each broker's accepted writes at a generation form one period; the
    # periods of two brokers never overlap in time.
    periods: dict[ShardId, list[tuple[float, float, str, int]]] = {}
    for (shard, generation), nodes in by_generation.items():
        (node_id,) = nodes
        times = [e.at for e in log if e.shard == shard and e.generation == generation]
        periods.setdefault(shard, []).append((min(times), max(times), node_id, generation))
    for shard, spans_of in periods.items():
        spans_of.sort()
        for (_, end, n1, g1), (start, _, n2, g2) in itertools.pairwise(spans_of):
            assert g1 < g2, (shard, g1, g2)
            if n1 != n2:
                assert end < start, f"{shard}: {n1}@{g1} until {end}, {n2}@{g2} from {start}"


STREAM = "events"
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, STREAM, 0)


async def start_broker(
    tmp: Path, node_id: str, endpoint: str, fleet_ca: Any, issuer: DevIssuer
) -> Broker:
    """A broker joining through etcd; its catalog names the control plane's stream."""
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "peer_bind": "127.0.0.1:0",
        "data_dir": str(tmp / node_id),
        "quic_impl": default_impl(),
        "node_id": node_id,
        "etcd_endpoints": endpoint,
        "node_lease_ttl_ms": 3000,
    }
    config = dataclasses.replace(
        load_config(environ={}, overrides=settings),
        catalog=StaticCatalog(streams=[StreamSpec(TENANT, NS, STREAM, shards=1)], caches=[]),
    )
    fleet = FleetNode(
        tls=PeerTls.issue(fleet_ca, node_id), view=FleetView(RoutingSnapshot(node_id=node_id))
    )
    broker = Broker(config, verifier=TokenVerifier(issuer.jwks()), fleet=fleet)
    await broker.start()
    return broker
