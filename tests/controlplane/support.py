"""Test support: a control plane and a fake OIDC provider on loopback, an HTTP helper."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from felix_broker.app import Broker
from felix_broker.catalog.live import CatalogChange, LiveCatalog, TenantJwksVerifier
from felix_broker.config import load_config
from felix_controlplane.api import ControlPlane, Settings
from felix_controlplane.http import HttpServer, Request, Response
from felix_controlplane.store import DEFAULT_MAX_CHANGES, SqliteStore, Store
from felix_transport import default_impl
from felix_wire.messages import (
    AckMode,
    Publish,
)

from ..support.wire import WireClient

SYNC_TOKEN = "sync-secret-for-tests"
BOOTSTRAP_SECRET = "bootstrap-secret-for-tests"
IDP_AUDIENCE = "felix-tests"


def _call(
    method: str, url: str, token: str | None, body: Any, headers: dict[str, str] | None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


async def call(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    return await asyncio.to_thread(_call, method, url, token, body, headers)


# The store `control_plane` opens: SQLite unless a test module's fixture points it at
# an etcd (tests/controlplane/test_api.py runs every test on both backends).
ETCD_ENDPOINT: tuple[str, int] | None = None


def open_store(tmp: Path, max_changes: int) -> Store:
    if ETCD_ENDPOINT is None:
        return SqliteStore(tmp / "cp.db", max_changes=max_changes)
    from felix_controlplane.store_etcd import EtcdStore

    return EtcdStore([ETCD_ENDPOINT], max_changes=max_changes)


@dataclass
class Plane:
    control: ControlPlane
    store: Store
    url: str
    admin_url: str

    def t(self, tenant: str, rest: str = "") -> str:
        return f"{self.url}/v1/tenants/{tenant}{rest}"

    async def bootstrap(self, tenant: str, **body: Any) -> dict[str, Any]:
        body.setdefault("admin", {"subjects": [f"admin@{tenant}"]})
        status, answer = await call(
            "POST",
            f"{self.admin_url}/v1/bootstrap",
            token=BOOTSTRAP_SECRET,
            body={"tenant": tenant, **body},
        )
        assert status == 201, answer
        return dict(answer)

    def rows(self) -> dict[str, int]:
        """Row counts of every table: 'nothing written' checks compare two of these."""
        if not isinstance(self.store, SqliteStore):
            return self._etcd_rows()
        db = self.store._db
        return {
            table: int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("tenants", "resources", "signing_keys", "changes")
        }

    def _etcd_rows(self) -> dict[str, int]:
        from felix_controlplane.store_etcd import EtcdStore

        store = self.store
        assert isinstance(store, EtcdStore)
        counts = {}
        for table, part in (
            ("tenants", "tenants/"),
            ("resources", "res/"),
            ("signing_keys", "keys/"),
            ("changes", "changes/"),
        ):
            counts[table] = len(store._run(store._range(store._root + part)))
        return counts


@asynccontextmanager
async def control_plane(
    tmp: Path, *, max_changes: int = DEFAULT_MAX_CHANGES, **settings: Any
) -> AsyncIterator[Plane]:
    store = open_store(tmp, max_changes)
    settings.setdefault("sync_token", SYNC_TOKEN)
    settings.setdefault("bootstrap_secret", BOOTSTRAP_SECRET)
    control = ControlPlane(store, Settings(**settings))
    if ETCD_ENDPOINT is not None:  # as felix-controlplane --store etcd wires it
        from felix_controlplane.store_etcd import EtcdStore

        assert isinstance(store, EtcdStore)
        loop = asyncio.get_running_loop()
        store.add_change_listener(lambda: loop.call_soon_threadsafe(control.changed_elsewhere))
    public = HttpServer(control.handle)
    admin = HttpServer(control.handle_admin)
    await public.start("127.0.0.1", 0)
    await admin.start("127.0.0.1", 0)
    try:
        yield Plane(
            control,
            store,
            f"http://127.0.0.1:{public.port}",
            f"http://127.0.0.1:{admin.port}",
        )
    finally:
        await public.close()
        await admin.close()
        await control.close()
        store.close()


@dataclass
class FakeIdp:
    """An OIDC provider: an ES256 key pair, its JWKS served over loopback HTTP."""

    issuer: str
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    kid: str = "idp-key-1"
    url: str = ""
    fetches: int = 0

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key()))
        jwk.update(kid=self.kid, alg="ES256", use="sig")
        return {"keys": [jwk]}

    async def handle(self, request: Request) -> Response:
        self.fetches += 1
        return Response(200, self.jwks())

    def provider(self, name: str = "idp") -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "audience": IDP_AUDIENCE,
            "jwks_url": f"{self.url}/jwks.json",
            "algorithms": ["ES256"],
        }

    def token(self, sub: str, *, groups: list[str] | None = None, **claims: Any) -> str:
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "aud": IDP_AUDIENCE,
            "sub": sub,
            "iat": now,
            "exp": now + 300,
        }
        if groups is not None:
            body["groups"] = groups
        body.update(claims)
        return jwt.encode(body, self.key, algorithm="ES256", headers={"kid": self.kid})

    def subject(self, sub: str) -> str:
        return f"{self.issuer}#{sub}"


@asynccontextmanager
async def fake_idp(issuer: str = "https://idp.test") -> AsyncIterator[FakeIdp]:
    idp = FakeIdp(issuer)
    server = HttpServer(idp.handle)
    await server.start("127.0.0.1", 0)
    idp.url = f"http://127.0.0.1:{server.port}"
    try:
        yield idp
    finally:
        await server.close()


async def setup_tenant(plane: Plane, idp: FakeIdp, tenant: str, *, namespace: str = "ns") -> str:
    """Bootstrap ``tenant`` with ``idp`` configured and namespace ``namespace``; admin token."""
    answer = await plane.bootstrap(tenant, identity_provider={"name": "idp", **idp.provider()})
    admin = str(answer["admin_token"])
    status, body = await call(
        "POST", plane.t(tenant, "/namespaces"), token=admin, body={"name": namespace}
    )
    assert status == 201, body
    return admin


__all__ = [
    "BOOTSTRAP_SECRET",
    "IDP_AUDIENCE",
    "SYNC_TOKEN",
    "FakeIdp",
    "Plane",
    "call",
    "control_plane",
    "fake_idp",
    "setup_tenant",
]


@dataclass
class Stack:
    plane: Plane
    idp: FakeIdp
    broker: Broker
    catalog: LiveCatalog
    verifier: TenantJwksVerifier
    admins: dict[str, str]
    changes: list[CatalogChange] = field(default_factory=list)

    async def synced(self) -> None:
        """Wait until the broker's catalog has every change the control plane has."""
        head = self.plane.store.changes_since(0, 1_000_000).seq
        await self.catalog.wait_for_seq(head, timeout=5)

    async def stream(self, tenant: str, name: str, ns: str = "ns") -> None:
        status, body = await call(
            "POST",
            self.plane.t(tenant, f"/namespaces/{ns}/streams"),
            token=self.admins[tenant],
            body={"name": name},
        )
        assert status == 201, body

    async def cache(self, tenant: str, name: str, ns: str = "ns") -> None:
        status, body = await call(
            "POST",
            self.plane.t(tenant, f"/namespaces/{ns}/caches"),
            token=self.admins[tenant],
            body={"name": name},
        )
        assert status == 201, body

    async def policy(self, tenant: str, name: str, perms: list[str], sub: str) -> None:
        admin = self.admins[tenant]
        if perms:
            status, _ = await call(
                "PUT",
                self.plane.t(tenant, f"/policies/{name}"),
                token=admin,
                body={"permissions": perms},
            )
            assert status in (200, 201)
            status, _ = await call(
                "PUT",
                self.plane.t(tenant, f"/assignments/{name}"),
                token=admin,
                body={"policy": name, "subjects": [self.idp.subject(sub)]},
            )
            assert status in (200, 201)
        else:
            status, _ = await call(
                "DELETE", self.plane.t(tenant, f"/assignments/{name}"), token=admin
            )
            assert status == 204

    async def exchange(self, tenant: str, sub: str) -> tuple[int, Any]:
        return await call(
            "POST", self.plane.t(tenant, "/token/exchange"), token=self.idp.token(sub)
        )

    async def token(self, tenant: str, sub: str) -> str:
        status, body = await self.exchange(tenant, sub)
        assert status == 200, body
        return str(body["token"])

    def mint(self, tenant: str, signer: str | None = None, **claims: Any) -> str:
        """A token signed with ``signer``'s (default ``tenant``'s) real key, claims overridable."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": "felix-auth",
            "aud": "felix-broker",
            "sub": "tester",
            "tid": tenant,
            "perms": [f"stream.publish:stream:{tenant}/*", f"stream.subscribe:stream:{tenant}/*"],
            "iat": now,
            "nbf": now,
            "exp": now + 300,
        }
        body.update(claims)
        return self.plane.control.keys.sign(signer or tenant, body, now)

    def offset(self, tenant: str, name: str, ns: str = "ns") -> int:
        """How many records the broker holds for the stream (0: nothing written)."""
        assert self.broker.engine is not None
        spec = self.catalog.stream(tenant, ns, name)
        assert spec is not None
        return self.broker.engine.shard(spec, 0).next_offset


@asynccontextmanager
async def stack(tmp: Path, tenants: tuple[str, ...] = ("acme", "beta")) -> AsyncIterator[Stack]:
    async with control_plane(tmp) as plane, fake_idp() as idp:
        admins = {t: await setup_tenant(plane, idp, t) for t in tenants}
        catalog = LiveCatalog(plane.url, sync_token=SYNC_TOKEN, poll_wait_seconds=5)
        verifier = TenantJwksVerifier(
            plane.url, min_refetch_seconds=0.2, known_tenant=catalog.tenant_exists
        )
        changes: list[CatalogChange] = []
        catalog.add_listener(changes.append)
        catalog.add_listener(verifier.on_catalog_change)
        await catalog.start()
        await verifier.start(catalog.tenant_ids())
        settings = {
            "quic_bind": "127.0.0.1:0",
            "metrics_bind": "127.0.0.1:0",
            "data_dir": str(tmp / "broker"),
            "quic_impl": default_impl(),
        }
        config = dataclasses.replace(
            load_config(environ={}, overrides=settings),
            catalog=catalog,  # type: ignore[arg-type]
        )
        broker = Broker(config, verifier=verifier)  # type: ignore[arg-type]
        await broker.start()
        try:
            yield Stack(plane, idp, broker, catalog, verifier, admins, changes)
        finally:
            await broker.stop()
            await verifier.close()
            await catalog.close()


def publish(tenant: str, stream: str, payload: bytes, rid: int = 1, ns: str = "ns") -> Publish:
    return Publish(
        tenant_id=tenant,
        namespace=ns,
        stream=stream,
        payload=payload,
        request_id=rid,
        ack=AckMode.PER_MESSAGE,
    )


async def auth(client: WireClient, tok: str, tenant: str) -> tuple[Any, Any]:
    return await client.authed(tok=tok, tenant=tenant)
