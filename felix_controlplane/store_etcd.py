"""The control plane's :class:`~felix_controlplane.store.Store` on etcd.

Several control-plane instances over one etcd are interchangeable: every one
reads and writes the same keys, and every mutation is one etcd transaction.
Under ``{prefix}/cp/``:

- ``tenants/{tenant}`` → ``{"created_at"}``;
- ``res/{tenant}/{kind}/{namespace}/{name}`` → the resource's JSON body;
- ``keys/{tenant}/{kid}`` → a signing key (the PEM base64-encoded);
- ``changes/{seq:020}`` → one change-log entry; ``seq`` → the newest sequence number;
- ``version`` → written by every mutation.

Mutations are optimistic: read ``version``, read what the mutation needs, then
commit the writes (the change-log entries and the pruning of entries past
``max_changes`` included) in one transaction that compares ``version``'s
mod_revision with the one read first. Any other mutation in between changes it,
and the mutation is planned again from fresh reads (bounded attempts), so the
store behaves as if mutations ran one at a time, like SQLite's single writer.
Reads are linearizable etcd reads; a snapshot and a change page each read at one
revision.

The interface is synchronous (the HTTP layer calls it from worker threads): the
store runs its etcd client on an event loop of its own, in a daemon thread.
etcd bounds the operations of one transaction (``--max-txn-ops``, 128 by
default): deleting a tenant writes one change per stream, cache and namespace it
had, so a deployment with large tenants raises that bound.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, unquote

from felix_common.etcd import (
    CompactedError,
    Compare,
    Delete,
    EtcdClient,
    EtcdUnavailableError,
    KeyValue,
    Put,
    prefix_end,
)
from felix_controlplane.store import (
    CATALOG_KINDS,
    DEFAULT_MAX_CHANGES,
    Change,
    ChangePage,
    ConflictError,
    NotFoundError,
    ResourceKey,
    Snapshot,
    StoredKey,
    StoreUnavailableError,
)

__all__ = ["EtcdStore", "StoreBusyError"]

_T = TypeVar("_T")
_NAMESPACED = frozenset({"stream", "cache"})
_ATTEMPTS = 50


class StoreBusyError(RuntimeError):
    """A mutation lost the race to other writers more times than the bound allows."""


def _q(part: str) -> str:
    return quote(part, safe="")


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


_Op = Put | Delete
# (op, kind, tenant, namespace, name, body) of one change-log entry
_ChangeRow = tuple[str, str, str, str, str, dict[str, Any] | None]
_Planned = tuple[_T, list[_Op], list[_ChangeRow]]


class EtcdStore:
    """:class:`Store` over etcd (see the module docs)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = "/felix",
        max_changes: int = DEFAULT_MAX_CHANGES,
        timeout_s: float = 5.0,
    ) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        if not prefix.startswith("/") or prefix.endswith("/"):
            raise ValueError(f"etcd prefix must start with '/' and not end with it: {prefix!r}")
        self._root = f"{prefix}/cp/"
        self._max_changes = max_changes
        self._timeout = timeout_s
        # `_closed` is set, and requests are scheduled, under `_gate`: no request reaches
        # the loop once close() has begun, and close() fails whatever is still `_pending`.
        self._gate = threading.Lock()
        self._closed = False
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="felix-etcd-store", daemon=True
        )
        self._thread.start()
        self._client = self._run(self._make_client(list(endpoints), timeout_s))
        self._listeners: list[Callable[[], None]] = []
        self._watch: concurrent.futures.Future[None] | None = None

    @staticmethod
    async def _make_client(endpoints: list[tuple[str, int]], timeout_s: float) -> EtcdClient:
        return EtcdClient(endpoints, timeout_s=timeout_s)

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        with self._gate:
            if self._closed:
                coro.close()
                raise StoreUnavailableError("the store is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._pending.add(future)
        try:
            return self._wait(future)
        finally:
            with self._gate:
                self._pending.discard(future)

    def _wait(self, future: concurrent.futures.Future[_T]) -> _T:
        try:
            return future.result(self._timeout * _ATTEMPTS)
        except concurrent.futures.CancelledError as exc:
            # close() ended the request (it cancels whatever still runs on the loop).
            raise StoreUnavailableError("the store closed while a request waited") from exc
        except EtcdUnavailableError as exc:
            raise StoreUnavailableError(str(exc)) from exc

    @staticmethod
    async def _cancel_the_rest() -> None:
        """Cancel every other task on the store's loop and wait for them: a caller
        blocked in `_run` then gets `StoreUnavailableError` at once instead of waiting
        out its bound on a loop that no longer runs."""
        me = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not me]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the store's own thread) whenever the change log advances,
        whichever instance wrote it: a long poll at one instance wakes for a write made
        through another."""
        self._listeners.append(listener)
        with self._gate:
            if self._watch is None and not self._closed:
                self._watch = asyncio.run_coroutine_threadsafe(self._watch_seq(), self._loop)

    async def _watch_seq(self) -> None:
        revision = 0
        delay = 0.05
        while True:
            try:
                if not revision:
                    revision, _ = await self._client.get_prefix(self._seq_key)
                async for event in self._client.watch_prefix(self._seq_key, revision + 1):
                    delay = 0.05
                    revision = max(revision, event.mod_revision)
                    if event.key == self._seq_key:
                        for listener in self._listeners:
                            listener()
            except CompactedError:
                revision = 0  # read again; the listeners check the log themselves
                for listener in self._listeners:
                    listener()
            except EtcdUnavailableError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- keys -----------------------------------------------------------------------

    def _tenant_key(self, tenant: str) -> str:
        return f"{self._root}tenants/{_q(tenant)}"

    def _res_key(self, key: ResourceKey) -> str:
        parts = (key.tenant, key.kind, key.namespace, key.name)
        return self._root + "res/" + "/".join(_q(p) for p in parts)

    def _res_prefix(
        self, tenant: str, kind: str | None = None, namespace: str | None = None
    ) -> str:
        out = f"{self._root}res/{_q(tenant)}/"
        if kind is not None:
            out += _q(kind) + "/"
            if namespace is not None:
                out += _q(namespace) + "/"
        return out

    def _res_of(self, key: str) -> ResourceKey:
        tenant, kind, namespace, name = (unquote(p) for p in key[len(self._root) + 4 :].split("/"))
        return ResourceKey(tenant, kind, namespace, name)

    def _signing_key(self, tenant: str, kid: str) -> str:
        return f"{self._root}keys/{_q(tenant)}/{_q(kid)}"

    def _change_key(self, seq: int) -> str:
        return f"{self._root}changes/{seq:020d}"

    @property
    def _seq_key(self) -> str:
        return self._root + "seq"

    @property
    def _version_key(self) -> str:
        return self._root + "version"

    # -- the mutation machinery -------------------------------------------------------

    async def _mutate(self, plan: Callable[[], Awaitable[_Planned[_T]]]) -> _T:
        client = self._client
        for attempt in range(_ATTEMPTS):
            version = await client.get(self._version_key)
            expected = 0 if version is None else version.mod_revision
            result, ops, changes = await plan()
            if changes:
                seq_kv = await client.get(self._seq_key)
                head = 0 if seq_kv is None else int(seq_kv.value)
                for op, kind, tenant, namespace, name, body in changes:
                    head += 1
                    entry = {
                        "op": op,
                        "kind": kind,
                        "tenant": tenant,
                        "namespace": namespace,
                        "name": name,
                        "body": body,
                    }
                    ops.append(Put(self._change_key(head), _json(entry)))
                ops.append(Put(self._seq_key, str(head).encode()))
                oldest_kept = head - self._max_changes + 1
                if oldest_kept > 1:
                    ops.append(Delete(self._change_key(0), self._change_key(oldest_kept)))
            ops.append(Put(self._version_key, b""))
            ok, _ = await client.txn(
                [Compare(self._version_key, "mod_revision", "==", expected)], ops
            )
            if ok:
                return result
            await asyncio.sleep(random.uniform(0, 0.005 * (attempt + 1)))
        raise StoreBusyError(f"a store write lost to other writers {_ATTEMPTS} times")

    async def _get_json(self, key: str) -> dict[str, Any] | None:
        kv = await self._client.get(key)
        return None if kv is None else dict(json.loads(kv.value))

    async def _range(self, prefix: str, *, after: str = "", limit: int = 0) -> list[KeyValue]:
        start = prefix + (_q(after) + "\0" if after else "")
        _, kvs = await self._client.get_range(start, prefix_end(prefix), limit=limit)
        return kvs

    async def _check_parents(self, key: ResourceKey) -> None:
        if await self._client.get(self._tenant_key(key.tenant)) is None:
            raise NotFoundError(f"tenant {key.tenant!r} does not exist")
        if key.kind in _NAMESPACED:
            namespace = ResourceKey(key.tenant, "namespace", "", key.namespace)
            if await self._client.get(self._res_key(namespace)) is None:
                raise NotFoundError(f"namespace {key.tenant}/{key.namespace} does not exist")

    # -- tenants ------------------------------------------------------------------------

    def create_tenant(self, tenant: str, now: int) -> None:
        async def plan() -> _Planned[None]:
            if await self._client.get(self._tenant_key(tenant)) is not None:
                raise ConflictError(f"tenant {tenant!r} exists")
            ops: list[_Op] = [Put(self._tenant_key(tenant), _json({"created_at": now}))]
            return None, ops, [("put", "tenant", tenant, "", tenant, {"name": tenant})]

        self._run(self._mutate(plan))

    def tenant_exists(self, tenant: str) -> bool:
        return self._run(self._client.get(self._tenant_key(tenant))) is not None

    def count_tenants(self) -> int:
        return len(self._run(self._range(self._root + "tenants/")))

    def list_tenants(self, after: str, limit: int) -> list[str]:
        prefix = self._root + "tenants/"
        kvs = self._run(self._range(prefix, after=after, limit=limit))
        return [unquote(kv.key[len(prefix) :]) for kv in kvs]

    def delete_tenant(self, tenant: str) -> bool:
        async def plan() -> _Planned[bool]:
            if await self._client.get(self._tenant_key(tenant)) is None:
                return False, [], []
            resources = [self._res_of(kv.key) for kv in await self._range(self._res_prefix(tenant))]
            gone = sorted(
                (r for r in resources if r.kind in CATALOG_KINDS),
                key=lambda r: (r.kind, r.namespace, r.name),
                reverse=True,
            )
            changes: list[_ChangeRow] = [
                ("delete", r.kind, tenant, r.namespace, r.name, None) for r in gone
            ]
            changes.append(("delete", "tenant", tenant, "", tenant, None))
            res, keys = self._res_prefix(tenant), f"{self._root}keys/{_q(tenant)}/"
            ops: list[_Op] = [
                Delete(res, prefix_end(res)),
                Delete(keys, prefix_end(keys)),
                Delete(self._tenant_key(tenant)),
            ]
            return True, ops, changes

        return self._run(self._mutate(plan))

    # -- resources ----------------------------------------------------------------------

    def create(self, key: ResourceKey, body: dict[str, Any]) -> None:
        async def plan() -> _Planned[None]:
            await self._check_parents(key)
            if await self._client.get(self._res_key(key)) is not None:
                raise ConflictError(f"{key.kind} {key.name!r} exists")
            changes: list[_ChangeRow] = []
            if key.kind in CATALOG_KINDS:
                changes.append(("put", key.kind, key.tenant, key.namespace, key.name, body))
            return None, [Put(self._res_key(key), _json(body))], changes

        self._run(self._mutate(plan))

    def replace(self, key: ResourceKey, body: dict[str, Any]) -> bool:
        async def plan() -> _Planned[bool]:
            await self._check_parents(key)
            created = await self._client.get(self._res_key(key)) is None
            changes: list[_ChangeRow] = []
            if key.kind in CATALOG_KINDS:
                changes.append(("put", key.kind, key.tenant, key.namespace, key.name, body))
            return created, [Put(self._res_key(key), _json(body))], changes

        return self._run(self._mutate(plan))

    def get(self, key: ResourceKey) -> dict[str, Any] | None:
        return self._run(self._get_json(self._res_key(key)))

    def list_resources(
        self, tenant: str, kind: str, namespace: str, after: str, limit: int
    ) -> list[dict[str, Any]]:
        prefix = self._res_prefix(tenant, kind, namespace)
        kvs = self._run(self._range(prefix, after=after, limit=limit))
        return [dict(json.loads(kv.value)) for kv in kvs]

    def delete(self, key: ResourceKey) -> bool:
        async def plan() -> _Planned[bool]:
            if await self._client.get(self._res_key(key)) is None:
                return False, [], []
            ops: list[_Op] = [Delete(self._res_key(key))]
            changes: list[_ChangeRow] = []
            if key.kind == "namespace":
                # The namespace's streams and caches go with it, each announced.
                for kind in ("stream", "cache"):
                    inner = self._res_prefix(key.tenant, kind, key.name)
                    for kv in await self._range(inner):
                        gone = self._res_of(kv.key)
                        changes.append(("delete", kind, key.tenant, key.name, gone.name, None))
                    ops.append(Delete(inner, prefix_end(inner)))
            if key.kind in CATALOG_KINDS:
                changes.append(("delete", key.kind, key.tenant, key.namespace, key.name, None))
            return True, ops, changes

        return self._run(self._mutate(plan))

    # -- signing keys -------------------------------------------------------------------

    @staticmethod
    def _key_of(value: bytes) -> StoredKey:
        raw = json.loads(value)
        return StoredKey(
            kid=str(raw["kid"]),
            private_pem=base64.b64decode(raw["private_pem"]),
            public_jwk=dict(raw["public_jwk"]),
            created_at=int(raw["created_at"]),
            retired_at=None if raw["retired_at"] is None else int(raw["retired_at"]),
            revoked=bool(raw["revoked"]),
        )

    @staticmethod
    def _key_json(key: StoredKey) -> bytes:
        return _json(
            {
                "kid": key.kid,
                "private_pem": base64.b64encode(key.private_pem).decode(),
                "public_jwk": key.public_jwk,
                "created_at": key.created_at,
                "retired_at": key.retired_at,
                "revoked": key.revoked,
            }
        )

    def add_key(self, tenant: str, key: StoredKey, *, retire_others_at: int | None) -> None:
        async def plan() -> _Planned[None]:
            if await self._client.get(self._tenant_key(tenant)) is None:
                raise NotFoundError(f"tenant {tenant!r} does not exist")
            ops: list[_Op] = []
            if retire_others_at is not None:
                for kv in await self._range(f"{self._root}keys/{_q(tenant)}/"):
                    other = self._key_of(kv.value)
                    if other.retired_at is None:
                        retired = StoredKey(
                            other.kid,
                            other.private_pem,
                            other.public_jwk,
                            other.created_at,
                            retire_others_at,
                            other.revoked,
                        )
                        ops.append(Put(kv.key, self._key_json(retired)))
            fresh = StoredKey(key.kid, key.private_pem, key.public_jwk, key.created_at)
            ops.append(Put(self._signing_key(tenant, key.kid), self._key_json(fresh)))
            return None, ops, [("put", "jwks", tenant, "", key.kid, None)]

        self._run(self._mutate(plan))

    def keys(self, tenant: str) -> list[StoredKey]:
        kvs = self._run(self._range(f"{self._root}keys/{_q(tenant)}/"))
        return sorted((self._key_of(kv.value) for kv in kvs), key=lambda k: (k.created_at, k.kid))

    def revoke_key(self, tenant: str, kid: str) -> bool:
        async def plan() -> _Planned[bool]:
            kv = await self._client.get(self._signing_key(tenant, kid))
            if kv is None:
                return False, [], []
            old = self._key_of(kv.value)
            retired = old.retired_at if old.retired_at is not None else old.created_at
            revoked = StoredKey(
                old.kid, old.private_pem, old.public_jwk, old.created_at, retired, True
            )
            ops: list[_Op] = [Put(kv.key, self._key_json(revoked))]
            return True, ops, [("delete", "jwks", tenant, "", kid, None)]

        return self._run(self._mutate(plan))

    # -- change log -----------------------------------------------------------------------

    async def _head(self) -> tuple[int, int]:
        """The newest sequence number and the revision it was read at."""
        revision, kvs = await self._client.get_prefix(self._seq_key)
        seq = next((int(kv.value) for kv in kvs if kv.key == self._seq_key), 0)
        return seq, revision

    def changes_since(self, seq: int, limit: int) -> ChangePage:
        async def read() -> ChangePage:
            head, revision = await self._head()
            if seq > head:
                return ChangePage(seq=head, changes=[], reset=True)
            end = prefix_end(self._root + "changes/")
            _, oldest = await self._client.get_range(
                self._change_key(0), end, limit=1, revision=revision
            )
            first = int(oldest[0].key.rsplit("/", 1)[1]) if oldest else None
            if seq < head and (first is None or first > seq + 1):
                return ChangePage(seq=head, changes=[], reset=True)  # pruned past seq
            _, kvs = await self._client.get_range(
                self._change_key(seq + 1), end, limit=limit, revision=revision
            )
            changes: list[Change] = []
            for kv in kvs:
                raw = json.loads(kv.value)
                changes.append(
                    Change(
                        seq=int(kv.key.rsplit("/", 1)[1]),
                        op=str(raw["op"]),
                        kind=str(raw["kind"]),
                        tenant=str(raw["tenant"]),
                        namespace=str(raw["namespace"]),
                        name=str(raw["name"]),
                        body=None if raw["body"] is None else dict(raw["body"]),
                    )
                )
            last = changes[-1].seq if len(changes) == limit else head
            return ChangePage(seq=last, changes=changes, reset=False)

        return self._run(read())

    def snapshot(self) -> Snapshot:
        async def read() -> Snapshot:
            head, revision = await self._head()
            tenants_prefix = self._root + "tenants/"
            _, tenant_kvs = await self._client.get_range(
                tenants_prefix, prefix_end(tenants_prefix), revision=revision
            )
            res_prefix = self._root + "res/"
            _, res_kvs = await self._client.get_range(
                res_prefix, prefix_end(res_prefix), revision=revision
            )
            tenants = sorted(unquote(kv.key[len(tenants_prefix) :]) for kv in tenant_kvs)
            resources = [
                (self._res_of(kv.key), dict(json.loads(kv.value)))
                for kv in res_kvs
                if self._res_of(kv.key).kind in CATALOG_KINDS
            ]
            resources.sort(key=lambda item: (item[0].tenant, item[0].kind, item[0].name))
            return Snapshot(seq=head, tenants=tenants, resources=resources)

        return self._run(read())

    def close(self) -> None:
        with self._gate:
            if self._closed:
                return
            self._closed = True  # from here on `_run` fails at once
        if self._watch is not None:
            self._watch.cancel()
        with contextlib.suppress(StoreUnavailableError, TimeoutError):
            self._wait(asyncio.run_coroutine_threadsafe(self._cancel_the_rest(), self._loop))
            self._wait(asyncio.run_coroutine_threadsafe(self._client.close(), self._loop))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self._timeout)
        # A request scheduled before the flag whose task never ran (the loop stopped
        # first) would otherwise wait out its bound: end it now.
        with self._gate:
            pending, self._pending = self._pending, set()
        for future in pending:
            future.cancel()
