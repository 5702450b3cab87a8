"""Token exchange, RBAC policies and assignments, signing keys and the JWKS."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from felix_common.tokens import TokenVerifier, UnknownKeyIdError
from felix_controlplane.rbac import narrow

from .support import IDP_AUDIENCE, FakeIdp, call, control_plane, fake_idp, setup_tenant

pytestmark = pytest.mark.timeout(30)


async def grant(
    plane: Any, tenant: str, admin: str, name: str, perms: list[str], **who: list[str]
) -> None:
    status, body = await call(
        "PUT", plane.t(tenant, f"/policies/{name}"), token=admin, body={"permissions": perms}
    )
    assert status in (200, 201), body
    status, body = await call(
        "PUT",
        plane.t(tenant, f"/assignments/{name}"),
        token=admin,
        body={"policy": name, **who},
    )
    assert status in (200, 201), body


async def exchange(plane: Any, tenant: str, upstream: str, **body: Any) -> tuple[int, Any]:
    return await call("POST", plane.t(tenant, "/token/exchange"), token=upstream, body=body or None)


async def test_exchange_maps_subjects_and_groups_to_a_felix_token(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        await grant(
            plane,
            "acme",
            admin,
            "pub",
            ["stream.publish:stream:acme/ns/*"],
            subjects=[idp.subject("alice")],
        )
        await grant(
            plane,
            "acme",
            admin,
            "readers",
            ["cache.read:cache:acme/ns/c"],
            groups=[idp.subject("readers")],
        )
        status, answer = await exchange(plane, "acme", idp.token("alice", groups=["readers"]))
        assert status == 200, answer
        assert answer["perms"] == ["stream.publish:stream:acme/ns/*", "cache.read:cache:acme/ns/c"]
        assert answer["expires_in"] == 900
        _, jwks = await call("GET", plane.t("acme", "/.well-known/jwks.json"))
        principal = TokenVerifier(jwks).verify(answer["token"], "acme")
        assert principal.subject == "https://idp.test#alice"
        claims = jwt.decode(answer["token"], options={"verify_signature": False})
        assert (claims["iss"], claims["aud"], claims["tid"]) == (
            "felix-auth",
            "felix-broker",
            "acme",
        )
        assert claims["exp"] - claims["iat"] == 900
        # A group of the same name from another issuer does not count.
        status, answer = await exchange(plane, "acme", idp.token("bob", groups=["other#readers"]))
        assert status == 403


async def test_exchange_narrowing_and_audience(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        await grant(
            plane,
            "acme",
            admin,
            "p",
            ["stream.publish:stream:acme/*", "stream.subscribe:stream:acme/ns/*"],
            subjects=[idp.subject("alice")],
        )
        upstream = idp.token("alice")
        status, answer = await exchange(
            plane,
            "acme",
            upstream,
            actions=["stream.publish"],
            resources=["stream:acme/ns/orders"],
            audience="felix-controlplane",
            ttl_seconds=60,
        )
        assert status == 200, answer
        assert answer["perms"] == ["stream.publish:stream:acme/ns/orders"]
        claims = jwt.decode(answer["token"], options={"verify_signature": False})
        assert claims["aud"] == "felix-controlplane" and claims["exp"] - claims["iat"] == 60
        # Narrowing never widens; asking for what is not granted leaves nothing: 403.
        status, _ = await exchange(plane, "acme", upstream, actions=["cache.write"])
        assert status == 403
        for bad in (
            {"audience": "other"},
            {"ttl_seconds": 999999},
            {"actions": ["x.y"]},
            {"resources": ["stream:acme/*/orders"]},
        ):
            assert (await exchange(plane, "acme", upstream, **bad))[0] == 400, bad


def test_narrow_wildcard_edges() -> None:
    grants = ["stream.publish:stream:t1/*"]
    assert narrow(grants, None, ["stream:t10/ns/s"]) == []
    assert narrow(grants, None, ["stream:t1/ns/s"]) == ["stream.publish:stream:t1/ns/s"]
    assert narrow(grants, None, ["stream:t1/ns/*"]) == ["stream.publish:stream:t1/ns/*"]
    assert narrow(["stream.publish:stream:t1/ns/s"], None, ["stream:t1/*"]) == [
        "stream.publish:stream:t1/ns/s"
    ]
    assert narrow(grants, None, ["cache:t1/ns/s"]) == []


def expired(idp: FakeIdp) -> str:
    now = int(time.time())
    return idp.token("alice", iat=now - 3600, exp=now - 600)


def unsigned(idp: FakeIdp) -> str:
    return jwt.encode(
        {"iss": idp.issuer, "aud": IDP_AUDIENCE, "sub": "alice", "exp": int(time.time()) + 60},
        None,
        algorithm="none",
    )


def hs256_with_public_jwk(idp: FakeIdp) -> str:
    secret = str(idp.jwks()["keys"][0]["x"]).encode()
    return jwt.encode(
        {"iss": idp.issuer, "aud": IDP_AUDIENCE, "sub": "alice", "exp": int(time.time()) + 60},
        secret,
        algorithm="HS256",
        headers={"kid": idp.kid},
    )


def other_key(idp: FakeIdp) -> str:
    impostor = FakeIdp(idp.issuer)
    return impostor.token("alice")


def rs256(idp: FakeIdp) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(
        {"iss": idp.issuer, "aud": IDP_AUDIENCE, "sub": "alice", "exp": int(time.time()) + 60},
        key,
        algorithm="RS256",
        headers={"kid": idp.kid},
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda idp: FakeIdp("https://evil.test").token("alice"),  # unconfigured issuer
        lambda idp: idp.token("alice", aud="someone-else"),
        expired,
        lambda idp: idp.token("alice", nbf=int(time.time()) + 3600),
        unsigned,
        hs256_with_public_jwk,
        rs256,  # not in the provider's allowed algorithms
        other_key,  # right issuer and kid, wrong signature
        lambda idp: idp.token("alice")[:-4] + "AAAA",
        lambda idp: "not-a-jwt",
    ],
    ids=[
        "unconfigured-issuer",
        "wrong-aud",
        "expired",
        "not-yet-valid",
        "alg-none",
        "hs256-public-key",
        "rs256-not-allowed",
        "wrong-key",
        "tampered",
        "garbage",
    ],
)
async def test_bad_upstream_tokens_are_401(tmp_path: Path, make: Any) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        await grant(
            plane,
            "acme",
            admin,
            "p",
            ["stream.publish:stream:acme/*"],
            subjects=[idp.subject("alice")],
        )
        before = plane.rows()
        status, body = await exchange(plane, "acme", make(idp))
        assert status == 401, body
        assert body["error"] == "unauthenticated"
        assert plane.rows() == before


async def test_unknown_upstream_kid_refetch_is_rate_limited(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        await grant(
            plane,
            "acme",
            admin,
            "p",
            ["stream.publish:stream:acme/*"],
            subjects=[idp.subject("alice")],
        )
        assert (await exchange(plane, "acme", idp.token("alice")))[0] == 200
        fetches = idp.fetches
        made_up = FakeIdp(idp.issuer, key=idp.key, kid="made-up")
        for _ in range(5):
            assert (await exchange(plane, "acme", made_up.token("alice")))[0] == 401
        assert idp.fetches <= fetches + 1


@pytest.mark.parametrize(
    "perms",
    [
        ["stream.publish:*"],
        ["stream.publish:stream:*"],
        ["stream.publish:stream:other/*"],
        ["stream.publish:stream:acme10/ns/s"],
        ["stream.publish:stream:acme/*/s"],
        ["stream.destroy:stream:acme/*"],
        ["cache.read:stream:acme/ns/s"],
        [],
    ],
)
async def test_invalid_policies_are_refused(tmp_path: Path, perms: list[str]) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        before = plane.rows()
        status, body = await call(
            "PUT", plane.t("acme", "/policies/p"), token=admin, body={"permissions": perms}
        )
        assert status == 400, body
        assert plane.rows() == before


async def test_identity_provider_validation(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        url = plane.t("acme", "/identity-providers/idp")
        base = {"issuer": "https://i", "audience": "a", "jwks_url": "https://i/jwks"}
        for algs in (["HS256"], ["none"], []):
            status, _ = await call("PUT", url, token=admin, body={**base, "algorithms": algs})
            assert status == 400
        status, _ = await call("PUT", url, token=admin, body={**base, "jwks_url": "file:///x"})
        assert status == 400
        assert (await call("PUT", url, token=admin, body=base))[0] == 201
        _, body = await call("GET", url, token=admin)
        assert body["algorithms"] == ["RS256", "ES256"]


async def test_rotation_keeps_old_key_published_and_revocation_removes_it(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        jwks_url = plane.t("acme", "/.well-known/jwks.json")
        _, jwks = await call("GET", jwks_url)
        (old_kid,) = [k["kid"] for k in jwks["keys"]]
        status, body = await call("POST", plane.t("acme", "/keys/rotate"), token=admin)
        assert status == 201 and body["kid"] != old_kid
        _, jwks = await call("GET", jwks_url)
        assert {k["kid"] for k in jwks["keys"]} == {old_kid, body["kid"]}
        # The admin token signed with the old key still verifies (not expired).
        TokenVerifier(jwks, audience="felix-controlplane").verify(admin, "acme")
        # After the grace time (max lifetime + leeway) the retired key is gone.
        later = int(time.time()) + 3600 + 61
        assert [k["kid"] for k in plane.control.keys.jwks("acme", later)["keys"]] == [body["kid"]]
        # Revocation (here with the admin token the old key signed) withdraws it at once.
        assert (await call("DELETE", plane.t("acme", f"/keys/{old_kid}"), token=admin))[0] == 204
        _, jwks = await call("GET", jwks_url)
        assert [k["kid"] for k in jwks["keys"]] == [body["kid"]]
        with pytest.raises(UnknownKeyIdError):
            TokenVerifier(jwks, audience="felix-controlplane").verify(admin, "acme")
        assert (await call("GET", plane.t("acme", "/keys"), token=admin))[0] == 401
        assert (await call("GET", plane.t("nope", "/.well-known/jwks.json")))[0] == 404
