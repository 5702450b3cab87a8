"""The Store interface, the same assertions on both backends: SQLite and etcd."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from felix_common.etcd_process import EtcdProcess
from felix_controlplane.store import (
    ConflictError,
    NotFoundError,
    ResourceKey,
    SqliteStore,
    Store,
    StoredKey,
    StoreUnavailableError,
)
from felix_controlplane.store_etcd import EtcdStore
from tests.support.etcd import start_etcd

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["sqlite", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, object]]:
    if request.param == "sqlite":
        yield "sqlite", tmp_path / "cp.db"
        return
    etcd = start_etcd(tmp_path / "etcd")
    try:
        yield "etcd", etcd
    finally:
        etcd.close()


def open_store(backend: tuple[str, object], *, max_changes: int = 100) -> Store:
    kind, where = backend
    if kind == "sqlite":
        assert isinstance(where, Path)
        return SqliteStore(where, max_changes=max_changes)
    assert isinstance(where, EtcdProcess)
    return EtcdStore([("127.0.0.1", where.client_port)], max_changes=max_changes)


def ns(tenant: str, name: str) -> ResourceKey:
    return ResourceKey(tenant, "namespace", "", name)


def stream(tenant: str, namespace: str, name: str) -> ResourceKey:
    return ResourceKey(tenant, "stream", namespace, name)


def test_tenants_resources_and_the_change_log(backend: tuple[str, object]) -> None:
    store = open_store(backend)
    try:
        store.create_tenant("t1", 10)
        with pytest.raises(ConflictError):
            store.create_tenant("t1", 11)
        assert store.tenant_exists("t1") and not store.tenant_exists("t2")
        with pytest.raises(NotFoundError):
            store.create(stream("t1", "ns", "s"), {"name": "s"})  # no namespace yet
        store.create(ns("t1", "ns"), {"name": "ns"})
        store.create(stream("t1", "ns", "b"), {"name": "b", "shards": 2})
        store.create(stream("t1", "ns", "a"), {"name": "a"})
        with pytest.raises(ConflictError):
            store.create(stream("t1", "ns", "a"), {"name": "a"})
        assert store.replace(ResourceKey("t1", "policy", "", "p"), {"name": "p"}) is True
        assert store.replace(ResourceKey("t1", "policy", "", "p"), {"name": "p", "v": 2}) is False
        assert store.get(ResourceKey("t1", "policy", "", "p")) == {"name": "p", "v": 2}
        names = [r["name"] for r in store.list_resources("t1", "stream", "ns", "", 10)]
        assert names == ["a", "b"]
        assert [r["name"] for r in store.list_resources("t1", "stream", "ns", "a", 10)] == ["b"]
        assert [r["name"] for r in store.list_resources("t1", "stream", "ns", "", 1)] == ["a"]
        page = store.changes_since(0, 100)
        assert [(c.op, c.kind, c.name) for c in page.changes] == [
            ("put", "tenant", "t1"),
            ("put", "namespace", "ns"),
            ("put", "stream", "b"),
            ("put", "stream", "a"),
        ]  # the policy is no catalog change
        assert [c.seq for c in page.changes] == [1, 2, 3, 4] and page.seq == 4
        assert store.changes_since(2, 1).seq == 3  # a page ends at its last change
        assert store.changes_since(99, 10).reset  # ahead of the store
        snap = store.snapshot()
        assert snap.seq == 4 and snap.tenants == ["t1"]
        assert [k.name for k, _ in snap.resources] == ["ns", "a", "b"]
        assert store.delete(ns("t1", "ns"))  # its streams go with it, each announced
        assert not store.delete(ns("t1", "ns"))
        tail = store.changes_since(4, 100).changes
        assert sorted((c.kind, c.name) for c in tail) == [
            ("namespace", "ns"),
            ("stream", "a"),
            ("stream", "b"),
        ]
        assert tail[-1].kind == "namespace"
        assert store.list_resources("t1", "stream", "ns", "", 10) == []
        store.create_tenant("t2", 12)
        assert store.list_tenants("", 10) == ["t1", "t2"] and store.count_tenants() == 2
        assert store.list_tenants("t1", 10) == ["t2"]
        assert store.delete_tenant("t1") and not store.delete_tenant("t1")
        assert store.get(ResourceKey("t1", "policy", "", "p")) is None
        assert store.list_tenants("", 10) == ["t2"]
    finally:
        store.close()


def test_signing_keys(backend: tuple[str, object]) -> None:
    store = open_store(backend)
    try:
        jwk = {"kty": "OKP", "kid": "k1"}
        with pytest.raises(NotFoundError):
            store.add_key("t", StoredKey("k1", b"pem1", jwk, 1), retire_others_at=None)
        store.create_tenant("t", 0)
        store.add_key("t", StoredKey("k1", b"pem1", jwk, 1), retire_others_at=None)
        store.add_key("t", StoredKey("k2", b"pem2", {"kid": "k2"}, 2), retire_others_at=5)
        keys = store.keys("t")
        assert [(k.kid, k.private_pem, k.retired_at, k.revoked) for k in keys] == [
            ("k1", b"pem1", 5, False),
            ("k2", b"pem2", None, False),
        ]
        assert store.revoke_key("t", "k2") and not store.revoke_key("t", "nope")
        assert store.keys("t")[1].revoked and store.keys("t")[1].retired_at == 2
        assert [c.kind for c in store.changes_since(1, 10).changes] == ["jwks"] * 3
    finally:
        store.close()


def test_the_change_log_keeps_its_newest_entries(backend: tuple[str, object]) -> None:
    store = open_store(backend, max_changes=3)
    try:
        store.create_tenant("t", 0)
        store.create(ns("t", "ns"), {"name": "ns"})
        for name in ("a", "b", "c"):
            store.create(stream("t", "ns", name), {"name": name})
        assert store.changes_since(0, 10).reset  # 1 and 2 were pruned
        assert [c.name for c in store.changes_since(2, 10).changes] == ["a", "b", "c"]
        assert store.changes_since(5, 10).changes == []
    finally:
        store.close()


def test_two_stores_over_one_database_are_interchangeable(backend: tuple[str, object]) -> None:
    """Writers racing through two instances: every write lands once, in one log."""
    first, second = open_store(backend), open_store(backend)
    try:
        first.create_tenant("t", 0)
        second.create(ns("t", "ns"), {"name": "ns"})
        errors: list[BaseException] = []

        def write(store: Store, prefix: str) -> None:
            try:
                for i in range(15):
                    store.create(stream("t", "ns", f"{prefix}{i:02d}"), {"name": f"{prefix}{i}"})
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=write, args=(first, "x")),
            threading.Thread(target=write, args=(second, "y")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        page = first.changes_since(0, 1000)
        assert [c.seq for c in page.changes] == list(range(1, 33))
        assert len(second.list_resources("t", "stream", "ns", "", 100)) == 30
        assert first.snapshot() == second.snapshot()
    finally:
        first.close()
        second.close()


async def test_an_unreachable_etcd_is_a_503_not_a_500(tmp_path: Path) -> None:
    from . import support

    etcd = start_etcd(tmp_path / "etcd")
    support.ETCD_ENDPOINT = ("127.0.0.1", etcd.client_port)
    try:
        async with support.control_plane(tmp_path) as plane:
            admin = (await plane.bootstrap("acme"))["admin_token"]
            etcd.stop()
            status, answer = await support.call(
                "POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "prod"}
            )
            assert (status, answer["error"]) == (503, "unavailable")
            etcd.start()
            for _ in range(50):  # the store's channel reconnects; the write then lands
                status, _ = await support.call(
                    "POST", plane.t("acme", "/namespaces"), token=admin, body={"name": "prod"}
                )
                if status != 503:
                    break
                await asyncio.sleep(0.1)
            assert status == 201
    finally:
        support.ETCD_ENDPOINT = None
        etcd.close()


async def test_a_long_poll_at_one_instance_wakes_for_a_write_through_another(
    tmp_path: Path,
) -> None:
    import time

    from . import support

    etcd = start_etcd(tmp_path / "etcd")
    support.ETCD_ENDPOINT = ("127.0.0.1", etcd.client_port)
    try:
        async with (
            support.control_plane(tmp_path / "a") as a,
            support.control_plane(tmp_path / "b") as b,
        ):
            admin = (await b.bootstrap("acme"))["admin_token"]
            status, page = await support.call(
                "GET", f"{a.url}/v1/catalog/changes?since=0", token=support.SYNC_TOKEN, body=None
            )
            assert status == 200
            head = page["seq"]
            started = time.monotonic()
            poll = asyncio.create_task(
                support.call(
                    "GET",
                    f"{a.url}/v1/catalog/changes?since={head}&wait=20",
                    token=support.SYNC_TOKEN,
                    body=None,
                )
            )
            await asyncio.sleep(0.3)
            created = await support.call(
                "POST", b.t("acme", "/namespaces"), token=admin, body={"name": "prod"}
            )
            assert created[0] == 201
            status, page = await poll
            assert status == 200 and [c["name"] for c in page["changes"]] == ["prod"]
            assert time.monotonic() - started < 10  # woken, not timed out
    finally:
        support.ETCD_ENDPOINT = None
        etcd.close()


def test_a_request_to_a_closed_etcd_store_fails_at_once(tmp_path: Path) -> None:
    """A request that reaches an etcd store after close() (an executor job of a control
    plane shutting down) ends with StoreUnavailableError at once; it used to wait out
    its bound (50 attempts of the timeout) on a loop that no longer ran, which held
    the executor's shutdown, and the test run, for minutes."""
    etcd = start_etcd(tmp_path / "etcd")
    try:
        store = EtcdStore([("127.0.0.1", etcd.client_port)], timeout_s=1.0)
        store.create_tenant("t1", 10)
        store.close()
        outcome: list[BaseException | None] = []

        def snapshot() -> None:
            try:
                store.snapshot()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        late = threading.Thread(target=snapshot)
        late.start()
        late.join(5)
        assert not late.is_alive(), "a request to a closed store is still waiting"
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError), outcome
    finally:
        etcd.close()


