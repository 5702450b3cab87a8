"""The control plane's HTTP API: catalog CRUD, validation, paging, admin checks, bootstrap."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from felix_broker.catalog.live import CatalogChange, LiveCatalog
from felix_common.tokens import DevIssuer
from felix_controlplane.store import SqliteStore
from tests.support.etcd import start_etcd

from . import support
from .support import BOOTSTRAP_SECRET, SYNC_TOKEN, call, control_plane

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["sqlite", "etcd"], autouse=True)
def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Every test here runs on both store backends."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    etcd = start_etcd(tmp_path / "etcd")
    support.ETCD_ENDPOINT = ("127.0.0.1", etcd.client_port)
    try:
        yield "etcd"
    finally:
        support.ETCD_ENDPOINT = None
        etcd.close()


async def test_stream_and_cache_lifecycle(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        ns = plane.t("acme", "/namespaces")
        assert (await call("POST", ns, token=admin, body={"name": "prod"}))[0] == 201
        assert (await call("POST", ns, token=admin, body={"name": "prod"}))[0] == 409
        streams = plane.t("acme", "/namespaces/prod/streams")
        definition = {
            "name": "orders",
            "shards": 4,
            "durability": "durable",
            "retention": {"max_age_ms": 60000, "max_bytes": 1048576},
            "consistency": "quorum",
            "routing": "jump_hash",
            "replication_factor": 3,
        }
        status, body = await call("POST", streams, token=admin, body=definition)
        assert status == 201 and body == definition
        status, body = await call("GET", f"{streams}/orders", token=admin)
        assert status == 200 and body == definition
        # Defaults: one shard, in memory, modulo routing, leader consistency.
        status, body = await call("POST", streams, token=admin, body={"name": "clicks"})
        assert (status, body["shards"], body["routing"], body["durability"]) == (
            201,
            1,
            "modulo",
            "memory",
        )
        caches = plane.t("acme", "/namespaces/prod/caches")
        assert (await call("POST", caches, token=admin, body={"name": "c", "shards": 2}))[0] == 201
        status, body = await call("GET", f"{caches}/c", token=admin)
        assert body == {"name": "c", "shards": 2, "consistency": "leader", "replication_factor": 1}
        assert (await call("DELETE", f"{streams}/clicks", token=admin))[0] == 204
        assert (await call("DELETE", f"{streams}/clicks", token=admin))[0] == 404
        assert (await call("GET", f"{streams}/clicks", token=admin))[0] == 404
        # A stream in a namespace that does not exist.
        status, body = await call(
            "POST", plane.t("acme", "/namespaces/nope/streams"), token=admin, body={"name": "x"}
        )
        assert status == 404


async def test_paged_lists(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        streams = plane.t("acme", "/namespaces/ns/streams")
        for i in range(5):
            assert (await call("POST", streams, token=admin, body={"name": f"s{i}"}))[0] == 201
        _, page = await call("GET", f"{streams}?limit=2", token=admin)
        assert [s["name"] for s in page["items"]] == ["s0", "s1"] and page["next"] == "s1"
        _, page = await call("GET", f"{streams}?limit=2&after=s1", token=admin)
        assert [s["name"] for s in page["items"]] == ["s2", "s3"]
        _, page = await call("GET", f"{streams}?limit=2&after=s3", token=admin)
        assert [s["name"] for s in page["items"]] == ["s4"] and page["next"] is None
        assert (await call("GET", f"{streams}?limit=0", token=admin))[0] == 400


@pytest.mark.parametrize(
    "definition",
    [
        {"name": "bad/name"},
        {"name": "s", "shards": 0},
        {"name": "s", "shards": 65537},
        {"name": "s", "shards": "2"},
        {"name": "s", "routing": "random"},
        {"name": "s", "durability": "eventual"},
        {"name": "s", "consistency": "strong"},
        {"name": "s", "retention": {"max_age_ms": -1}},
        {"name": "s", "retention": {"max_rows": 1}},
        {"name": "s", "colour": "blue"},
        ["not", "an", "object"],
    ],
)
async def test_invalid_stream_is_refused_and_nothing_stored(
    tmp_path: Path, definition: object
) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        before = plane.rows()
        status, body = await call(
            "POST", plane.t("acme", "/namespaces/ns/streams"), token=admin, body=definition
        )
        assert status == 400 and body["error"] == "invalid_definition", body
        assert plane.rows() == before


async def test_invalid_cache_and_bad_json_refused(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        before = plane.rows()
        caches = plane.t("acme", "/namespaces/ns/caches")
        assert (await call("POST", caches, token=admin, body={"name": "c", "shards": 0}))[0] == 400
        assert (await call("POST", caches, token=admin, body={"name": "c", "ttl": 1}))[0] == 400
        assert plane.rows() == before


async def test_admin_calls_need_a_controlplane_token_with_manage_rights(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        streams = plane.t("acme", "/namespaces/ns/streams")
        before = plane.rows()
        # No token, garbage, a token from an unrelated issuer key.
        assert (await call("POST", streams, body={"name": "s"}))[0] == 401
        assert (await call("POST", streams, token="x.y.z", body={"name": "s"}))[0] == 401
        stranger = DevIssuer.load_or_create(tmp_path).mint(
            "acme",
            subject="x",
            perms=["stream.manage:stream:acme/*"],
            audience="felix-controlplane",
        )
        assert (await call("POST", streams, token=stranger, body={"name": "s"}))[0] == 401
        assert plane.rows() == before


async def test_manage_permission_scope(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        keyring = plane.control.keys
        import time

        now = int(time.time())

        def token(perms: list[str], aud: str = "felix-controlplane") -> str:
            claims = {
                "iss": "felix-auth",
                "aud": aud,
                "sub": "u",
                "tid": "acme",
                "perms": perms,
                "iat": now,
                "nbf": now,
                "exp": now + 60,
            }
            return keyring.sign("acme", claims, now)

        streams = plane.t("acme", "/namespaces/ns/streams")
        only_orders = token(["stream.manage:stream:acme/ns/orders"])
        assert (await call("POST", streams, token=only_orders, body={"name": "orders"}))[0] == 201
        assert (await call("POST", streams, token=only_orders, body={"name": "other"}))[0] == 403
        # Listing needs the namespace-wide right; tenant settings need tenant-wide rights.
        assert (await call("GET", streams, token=only_orders))[0] == 403
        assert (await call("GET", plane.t("acme", "/policies"), token=only_orders))[0] == 403
        cache_token = token(["cache.manage:cache:acme/*"])
        assert (await call("POST", streams, token=cache_token, body={"name": "o2"}))[0] == 403
        # A broker-audience token is not a control-plane token.
        broker_token = token(["stream.manage:stream:acme/*"], aud="felix-broker")
        assert (await call("POST", streams, token=broker_token, body={"name": "o3"}))[0] == 401


async def test_bootstrap_needs_the_secret(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        url = f"{plane.admin_url}/v1/bootstrap"
        body = {"tenant": "acme", "admin": {"subjects": ["root"]}}
        assert (await call("POST", url, body=body))[0] == 401
        assert (await call("POST", url, token="wrong", body=body))[0] == 401
        assert plane.rows()["tenants"] == 0
        # The bootstrap path is not on the public listener.
        assert (await call("POST", f"{plane.url}/v1/bootstrap", token=BOOTSTRAP_SECRET, body=body))[
            0
        ] == 404
        status, answer = await call("POST", url, token=BOOTSTRAP_SECRET, body=body)
        assert status == 201 and answer["admin_token"]
        assert (await call("POST", url, token=BOOTSTRAP_SECRET, body=body))[0] == 409
        status, page = await call("GET", f"{plane.admin_url}/v1/tenants", token=BOOTSTRAP_SECRET)
        assert page["items"] == [{"name": "acme"}]


async def test_admin_listener_refuses_non_loopback_peers(tmp_path: Path) -> None:
    from felix_controlplane.http import Request

    async with control_plane(tmp_path) as plane:
        request = Request(
            "POST",
            "/v1/bootstrap",
            {},
            {"authorization": f"Bearer {BOOTSTRAP_SECRET}"},
            b'{"tenant": "acme"}',
            "192.0.2.7",
        )
        response = await plane.control.handle_admin(request)
        assert response.status == 403
        assert plane.rows()["tenants"] == 0


def test_cli_refuses_a_public_admin_bind() -> None:
    from felix_controlplane.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--admin-bind", "0.0.0.0:8901"])
    assert parse_args(["--admin-bind", "127.0.0.1:9"]).admin_bind == ("127.0.0.1", 9)


async def test_sync_feed_needs_the_sync_token_and_reports_changes(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        assert (await call("GET", f"{plane.url}/v1/catalog/snapshot"))[0] == 401
        assert (await call("GET", f"{plane.url}/v1/catalog/snapshot", token=admin))[0] == 401
        status, snap = await call("GET", f"{plane.url}/v1/catalog/snapshot", token=SYNC_TOKEN)
        assert status == 200 and snap["tenants"] == ["acme"]
        seq = snap["seq"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        await call(
            "POST", plane.t("acme", "/namespaces/ns/streams"), token=admin, body={"name": "s"}
        )
        await call("DELETE", plane.t("acme", "/namespaces/ns"), token=admin)
        _, page = await call("GET", f"{plane.url}/v1/catalog/changes?since={seq}", token=SYNC_TOKEN)
        assert [(c["op"], c["kind"], c["name"]) for c in page["changes"]] == [
            ("put", "namespace", "ns"),
            ("put", "stream", "s"),
            ("delete", "stream", "s"),
            ("delete", "namespace", "ns"),
        ]
        # A sequence number from the future (a replaced store) asks for a new snapshot.
        _, page = await call(
            "GET", f"{plane.url}/v1/catalog/changes?since={page['seq'] + 100}", token=SYNC_TOKEN
        )
        assert page["reset"] is True


async def test_the_change_log_keeps_its_newest_entries_and_resets_older_readers(
    tmp_path: Path,
) -> None:
    async with control_plane(tmp_path, max_changes=3) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        for name in ("a", "b", "c", "d"):
            await call(
                "POST", plane.t("acme", "/namespaces/ns/streams"), token=admin, body={"name": name}
            )
        assert plane.rows()["changes"] == 3  # the bound holds
        _, snap = await call("GET", f"{plane.url}/v1/catalog/snapshot", token=SYNC_TOKEN)
        head = snap["seq"]
        # The last three changes are still there for a reader just behind...
        _, page = await call(
            "GET", f"{plane.url}/v1/catalog/changes?since={head - 3}", token=SYNC_TOKEN
        )
        assert page["reset"] is False
        assert [c["name"] for c in page["changes"]] == ["b", "c", "d"]
        # ...one further behind is told to reload the snapshot.
        _, page = await call(
            "GET", f"{plane.url}/v1/catalog/changes?since={head - 4}", token=SYNC_TOKEN
        )
        assert page["reset"] is True and page["changes"] == []
        assert page["seq"] == head


def test_the_change_log_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SqliteStore(tmp_path / "cp.db", max_changes=0)


async def test_a_catalog_behind_the_kept_changes_reloads_the_snapshot(tmp_path: Path) -> None:
    async with control_plane(tmp_path, max_changes=2) as plane:
        admin = (await plane.bootstrap("acme"))["admin_token"]
        await call("POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "ns"})
        streams = plane.t("acme", "/namespaces/ns/streams")
        await call("POST", streams, token=admin, body={"name": "old"})
        catalog = LiveCatalog(plane.url, sync_token=SYNC_TOKEN, poll_wait_seconds=1)
        seen: list[CatalogChange] = []
        catalog.add_listener(seen.append)
        await catalog.start()
        assert catalog.stream("acme", "ns", "old") is not None
        # Stop following, let more changes happen than the log keeps, then follow
        # again from the old sequence number (what a broker cut off for a while does).
        await catalog.close()
        await call("DELETE", f"{streams}/old", token=admin)
        for name in ("x", "y", "z"):
            await call("POST", streams, token=admin, body={"name": name})
        _, snap = await call("GET", f"{plane.url}/v1/catalog/snapshot", token=SYNC_TOKEN)
        catalog._task = asyncio.get_running_loop().create_task(catalog._follow())
        try:
            await catalog.wait_for_seq(snap["seq"], timeout=10)
            assert catalog.stream("acme", "ns", "old") is None
            assert all(catalog.stream("acme", "ns", n) is not None for n in ("x", "y", "z"))
            # The broker learns what went away from the difference to the snapshot.
            assert CatalogChange("delete", "stream", "acme", "ns", "old") in seen
        finally:
            await catalog.close()
