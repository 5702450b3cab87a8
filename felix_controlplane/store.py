"""The control plane's storage: the :class:`Store` interface and its SQLite implementation.

Everything the control plane keeps is one of four things:

* tenants;
* resources: JSON bodies addressed by ``(tenant, kind, namespace, name)`` —
  namespaces, streams and caches (the catalog) and policies, assignments and
  identity providers (tenant settings, ``namespace`` empty);
* per-tenant signing keys;
* the change log: every catalog mutation (and every change of a tenant's
  published keys) gets a sequence number, written in the same transaction as
  the mutation itself, so a broker that read a snapshot at sequence N and then
  every change after N has exactly the current catalog. Only the newest
  ``max_changes`` entries are kept; asking for older ones answers ``reset``,
  and the broker reloads the snapshot.

Another database only has to implement :class:`Store`. The methods are
synchronous and each one is a single transaction; the HTTP layer runs them in
a worker thread so the event loop never waits on the disk.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "CATALOG_KINDS",
    "DEFAULT_MAX_CHANGES",
    "Change",
    "ChangePage",
    "ConflictError",
    "NotFoundError",
    "ResourceKey",
    "Snapshot",
    "SqliteStore",
    "Store",
    "StoreUnavailableError",
    "StoredKey",
]

_log = logging.getLogger(__name__)

# Change-log entries kept (about 200 bytes each): a broker that falls further
# behind reloads the snapshot instead of replaying the log.
DEFAULT_MAX_CHANGES = 10_000

# Resource kinds brokers learn about through the change log.
CATALOG_KINDS = frozenset({"namespace", "stream", "cache"})
# Kinds that live inside a namespace; creating one needs the namespace.
_NAMESPACED = frozenset({"stream", "cache"})


class ConflictError(Exception):
    """The thing to create exists already."""


class StoreUnavailableError(Exception):
    """The database cannot be reached now (the etcd backend's etcd is down): try again."""


class NotFoundError(Exception):
    """The tenant or namespace a write needs does not exist."""


@dataclass(frozen=True, slots=True)
class ResourceKey:
    tenant: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class StoredKey:
    """One signing key of a tenant. ``retired_at`` set: no longer signs, still
    published until tokens it signed have expired; ``revoked``: withdrawn now."""

    kid: str
    private_pem: bytes
    public_jwk: dict[str, str]
    created_at: int
    retired_at: int | None = None
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the change log; ``kind`` is tenant, namespace, stream, cache or jwks."""

    seq: int
    op: str  # "put" | "delete"
    kind: str
    tenant: str
    namespace: str
    name: str
    body: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ChangePage:
    seq: int  # the newest sequence number the store has
    changes: list[Change]
    # True when the caller's sequence number is ahead of the store (a store that
    # was replaced): the caller must start again from a snapshot.
    reset: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int
    tenants: list[str]
    resources: list[tuple[ResourceKey, dict[str, Any]]]


class Store(Protocol):
    """What the control plane needs from a database."""

    def create_tenant(self, tenant: str, now: int) -> None: ...
    def tenant_exists(self, tenant: str) -> bool: ...
    def list_tenants(self, after: str, limit: int) -> list[str]: ...
    def delete_tenant(self, tenant: str) -> bool: ...
    def count_tenants(self) -> int: ...

    def create(self, key: ResourceKey, body: dict[str, Any]) -> None: ...
    def replace(self, key: ResourceKey, body: dict[str, Any]) -> bool: ...
    def get(self, key: ResourceKey) -> dict[str, Any] | None: ...
    def list_resources(
        self, tenant: str, kind: str, namespace: str, after: str, limit: int
    ) -> list[dict[str, Any]]: ...
    def delete(self, key: ResourceKey) -> bool: ...

    def add_key(self, tenant: str, key: StoredKey, *, retire_others_at: int | None) -> None: ...
    def keys(self, tenant: str) -> list[StoredKey]: ...
    def revoke_key(self, tenant: str, kid: str) -> bool: ...

    def changes_since(self, seq: int, limit: int) -> ChangePage: ...
    def snapshot(self) -> Snapshot: ...
    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS resources (
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, kind, namespace, name)
);
CREATE TABLE IF NOT EXISTS signing_keys (
    tenant TEXT NOT NULL,
    kid TEXT NOT NULL,
    private_pem BLOB NOT NULL,
    public_jwk TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    retired_at INTEGER,
    revoked INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, kid)
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL,
    kind TEXT NOT NULL,
    tenant TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT
);
"""


class SqliteStore:
    """:class:`Store` on one SQLite file (``":memory:"`` for tests)."""

    def __init__(self, path: Path | str, *, max_changes: int = DEFAULT_MAX_CHANGES) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        self._max_changes = max_changes
        # One connection shared by the worker threads, serialised by a lock:
        # SQLite allows one writer anyway, and every call is one short transaction.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        if str(path) != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _record(
        self,
        db: sqlite3.Connection,
        op: str,
        kind: str,
        tenant: str,
        namespace: str,
        name: str,
        body: dict[str, Any] | None,
    ) -> None:
        cursor = db.execute(
            "INSERT INTO changes (op, kind, tenant, namespace, name, body) VALUES (?,?,?,?,?,?)",
            (op, kind, tenant, namespace, name, None if body is None else json.dumps(body)),
        )
        # The log keeps the newest max_changes entries; a broker further behind
        # gets reset=True and reloads the snapshot (see changes_since).
        assert cursor.lastrowid is not None
        db.execute("DELETE FROM changes WHERE seq <= ?", (cursor.lastrowid - self._max_changes,))

    @staticmethod
    def _tenant_known(db: sqlite3.Connection, tenant: str) -> bool:
        row = db.execute("SELECT 1 FROM tenants WHERE name = ?", (tenant,)).fetchone()
        return row is not None

    # -- tenants ------------------------------------------------------------------

    def create_tenant(self, tenant: str, now: int) -> None:
        with self._tx() as db:
            if self._tenant_known(db, tenant):
                raise ConflictError(f"tenant {tenant!r} exists")
            db.execute("INSERT INTO tenants (name, created_at) VALUES (?, ?)", (tenant, now))
            self._record(db, "put", "tenant", tenant, "", tenant, {"name": tenant})

    def tenant_exists(self, tenant: str) -> bool:
        with self._lock:
            return self._tenant_known(self._db, tenant)

    def count_tenants(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM tenants").fetchone()
            return int(row[0])

    def list_tenants(self, after: str, limit: int) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name FROM tenants WHERE name > ? ORDER BY name LIMIT ?", (after, limit)
            ).fetchall()
        return [str(r[0]) for r in rows]

    def delete_tenant(self, tenant: str) -> bool:
        with self._tx() as db:
            if not self._tenant_known(db, tenant):
                return False
            # Brokers hear of every stream and cache going, so each ends its own
            # subscriptions without having to know what a tenant contained.
            rows = db.execute(
                "SELECT kind, namespace, name FROM resources WHERE tenant = ? AND kind IN "
                "('stream', 'cache', 'namespace') ORDER BY kind DESC",
                (tenant,),
            ).fetchall()
            for kind, namespace, name in rows:
                self._record(db, "delete", kind, tenant, namespace, name, None)
            db.execute("DELETE FROM resources WHERE tenant = ?", (tenant,))
            db.execute("DELETE FROM signing_keys WHERE tenant = ?", (tenant,))
            db.execute("DELETE FROM tenants WHERE name = ?", (tenant,))
            self._record(db, "delete", "tenant", tenant, "", tenant, None)
            return True

    # -- resources ----------------------------------------------------------------

    def _check_parents(self, db: sqlite3.Connection, key: ResourceKey) -> None:
        if not self._tenant_known(db, key.tenant):
            raise NotFoundError(f"tenant {key.tenant!r} does not exist")
        if key.kind in _NAMESPACED:
            row = db.execute(
                "SELECT 1 FROM resources WHERE tenant = ? AND kind = 'namespace' AND name = ?",
                (key.tenant, key.namespace),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"namespace {key.tenant}/{key.namespace} does not exist")

    def create(self, key: ResourceKey, body: dict[str, Any]) -> None:
        with self._tx() as db:
            self._check_parents(db, key)
            try:
                db.execute(
                    "INSERT INTO resources (tenant, kind, namespace, name, body) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (key.tenant, key.kind, key.namespace, key.name, json.dumps(body)),
                )
            except sqlite3.IntegrityError:
                raise ConflictError(f"{key.kind} {key.name!r} exists") from None
            if key.kind in CATALOG_KINDS:
                self._record(db, "put", key.kind, key.tenant, key.namespace, key.name, body)

    def replace(self, key: ResourceKey, body: dict[str, Any]) -> bool:
        with self._tx() as db:
            self._check_parents(db, key)
            existed = db.execute(
                "SELECT 1 FROM resources WHERE tenant=? AND kind=? AND namespace=? AND name=?",
                (key.tenant, key.kind, key.namespace, key.name),
            ).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO resources (tenant, kind, namespace, name, body) "
                "VALUES (?, ?, ?, ?, ?)",
                (key.tenant, key.kind, key.namespace, key.name, json.dumps(body)),
            )
            if key.kind in CATALOG_KINDS:
                self._record(db, "put", key.kind, key.tenant, key.namespace, key.name, body)
            return existed is None

    def get(self, key: ResourceKey) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT body FROM resources WHERE tenant=? AND kind=? AND namespace=? AND name=?",
                (key.tenant, key.kind, key.namespace, key.name),
            ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def list_resources(
        self, tenant: str, kind: str, namespace: str, after: str, limit: int
    ) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT body FROM resources WHERE tenant=? AND kind=? AND namespace=? AND name>? "
                "ORDER BY name LIMIT ?",
                (tenant, kind, namespace, after, limit),
            ).fetchall()
        return [dict(json.loads(r[0])) for r in rows]

    def delete(self, key: ResourceKey) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "DELETE FROM resources WHERE tenant=? AND kind=? AND namespace=? AND name=?",
                (key.tenant, key.kind, key.namespace, key.name),
            )
            if cur.rowcount == 0:
                return False
            if key.kind == "namespace":
                # The namespace's streams and caches go with it, each announced.
                rows = db.execute(
                    "SELECT kind, name FROM resources WHERE tenant=? AND namespace=? "
                    "AND kind IN ('stream', 'cache')",
                    (key.tenant, key.name),
                ).fetchall()
                for kind, name in rows:
                    self._record(db, "delete", kind, key.tenant, key.name, name, None)
                db.execute(
                    "DELETE FROM resources WHERE tenant=? AND namespace=? "
                    "AND kind IN ('stream', 'cache')",
                    (key.tenant, key.name),
                )
            if key.kind in CATALOG_KINDS:
                self._record(db, "delete", key.kind, key.tenant, key.namespace, key.name, None)
            return True

    # -- signing keys -------------------------------------------------------------

    def add_key(self, tenant: str, key: StoredKey, *, retire_others_at: int | None) -> None:
        with self._tx() as db:
            if not self._tenant_known(db, tenant):
                raise NotFoundError(f"tenant {tenant!r} does not exist")
            if retire_others_at is not None:
                db.execute(
                    "UPDATE signing_keys SET retired_at = ? WHERE tenant = ? "
                    "AND retired_at IS NULL",
                    (retire_others_at, tenant),
                )
            db.execute(
                "INSERT INTO signing_keys (tenant, kid, private_pem, public_jwk, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (tenant, key.kid, key.private_pem, json.dumps(key.public_jwk), key.created_at),
            )
            self._record(db, "put", "jwks", tenant, "", key.kid, None)

    def keys(self, tenant: str) -> list[StoredKey]:
        with self._lock:
            rows = self._db.execute(
                "SELECT kid, private_pem, public_jwk, created_at, retired_at, revoked "
                "FROM signing_keys WHERE tenant = ? ORDER BY created_at, kid",
                (tenant,),
            ).fetchall()
        return [
            StoredKey(
                kid=str(kid),
                private_pem=bytes(pem),
                public_jwk=dict(json.loads(jwk)),
                created_at=int(created),
                retired_at=None if retired is None else int(retired),
                revoked=bool(revoked),
            )
            for kid, pem, jwk, created, retired, revoked in rows
        ]

    def revoke_key(self, tenant: str, kid: str) -> bool:
        with self._tx() as db:
            cur = db.execute(
                "UPDATE signing_keys SET revoked = 1, "
                "retired_at = COALESCE(retired_at, created_at) WHERE tenant = ? AND kid = ?",
                (tenant, kid),
            )
            if cur.rowcount == 0:
                return False
            self._record(db, "delete", "jwks", tenant, "", kid, None)
            return True

    # -- change log ---------------------------------------------------------------

    def _head(self, db: sqlite3.Connection) -> int:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        return 0 if row is None else int(row[0])

    def changes_since(self, seq: int, limit: int) -> ChangePage:
        with self._lock:
            head = self._head(self._db)
            if seq > head:
                return ChangePage(seq=head, changes=[], reset=True)
            (oldest,) = self._db.execute("SELECT MIN(seq) FROM changes").fetchone()
            if seq < head and (oldest is None or oldest > seq + 1):
                # Changes after seq were pruned: only a new snapshot is complete.
                return ChangePage(seq=head, changes=[], reset=True)
            rows = self._db.execute(
                "SELECT seq, op, kind, tenant, namespace, name, body FROM changes "
                "WHERE seq > ? ORDER BY seq LIMIT ?",
                (seq, limit),
            ).fetchall()
        changes = [
            Change(
                seq=int(s),
                op=str(op),
                kind=str(kind),
                tenant=str(t),
                namespace=str(ns),
                name=str(name),
                body=None if body is None else dict(json.loads(body)),
            )
            for s, op, kind, t, ns, name, body in rows
        ]
        # With a page limit the caller continues from the last change it got.
        last = changes[-1].seq if len(changes) == limit else head
        return ChangePage(seq=last, changes=changes, reset=False)

    def snapshot(self) -> Snapshot:
        with self._tx() as db:  # one transaction: the seq matches the rows
            head = self._head(db)
            tenants = [str(r[0]) for r in db.execute("SELECT name FROM tenants ORDER BY name")]
            rows = db.execute(
                "SELECT tenant, kind, namespace, name, body FROM resources "
                "WHERE kind IN ('namespace', 'stream', 'cache') ORDER BY tenant, kind, name"
            ).fetchall()
        resources = [
            (ResourceKey(str(t), str(k), str(ns), str(n)), dict(json.loads(b)))
            for t, k, ns, n, b in rows
        ]
        return Snapshot(seq=head, tenants=tenants, resources=resources)

    def close(self) -> None:
        with self._lock:
            self._db.close()