def test_a_request_racing_close_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that arrives while close() stops the store's loop (its tasks already
    cancelled, the loop not yet stopped) ends with StoreUnavailableError at once. It
    used to be scheduled on the loop, never ran, and waited out its bound (50 attempts
    of the timeout). The window is held open deterministically: the loop's own stop
    call starts the request and lets the loop stop only once the request has been
    scheduled or has already failed."""
    etcd = start_etcd(tmp_path / "etcd")
    try:
        store = EtcdStore([("127.0.0.1", etcd.client_port)], timeout_s=1.0)
        store.create_tenant("t1", 10)
        reached = threading.Event()  # the late request is on the loop's queue, or failed
        outcome: list[BaseException | None] = []
        real_schedule = asyncio.run_coroutine_threadsafe

        def schedule(
            coro: Coroutine[Any, Any, object], loop: asyncio.AbstractEventLoop
        ) -> concurrent.futures.Future[object]:
            future = real_schedule(coro, loop)
            if threading.current_thread() is late:
                reached.set()
            return future

        def request() -> None:
            try:
                store.tenant_exists("t1")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                reached.set()

        late = threading.Thread(target=request, daemon=True)
        loop = store._loop  # the window is between two steps of this loop
        real_stop = loop.stop

        def stop() -> None:
            late.start()
            assert reached.wait(5), "the late request neither ran nor failed"
            real_stop()

        monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", schedule)
        monkeypatch.setattr(loop, "stop", stop)
        store.close()
        late.join(5)
        assert not late.is_alive(), "a request that raced close() is still waiting"
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError), outcome
    finally:
        etcd.close()
