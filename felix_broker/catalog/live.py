"""The broker side of the control plane: a live catalog and a tenant JWKS verifier.

:class:`LiveCatalog` implements the broker's ``Catalog`` protocol (plus
``streams()``/``caches()`` like ``StaticCatalog``). ``start()`` loads
``GET /v1/catalog/snapshot``, then a background task long-polls
``GET /v1/catalog/changes?since=<seq>&wait=<s>`` and applies each change in
order, so a stream created through the API is served as soon as the poll
returns. Listeners added with :meth:`LiveCatalog.add_listener` hear every applied
change; a deleted stream is a ``CatalogChange(op="delete", kind="stream", ...)``,
the broker's cue to end that stream's subscriptions.

:class:`TenantJwksVerifier` has the ``verify(token, tenant_id) -> Principal``
interface of :class:`felix_common.tokens.TokenVerifier` and does the checks
with one: per tenant it fetches ``/v1/tenants/{t}/.well-known/jwks.json`` and
builds a ``TokenVerifier`` from it. ``verify`` is synchronous (the broker calls
it inside its protocol step), so it never waits on the network: a tenant whose
keys are not loaded yet, or a token naming an unknown ``kid``, is refused and
a refetch is started in the background, at most once per
``min_refetch_seconds`` per tenant. Keys are prefetched at ``start()`` and
whenever the change feed announces a key change (rotation, revocation) or a
new tenant, so in practice a rotated key is known before the first token
signed with it arrives. ``verify_async`` waits for the refetch instead, for a
caller that can await.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from felix_broker.catalog import CatalogTables
from felix_common import feed
from felix_common.catalog import is_name
from felix_common.http import BodyTooLarge, read_bounded
from felix_common.tokens import Principal, TokenVerifier, UnknownKeyIdError

__all__ = ["CatalogChange", "LiveCatalog", "SyncError", "TenantJwksVerifier"]

_log = logging.getLogger(__name__)

_MAX_BODY = 64 << 20


class SyncError(Exception):
    """The control plane could not be reached or answered something unusable."""


class _NotFound(SyncError):
    pass


@dataclass(frozen=True, slots=True)
class CatalogChange:
    """One applied change: ``kind`` tenant, namespace, stream, cache or jwks."""

    op: str  # "put" | "delete"
    kind: str
    tenant: str
    namespace: str
    name: str

    @property
    def is_deletion(self) -> bool:
        return self.op == "delete"


class _ControlPlaneClient:
    """GETs against the control plane over one aiohttp session (created on first use,
    on the running loop), each bounded in time and in the size of the answer."""

    def __init__(self, base_url: str, *, token: str | None, ca_file: str | None) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_file) if ca_file else True
        )
        self._session: aiohttp.ClientSession | None = None

    async def get(self, path: str, timeout: float) -> bytes:
        """The body of a 200 answer; raise :class:`SyncError` (``_NotFound`` on 404)."""
        url = self._base + path
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        try:
            async with self._session.get(
                url, ssl=self._ssl, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status == 404:
                    raise _NotFound(f"{url}: 404")
                if response.status != 200:
                    raise SyncError(f"{url}: HTTP {response.status}")
                return await read_bounded(response.content, _MAX_BODY)
        except (aiohttp.ClientError, TimeoutError, OSError, BodyTooLarge) as exc:
            raise SyncError(f"{url}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class LiveCatalog(CatalogTables):
    """A catalog kept in step with the control plane (snapshot, then changes)."""

    def __init__(
        self,
        base_url: str,
        *,
        sync_token: str,
        poll_wait_seconds: float = 10.0,
        retry_seconds: float = 1.0,
        max_retry_seconds: float = 30.0,
        ca_file: str | None = None,
    ) -> None:
        self._http = _ControlPlaneClient(base_url, token=sync_token, ca_file=ca_file)
        self._wait = poll_wait_seconds
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        super().__init__()  # the tables the snapshot and the changes fill
        self._listeners: list[Callable[[CatalogChange], None]] = []
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self._advanced = asyncio.Condition()

    # -- the Catalog protocol: CatalogTables; and what only a live catalog has -----------

    def tenant_ids(self) -> list[str]:
        return sorted(self._tenants)

    @property
    def seq(self) -> int:
        """The control plane sequence number this catalog reflects."""
        return self._seq

    # -- life cycle ---------------------------------------------------------------------

    def add_listener(self, listener: Callable[[CatalogChange], None]) -> None:
        """Call ``listener`` for every change applied after a snapshot (on the event loop)."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Load the snapshot (raises :class:`SyncError` if unreachable), then follow changes."""
        try:
            await self._load_snapshot(announce=False)
        except BaseException:
            await self._http.close()
            raise
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="catalog-sync")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._http.close()

    async def wait_for_seq(self, seq: int, timeout: float) -> None:
        """Wait until changes up to ``seq`` are applied (tests, readiness checks)."""
        async with asyncio.timeout(timeout), self._advanced:
            await self._advanced.wait_for(lambda: self._seq >= seq)

    # -- syncing ---------------------------------------------------------------------------

    async def _load_snapshot(self, *, announce: bool) -> None:
        raw = await self._http.get(feed.SNAPSHOT_PATH, timeout=30.0)
        try:
            snap = feed.decode_snapshot(raw)
        except feed.FeedError as exc:
            raise SyncError(str(exc)) from None
        before_streams, before_caches = set(self._streams), set(self._caches)
        self._tenants = {t for t in snap.tenants if is_name(t)}
        self._namespaces, self._streams, self._caches = set(), {}, {}
        for entry in snap.resources:
            self._put(entry.kind, entry.tenant, entry.namespace, entry.name, entry.body)
        if announce:
            # After a reset only the difference tells the broker what went away.
            for t, ns, name in before_streams - set(self._streams):
                self._announce(CatalogChange("delete", "stream", t, ns, name))
            for t, ns, name in before_caches - set(self._caches):
                self._announce(CatalogChange("delete", "cache", t, ns, name))
        await self._advance(snap.seq)
        _log.info(
            "catalog snapshot at seq %d: %d tenants, %d streams, %d caches",
            self._seq,
            len(self._tenants),
            len(self._streams),
            len(self._caches),
        )

    async def _advance(self, seq: int) -> None:
        async with self._advanced:
            self._seq = seq
            self._advanced.notify_all()

    async def _follow(self) -> None:
        delay = self._retry
        while True:
            try:
                raw = await self._http.get(
                    f"{feed.CHANGES_PATH}?since={self._seq}&wait={self._wait}",
                    timeout=self._wait + 10.0,
                )
                page = feed.decode_changes(raw)
                if page.reset:
                    _log.warning(
                        "control plane no longer has the changes after %d; reloading the snapshot",
                        self._seq,
                    )
                    await self._load_snapshot(announce=True)
                    continue
                for change in page.changes:
                    self._apply(change)
                await self._advance(max(self._seq, page.seq))
                delay = self._retry
            except asyncio.CancelledError:
                raise
            except (SyncError, feed.FeedError) as exc:
                # Keep serving the last known catalog; it is only stale, not wrong.
                _log.warning("catalog sync failed (retry in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry)

    def _put(self, kind: str, tenant: str, namespace: str, name: str, body: Any) -> None:
        named = {"tenant": (tenant,), "namespace": (tenant, name)}.get(
            kind, (tenant, namespace, name)
        )
        if not all(is_name(n) for n in named):
            # The catalogue's name rule: never a folder, a permission object or a
            # log path from a name that breaks it, whoever sent it.
            _log.error(
                "ignoring %s %s/%s/%s: a name breaks the rule", kind, tenant, namespace, name
            )
            return
        if kind == "tenant":
            self._tenants.add(tenant)
        elif kind == "namespace":
            self._namespaces.add((tenant, name))
        elif kind in ("stream", "cache"):
            try:
                if kind == "stream":
                    spec = feed.stream_spec(tenant, namespace, body)
                    self._streams[(tenant, namespace, name)] = spec
                else:
                    self._caches[(tenant, namespace, name)] = feed.cache_spec(
                        tenant, namespace, body
                    )
            except ValueError as exc:  # feed.InvalidDefinition or InvalidNameError
                # The control plane validated it; a mismatch means versions differ.
                _log.error("ignoring %s %s/%s/%s: %s", kind, tenant, namespace, name, exc)
                return
            self._namespaces.add((tenant, namespace))

    def _apply(self, change: feed.Change) -> None:
        op, kind = change.op, change.kind
        tenant, namespace, name = change.tenant, change.namespace, change.name
        if op == "put":
            self._put(kind, tenant, namespace, name, change.body)
        elif kind == "tenant":
            self._tenants.discard(tenant)
            self._namespaces = {n for n in self._namespaces if n[0] != tenant}
            self._streams = {k: v for k, v in self._streams.items() if k[0] != tenant}
            self._caches = {k: v for k, v in self._caches.items() if k[0] != tenant}
        elif kind == "namespace":
            self._namespaces.discard((tenant, name))
        elif kind == "stream":
            self._streams.pop((tenant, namespace, name), None)
        elif kind == "cache":
            self._caches.pop((tenant, namespace, name), None)
        _log.debug("catalog %s %s %s/%s/%s", op, kind, tenant, namespace, name)
        self._announce(CatalogChange(op, kind, tenant, namespace, name))

    def _announce(self, change: CatalogChange) -> None:
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                _log.exception("catalog listener failed on %s", change)


class TenantJwksVerifier:
    """Verifies Felix tokens with each tenant's JWKS from the control plane."""

    def __init__(
        self,
        base_url: str,
        *,
        min_refetch_seconds: float = 5.0,
        refresh_seconds: float = 300.0,
        timeout: float = 5.0,
        ca_file: str | None = None,
        known_tenant: Callable[[str], bool] | None = None,
    ) -> None:
        self._http = _ControlPlaneClient(base_url, token=None, ca_file=ca_file)
        self._min_refetch = min_refetch_seconds
        self._refresh_seconds = refresh_seconds
        self._timeout = timeout
        # Only tenants the catalog knows may cause a fetch: the tenant id comes
        # from an unauthenticated auth frame.
        self._known_tenant = known_tenant
        self._verifiers: dict[str, TokenVerifier] = {}
        self._last_fetch: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[bool]] = {}
        self._refresher: asyncio.Task[None] | None = None

    async def start(self, tenants: Iterable[str] = ()) -> None:
        """Fetch the given tenants' keys now, then refresh every ``refresh_seconds``."""
        await asyncio.gather(*(self.refresh(t, force=True) for t in tenants))
        self._refresher = asyncio.get_running_loop().create_task(
            self._refresh_loop(), name="jwks-refresh"
        )

    async def close(self) -> None:
        tasks: list[asyncio.Task[Any]] = list(self._inflight.values())
        if self._refresher is not None:
            tasks.append(self._refresher)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._refresher = None
        await self._http.close()

    def verify(self, token: str, tenant_id: str) -> Principal:
        """Check ``token`` for a client that named ``tenant_id``; raise a ``TokenError``."""
        verifier = self._verifiers.get(tenant_id)
        if verifier is None:
            self._schedule(tenant_id)
            raise UnknownKeyIdError(f"no signing keys known for tenant {tenant_id!r}")
        try:
            return verifier.verify(token, tenant_id)
        except UnknownKeyIdError:
            self._schedule(tenant_id)  # maybe a rotation we have not heard of yet
            raise

    async def verify_async(self, token: str, tenant_id: str) -> Principal:
        """Like :meth:`verify`, but on an unknown tenant or kid wait for the
        (rate-limited) refetch and try once more."""
        try:
            return self.verify(token, tenant_id)
        except UnknownKeyIdError:
            task = self._inflight.get(tenant_id)
            if task is None:
                raise
            await asyncio.shield(task)
            return self.verify(token, tenant_id)

    def on_catalog_change(self, change: CatalogChange) -> None:
        """A :class:`LiveCatalog` listener: follow key changes and tenants coming and going."""
        if change.kind == "jwks" or (change.kind == "tenant" and change.op == "put"):
            self._schedule(change.tenant, force=True)
        elif change.kind == "tenant" and change.op == "delete":
            self._verifiers.pop(change.tenant, None)
            self._last_fetch.pop(change.tenant, None)

    def _schedule(self, tenant: str, *, force: bool = False) -> None:
        if not is_name(tenant) or tenant in self._inflight:
            return
        if self._known_tenant is not None and not self._known_tenant(tenant) and not force:
            return
        if not force and time.monotonic() - self._last_fetch.get(tenant, -1e9) < self._min_refetch:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller): nothing can fetch in the background
        task = loop.create_task(self.refresh(tenant, force=True), name=f"jwks-{tenant}")
        self._inflight[tenant] = task
        task.add_done_callback(lambda _t: self._inflight.pop(tenant, None))

    async def refresh(self, tenant: str, *, force: bool = False) -> bool:
        """Fetch ``tenant``'s JWKS (rate-limited unless ``force``); True if keys are loaded."""
        now = time.monotonic()
        if not force and now - self._last_fetch.get(tenant, -1e9) < self._min_refetch:
            return tenant in self._verifiers
        self._last_fetch[tenant] = now
        try:
            raw = await self._http.get(feed.jwks_path(tenant), timeout=self._timeout)
            verifier = TokenVerifier(json.loads(raw))
        except _NotFound:
            self._verifiers.pop(tenant, None)
            _log.info("tenant %s has no JWKS (unknown to the control plane)", tenant)
            return False
        except (SyncError, ValueError) as exc:
            # Keep the keys we had: a control plane outage must not log everyone out.
            _log.warning("cannot refresh JWKS of tenant %s: %s", tenant, exc)
            return tenant in self._verifiers
        self._verifiers[tenant] = verifier
        _log.debug("loaded JWKS of tenant %s", tenant)
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_seconds)
            for tenant in list(self._verifiers):
                await self.refresh(tenant, force=True)
