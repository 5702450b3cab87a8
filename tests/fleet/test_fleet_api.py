"""The operator's fleet commands on `felix-controlplane`'s admin listener (real etcd,
the control plane as a user runs it, two brokers that joined through etcd): move a
shard to a named broker, cancel (409 once cut over), drain a broker and stop
draining it; bad requests and a missing secret get typed answers."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from felix_broker.app import Broker
from felix_broker.fleet.routing import AssignmentState
from felix_common.etcd_process import EtcdProcess
from felix_common.tokens import DevIssuer
from felix_transport import generate_ca
from tests.controlplane.support import call

from ..support.wire import NS, TENANT
from .support import SHARD, STREAM, etcd_control_plane, eventually, start_broker

pytestmark = pytest.mark.timeout(120)

SHARD_PATH = f"stream/{TENANT}/{NS}/{STREAM}/0"
BODY = {"kind": "stream", "tenant": TENANT, "namespace": NS, "name": STREAM, "shard": 0}


def admin_plane(tmp: Path, endpoint: str) -> AbstractAsyncContextManager[tuple[str, str]]:
    """The control plane with its placer; (admin URL, bootstrap secret)."""
    return etcd_control_plane(tmp, endpoint, {"name": STREAM, "shards": 1})


def leader(brokers: dict[str, Broker]) -> Any:
    routes = []
    for broker in brokers.values():
        assert broker.fleet is not None
        routes.append(broker.fleet.view.snapshot.routes.get(SHARD))
    first = routes[0]
    if (
        first is None
        or any(r != first for r in routes)
        or first.state is not AssignmentState.ACTIVE
    ):
        return None
    return first.leader


async def test_move_cancel_and_drain_through_the_admin_listener(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    endpoint = etcd_server.endpoint
    fleet_ca = generate_ca("test fleet")
    issuer = DevIssuer.load_or_create(tmp_path / "issuer")
    async with AsyncExitStack() as stack:
        url, secret = await stack.enter_async_context(admin_plane(tmp_path, endpoint))
        brokers: dict[str, Broker] = {}
        for node in ("node-a", "node-b"):
            brokers[node] = await start_broker(tmp_path, node, endpoint, fleet_ca, issuer)
            stack.push_async_callback(brokers[node].stop)
        await eventually(lambda: leader(brokers) is not None, within=30, what="placed")
        owner = leader(brokers)
        other = "node-b" if owner == "node-a" else "node-a"

        async def admin(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            return await call(method, f"{url}{path}", token=secret, body=body)

        # Typed refusals: no secret, a bad body, an unknown broker, nothing to cancel.
        assert (await call("POST", f"{url}/v1/fleet/moves", body=BODY))[0] == 401
        status, answer = await admin("POST", "/v1/fleet/moves", {"kind": "stream"})
        assert status == 400, answer
        status, answer = await admin("POST", "/v1/fleet/moves", {**BODY, "to": "node-z"})
        assert status == 404, answer
        status, answer = await admin("DELETE", f"/v1/fleet/moves/{SHARD_PATH}")
        assert status == 409, answer
        assert (await admin("DELETE", "/v1/fleet/drains/node-a"))[0] == 404

        # A move to the other broker, cut over; then a cancel is too late.
        status, answer = await admin("POST", "/v1/fleet/moves", {**BODY, "to": other})
        assert status == 202 and answer["generation"] > 0, answer
        await eventually(lambda: leader(brokers) == other, within=30, what="cut over")
        status, answer = await admin("DELETE", f"/v1/fleet/moves/{SHARD_PATH}")
        assert status == 409, answer
        assert (await admin("GET", "/v1/fleet/moves"))[1] == {
            "items": [],
            "queued": [],
            "max_moves": 2,
        }

        # A drain of the new owner moves the shard back; undrained afterwards.
        assert (await admin("POST", f"/v1/fleet/drains/{other}"))[0] == 202
        await eventually(lambda: leader(brokers) == owner, within=30, what="drained back")
        assert (await admin("DELETE", f"/v1/fleet/drains/{other}"))[0] == 200
