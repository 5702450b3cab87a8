"""`POST /v1/tenants/{t}/tokens`: a tenant administrator mints a token, the way to a
working token without an upstream identity provider (development, automation)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from felix_common.permissions import stream_object
from felix_common.tokens import TokenVerifier
from felix_wire.messages import AuthOk, PublishOk

from ..support.wire import WireClient
from .support import auth, call, control_plane, publish, stack

pytestmark = pytest.mark.timeout(60)


async def test_a_minted_token_carries_what_was_asked_and_verifies(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        perms = ["stream.publish:stream:acme/ns/orders"]
        status, body = await call(
            "POST",
            plane.t("acme", "/tokens"),
            token=admin,
            body={"subject": "ci-job", "perms": perms, "ttl_seconds": 120},
        )
        assert status == 201, body
        assert (body["subject"], body["perms"], body["expires_in"]) == ("ci-job", perms, 120)
        assert body["audience"] == "felix-broker"
        _, jwks = await call("GET", plane.t("acme", "/.well-known/jwks.json"))
        principal = TokenVerifier(jwks).verify(body["token"], "acme")
        assert principal.subject == "ci-job"
        assert principal.permissions.allows("stream.publish", stream_object("acme", "ns", "orders"))
        assert not principal.permissions.allows("stream.publish", stream_object("acme", "ns", "x"))
        assert body["expires_at"] - int(time.time()) <= 120
        # No permissions at all is a token that authenticates and may do nothing.
        status, body = await call(
            "POST", plane.t("acme", "/tokens"), token=admin, body={"subject": "nobody"}
        )
        assert status == 201 and body["perms"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"perms": []},  # no subject
        {"subject": "", "perms": []},
        {"subject": "x", "perms": ["stream.publish:stream:beta/*"]},  # another tenant
        {"subject": "x", "perms": ["stream.publish:*"]},
        {"subject": "x", "perms": "stream.publish:stream:acme/*"},
        {"subject": "x", "ttl_seconds": 0},
        {"subject": "x", "ttl_seconds": 3601},
        {"subject": "x", "audience": "elsewhere"},
        {"subject": "x", "extra": 1},
    ],
)
async def test_bad_mint_requests_are_400(tmp_path: Path, body: dict[str, object]) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await plane.bootstrap("beta")
        status, answer = await call("POST", plane.t("acme", "/tokens"), token=admin, body=body)
        assert (status, answer["error"]) == (400, "invalid_definition"), answer


async def test_only_a_tenant_admin_of_that_tenant_mints(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        acme = (await plane.bootstrap("acme"))["admin_token"]
        await plane.bootstrap("beta")
        body = {"subject": "x", "perms": []}
        assert (await call("POST", plane.t("acme", "/tokens"), body=body))[0] == 401
        assert (await call("POST", plane.t("beta", "/tokens"), token=acme, body=body))[0] == 401
        # A data-plane token (audience felix-broker) is not an admin credential.
        _, minted = await call(
            "POST",
            plane.t("acme", "/tokens"),
            token=acme,
            body={"subject": "x", "perms": ["stream.manage:stream:acme/*"]},
        )
        status, _ = await call("POST", plane.t("acme", "/tokens"), token=minted["token"], body=body)
        assert status == 401


async def test_a_control_plane_broker_accepts_a_minted_token(tmp_path: Path) -> None:
    async with stack(tmp_path, tenants=("acme",)) as s:
        await s.stream("acme", "orders")
        await s.synced()
        status, body = await call(
            "POST",
            s.plane.t("acme", "/tokens"),
            token=s.admins["acme"],
            body={"subject": "dev", "perms": ["stream.publish:stream:acme/ns/*"]},
        )
        assert status == 201, body
        client = await WireClient.connect(s.broker)
        stream, answer = await auth(client, body["token"], "acme")
        assert isinstance(answer, AuthOk), answer
        await stream.send(publish("acme", "orders", b"minted"))
        assert await stream.recv() == PublishOk(request_id=1)
