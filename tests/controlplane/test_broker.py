"""Brokers following the control plane: LiveCatalog + TenantJwksVerifier in a real Broker.

Every test runs a control plane and a fake OIDC provider on loopback HTTP and
a real in-process broker (QUIC + TLS) built with
``Broker(replace(config, catalog=LiveCatalog(...)), verifier=TenantJwksVerifier(...))``,
and talks to it with the raw wire client of tests/broker/harness.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from felix_broker.app import Broker
from felix_broker.catalog.live import CatalogChange
from felix_broker.config import load_config
from felix_transport import default_impl
from felix_wire.messages import (
    AuthOk,
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    Error,
    EventStreamHello,
    PublishError,
    PublishOk,
    Subscribe,
    Subscribed,
)

from ..support.wire import WireClient
from .support import (
    SYNC_TOKEN,
    FakeIdp,
    Stack,
    auth,
    call,
    control_plane,
    fake_idp,
    publish,
    setup_tenant,
    stack,
)

pytestmark = pytest.mark.timeout(60)


async def test_end_to_end_exchange_publish_subscribe_then_policy_change(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        await s.stream("acme", "orders")
        await s.policy(
            "acme",
            "app",
            ["stream.publish:stream:acme/ns/*", "stream.subscribe:stream:acme/ns/*"],
            "alice",
        )
        await s.synced()  # the stream created through the API is served now
        tok = await s.token("acme", "alice")
        client = await WireClient.connect(s.broker)
        control, answer = await auth(client, tok, "acme")
        assert isinstance(answer, AuthOk), answer
        await control.send(Subscribe(tenant_id="acme", namespace="ns", stream="orders"))
        subscribed = await control.recv()
        assert isinstance(subscribed, Subscribed), subscribed
        events = await client.event_stream()
        assert isinstance(await events.recv(), EventStreamHello)
        pub, answer = await auth(client, tok, "acme")
        await pub.send(publish("acme", "orders", b"hello"))
        assert await pub.recv() == PublishOk(request_id=1)
        frame = await events.recv()
        assert getattr(frame, "payloads", None) == [b"hello"]

        # Policy change: alice may only subscribe now. A new exchange yields fewer
        # perms, and a stream authenticated with the new token cannot publish.
        await s.policy("acme", "app", ["stream.subscribe:stream:acme/ns/*"], "alice")
        status, body = await s.exchange("acme", "alice")
        assert status == 200 and body["perms"] == ["stream.subscribe:stream:acme/ns/*"]
        narrowed, answer = await auth(client, body["token"], "acme")
        assert isinstance(answer, AuthOk)
        await narrowed.send(publish("acme", "orders", b"refused", rid=2))
        refused = await narrowed.recv()
        assert isinstance(refused, PublishError) and refused.code == "forbidden", refused
        # The old token is self-contained: it keeps working until it expires
        # (15 minutes at most), which is why lifetimes are short.
        _, answer = await auth(client, tok, "acme")
        assert isinstance(answer, AuthOk)
        # Remove the assignment entirely: the exchange refuses (403), nothing issued.
        await s.policy("acme", "app", [], "alice")
        assert (await s.exchange("acme", "alice"))[0] == 403
        assert s.offset("acme", "orders") == 1
        client.close()


async def test_stream_created_and_deleted_through_the_api(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        tok = s.mint("acme")
        client = await WireClient.connect(s.broker)
        pub, answer = await auth(client, tok, "acme")
        assert isinstance(answer, AuthOk)
        await pub.send(publish("acme", "late", b"x"))
        missing = await pub.recv()
        assert isinstance(missing, PublishError) and missing.code == "not_found"
        await s.stream("acme", "late")
        await s.synced()
        await pub.send(publish("acme", "late", b"x", rid=2))
        assert await pub.recv() == PublishOk(request_id=2)
        status, _ = await call(
            "DELETE", s.plane.t("acme", "/namespaces/ns/streams/late"), token=s.admins["acme"]
        )
        assert status == 204
        await s.synced()
        assert CatalogChange("delete", "stream", "acme", "ns", "late") in s.changes
        await pub.send(publish("acme", "late", b"x", rid=3))
        gone = await pub.recv()
        assert isinstance(gone, PublishError) and gone.code == "not_found"
        client.close()


async def test_rotated_key_is_fetched_and_revoked_key_refused(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        await s.stream("acme", "orders")
        await s.synced()
        old = s.mint("acme")
        status, body = await call("POST", s.plane.t("acme", "/keys/rotate"), token=s.admins["acme"])
        assert status == 201
        await s.synced()
        await asyncio.sleep(0.3)  # the change feed told the verifier to refetch
        new = s.mint("acme")
        assert jwt.get_unverified_header(new)["kid"] == body["kid"]
        client = await WireClient.connect(s.broker)
        for tok in (old, new):  # the retired key stays valid for its tokens
            _, answer = await auth(client, tok, "acme")
            assert isinstance(answer, AuthOk), answer
        old_kid = jwt.get_unverified_header(old)["kid"]
        status, _ = await call(
            "DELETE",
            s.plane.t("acme", f"/keys/{old_kid}"),
            token=s.mint(
                "acme",
                aud="felix-controlplane",
                perms=["stream.manage:stream:acme/*", "cache.manage:cache:acme/*"],
            ),
        )
        assert status == 204
        await s.synced()
        await asyncio.sleep(0.3)
        _, answer = await auth(client, old, "acme")
        assert isinstance(answer, Error) and answer.code == "unauthenticated", answer
        client.close()


def _b64(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _tampered(s: Stack) -> str:
    header, payload, sig = s.mint("acme").split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["perms"] = ["stream.publish:stream:beta/*"]
    return f"{header}.{_b64(claims)}.{sig}"


def _hs256_public(s: Stack) -> str:
    jwk = s.plane.control.keys.jwks("acme", int(time.time()))["keys"][0]
    claims = jwt.decode(s.mint("acme"), options={"verify_signature": False})
    return jwt.encode(claims, jwk["x"].encode(), algorithm="HS256", headers={"kid": jwk["kid"]})


def _rs256(s: Stack) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = jwt.decode(s.mint("acme"), options={"verify_signature": False})
    kid = jwt.get_unverified_header(s.mint("acme"))["kid"]
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def _alg_none(s: Stack) -> str:
    claims = jwt.decode(s.mint("acme"), options={"verify_signature": False})
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."


def _unknown_kid(s: Stack) -> str:
    from felix_common.tokens import DevIssuer

    issuer = DevIssuer.load_or_create(Path(s.broker.config.data_dir) / "other")
    return issuer.mint("acme", subject="x", perms=["stream.publish:stream:acme/*"])


NOW = int(time.time())
BAD_TOKENS: dict[str, tuple[Any, str]] = {
    "expired": (lambda s: s.mint("acme", iat=NOW - 3600, nbf=NOW - 3600, exp=NOW - 120), "exp"),
    "not-yet-valid": (lambda s: s.mint("acme", nbf=NOW + 3600, exp=NOW + 7200), "nbf"),
    "wrong-aud": (lambda s: s.mint("acme", aud="felix-controlplane"), "aud"),
    "wrong-iss": (lambda s: s.mint("acme", iss="someone-else"), "iss"),
    "tid-other-tenant": (lambda s: s.mint("acme", tid="beta"), "tid"),
    "other-tenants-key": (lambda s: s.mint("acme", signer="beta"), "kid"),
    "unknown-kid": (_unknown_kid, "kid"),
    "alg-none": (_alg_none, "alg"),
    "hs256-public-key": (_hs256_public, "alg"),
    "rs256": (_rs256, "alg"),
    "tampered-payload": (_tampered, "signature"),
    "unknown-action": (lambda s: s.mint("acme", perms=["stream.destroy:stream:acme/*"]), "perms"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
async def test_refused_tokens(tmp_path: Path, case: str) -> None:
    async with stack(tmp_path) as s:
        await s.stream("acme", "orders")
        await s.synced()
        make, check = BAD_TOKENS[case]
        client = await WireClient.connect(s.broker)
        stream, answer = await auth(client, make(s), "acme")
        assert isinstance(answer, Error), answer
        assert (answer.code, answer.retry) == ("unauthenticated", "fatal")
        failures = s.broker.metrics.auth_failures.labels(reason=check)._value.get()
        assert failures == 1, (case, answer.message)
        # Nothing is written: the stream ends and the shard stays empty.
        await stream.expect_end()
        assert s.offset("acme", "orders") == 0
        client.close()


async def test_wildcards_never_cross_tenant_or_namespace_boundaries(tmp_path: Path) -> None:
    async with stack(tmp_path, tenants=("t1", "t10")) as s:
        await s.stream("t1", "orders")
        await s.stream("t10", "orders")
        status, _ = await call(
            "POST", s.plane.t("t1", "/namespaces"), token=s.admins["t1"], body={"name": "other"}
        )
        assert status == 201
        await s.stream("t1", "orders", ns="other")
        await s.synced()
        tok = s.mint("t1", perms=["stream.publish:stream:t1/ns/*"])
        client = await WireClient.connect(s.broker)
        pub, answer = await auth(client, tok, "t1")
        assert isinstance(answer, AuthOk)
        await pub.send(publish("t1", "orders", b"ok"))
        assert await pub.recv() == PublishOk(request_id=1)
        for rid, (tenant, ns) in enumerate([("t10", "ns"), ("t1", "other")], start=2):
            await pub.send(publish(tenant, "orders", b"no", rid=rid, ns=ns))
            refused = await pub.recv()
            assert isinstance(refused, PublishError) and refused.code == "forbidden", refused
            assert s.offset(tenant, "orders", ns=ns) == 0
        client.close()


async def test_cross_tenant_isolation(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        for tenant in ("acme", "beta"):
            await s.stream(tenant, "orders")
            await s.cache(tenant, "c")
            await s.policy(
                tenant,
                "all",
                [
                    f"stream.publish:stream:{tenant}/*",
                    f"stream.subscribe:stream:{tenant}/*",
                    f"cache.read:cache:{tenant}/*",
                    f"cache.write:cache:{tenant}/*",
                ],
                f"user-{tenant}",
            )
        await s.synced()
        tokens = {t: await s.token(t, f"user-{t}") for t in ("acme", "beta")}
        # A principal of acme is not a principal of beta: no exchange there.
        assert (await s.exchange("beta", "user-acme"))[0] == 403
        client = await WireClient.connect(s.broker)
        # acme's token naming beta in auth: refused outright.
        _, answer = await auth(client, tokens["acme"], "beta")
        assert isinstance(answer, Error) and answer.code == "unauthenticated"
        # Same connection, both tenants authenticated on different streams.
        a, answer = await auth(client, tokens["acme"], "acme")
        assert isinstance(answer, AuthOk)
        b, answer = await auth(client, tokens["beta"], "beta")
        assert isinstance(answer, AuthOk)
        await a.send(publish("beta", "orders", b"intrusion"))
        refused = await a.recv()
        assert isinstance(refused, PublishError) and refused.code == "forbidden"
        await a.send(Subscribe(tenant_id="beta", namespace="ns", stream="orders"))
        refused = await a.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden"
        await a.send(
            CachePut(tenant_id="beta", namespace="ns", cache="c", key="k", value=b"x", request_id=1)
        )
        refused = await a.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden", refused
        await b.send(
            CachePut(
                tenant_id="beta", namespace="ns", cache="c", key="k", value=b"mine", request_id=2
            )
        )
        assert await b.recv() == CacheOk(request_id=2)
        await a.send(CacheGet(tenant_id="beta", namespace="ns", cache="c", key="k", request_id=3))
        refused = await a.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden", refused
        await b.send(CacheGet(tenant_id="acme", namespace="ns", cache="c", key="k", request_id=4))
        refused = await b.recv()
        assert isinstance(refused, Error) and refused.code == "forbidden", refused
        # Each tenant still works on its own.
        await b.send(publish("beta", "orders", b"own", rid=5))
        assert await b.recv() == PublishOk(request_id=5)
        assert s.offset("beta", "orders") == 1 and s.offset("acme", "orders") == 0
        await b.send(CacheGet(tenant_id="beta", namespace="ns", cache="c", key="k", request_id=6))
        got = await b.recv()
        assert isinstance(got, CacheValue) and got.value == b"mine"
        client.close()


async def test_unconfigured_upstream_issuer_gets_nothing(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        before = s.plane.rows()
        stranger = FakeIdp("https://unconfigured.test")
        status, body = await call(
            "POST", s.plane.t("acme", "/token/exchange"), token=stranger.token("alice")
        )
        assert status == 401 and body["error"] == "unauthenticated"
        assert s.plane.rows() == before


async def test_unknown_tenant_and_kid_refetch_is_rate_limited(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        fetches = 0
        real = s.verifier.refresh

        async def counting(tenant: str, *, force: bool = False) -> bool:
            nonlocal fetches
            fetches += 1
            return await real(tenant, force=force)

        s.verifier.refresh = counting  # type: ignore[method-assign]
        client = await WireClient.connect(s.broker)
        for _ in range(5):
            _, answer = await auth(client, _unknown_kid(s), "acme")
            assert isinstance(answer, Error) and answer.code == "unauthenticated"
        # A tenant the catalog does not know never causes a fetch.
        _, answer = await auth(client, s.mint("acme", tid="ghost"), "ghost")
        assert isinstance(answer, Error)
        await asyncio.sleep(0.1)
        assert fetches <= 1
        client.close()


async def test_broker_configured_with_a_control_plane_url(tmp_path: Path) -> None:
    """FELIX_CONTROLPLANE_URL (+ a sync token file): the broker takes its catalog and
    token keys from the control plane, and a deleted stream ends its subscriptions."""
    from felix_wire.messages import Subscribe, Subscribed

    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        token_file = tmp_path / "sync-token"
        token_file.write_text(SYNC_TOKEN + "\n")
        settings = {
            "quic_bind": "127.0.0.1:0",
            "metrics_bind": "127.0.0.1:0",
            "data_dir": str(tmp_path / "broker"),
            "quic_impl": default_impl(),
            "controlplane_url": plane.url,
            "controlplane_sync_token_file": str(token_file),
        }
        broker = Broker(load_config(environ={}, overrides=settings))
        await broker.start()
        try:
            assert broker.issuer is None  # no development issuer next to a control plane
            status, _ = await call(
                "POST",
                plane.t("acme", "/namespaces/ns/streams"),
                token=admin,
                body={"name": "live"},
            )
            assert status == 201
            head = plane.store.changes_since(0, 1_000_000).seq
            await broker.catalog.wait_for_seq(head, timeout=5)  # type: ignore[attr-defined]
            now = int(time.time())
            claims = {
                "iss": "felix-auth",
                "aud": "felix-broker",
                "sub": "app",
                "tid": "acme",
                "perms": ["stream.subscribe:stream:acme/ns/*"],
                "iat": now,
                "nbf": now,
                "exp": now + 300,
            }
            tok = plane.control.keys.sign("acme", claims, now)
            client = await WireClient.connect(broker)
            control, answer = await auth(client, tok, "acme")
            assert isinstance(answer, AuthOk), answer
            await control.send(Subscribe(tenant_id="acme", namespace="ns", stream="live"))
            assert isinstance(await control.recv(), Subscribed)
            events = await client.event_stream()
            await events.recv()  # hello
            status, _ = await call(
                "DELETE", plane.t("acme", "/namespaces/ns/streams/live"), token=admin
            )
            assert status == 204
            await events.expect_end(timeout=10)  # the deletion ended the subscription
            client.close()
        finally:
            await broker.stop()
