"""A broker's membership: its record under its own etcd lease, kept alive as its heartbeat.

`Membership.start()` registers ``P/members/{node_id}`` in one transaction that
creates the key (``create_revision == 0``) under a fresh lease. Its incarnation
is one past the etcd revision read just before: every registration of a node
(in this process or a later one) carries a larger incarnation than the last,
since that one's write is at or below the revision read. A key still held by an
earlier lease of the same node (a restart faster than the TTL) is waited out,
bounded by the TTL.

The keepalive runs every third of the TTL. The lease is judged lost, and the
`FleetView` fenced at once (every shard led here stops being served), when

- etcd answers a keepalive with TTL 0 (it expired the lease), or
- no keepalive has succeeded for TTL − ε since the last successful one was
  *sent* (ε = TTL/4), measured on a suspend-aware clock.

Since etcd counts the TTL from when it *received* that keepalive, the broker
stops serving before etcd can expire the lease and the placer can hand its
shards to another broker. Once etcd answers again, the broker revokes the old
lease (if it still exists), registers with a new incarnation, reads the
assignments afresh (so it never serves from a view older than its new
registration), and only then serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

import msgspec

from felix_broker.fleet.view import FleetView
from felix_common.etcd import Compare, EtcdClient, EtcdUnavailableError, Put, lease_clock
from felix_common.fleet import Keyspace, Member, encode_record

__all__ = ["Membership", "NodeIdInUseError"]

_log = logging.getLogger(__name__)


class NodeIdInUseError(RuntimeError):
    """Another live broker is registered under this node id."""


class Membership:
    """Registers this broker and holds its lease; fences `view` while it is lost."""

    def __init__(
        self,
        client: EtcdClient,
        keys: Keyspace,
        record: Member,
        *,
        ttl_ms: int,
        view: FleetView,
        catch_up: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = lease_clock,
    ) -> None:
        if ttl_ms < 1000:
            raise ValueError(f"the node lease TTL must be at least 1000 ms, got {ttl_ms}")
        self._client = client
        self._keys = keys
        self._record = record
        self._ttl = ttl_ms / 1000
        self._ttl_s = math.ceil(self._ttl)  # etcd counts lease TTLs in whole seconds
        self._margin = self._ttl / 4
        self._interval = self._ttl / 3
        self._view = view
        self._catch_up = catch_up
        self._clock = clock
        self._lease = 0
        self._deadline = 0.0
        self._held = False
        self.incarnation = 0
        self.losses = 0  # how many times the lease was lost
        self._task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self._record.node_id

    @property
    def held(self) -> bool:
        """Whether this broker holds its lease and serves what it leads."""
        return self._held

    @property
    def lease_id(self) -> int:
        return self._lease

    async def start(self) -> None:
        """Register (waiting out an older lease of this node id, bounded by the TTL),
        then keep the lease alive in the background."""
        bound = self._clock() + self._ttl_s + self._ttl
        while True:
            try:
                if await self._register():
                    self._held = True
                    break
                failure: Exception | None = None
            except EtcdUnavailableError as exc:
                failure = exc
            if self._clock() > bound:
                if failure is not None:
                    raise failure
                raise NodeIdInUseError(
                    f"node id {self.node_id!r} is registered by another live broker"
                )
            await asyncio.sleep(self._interval / 2)
        self._task = asyncio.create_task(self._run(), name="fleet-membership")

    async def stop(self) -> None:
        """Stop the keepalive and revoke the lease: the placer sees this broker go now."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._held = False
        self._view.fence()
        if self._lease:
            with contextlib.suppress(EtcdUnavailableError):
                await self._client.revoke(self._lease)
            self._lease = 0

    async def _register(self) -> bool:
        """One registration attempt; False when the member key is held by a live lease."""
        client, keys = self._client, self._keys
        member_key = keys.member(self.node_id)
        revision, _ = await client.get_prefix(member_key)
        incarnation = revision + 1
        lease = await client.grant(self._ttl_s)
        sent = self._clock()
        record = msgspec.structs.replace(self._record, incarnation=incarnation)
        ok, _ = await client.txn(
            [Compare(member_key, "create_revision", "==", 0)],
            [Put(member_key, encode_record(record), lease)],
        )
        if not ok:
            with contextlib.suppress(EtcdUnavailableError):
                await client.revoke(lease)
            return False
        self._lease = lease
        self._deadline = sent + self._ttl - self._margin
        self.incarnation = incarnation
        _log.info("registered node %s, incarnation %d", self.node_id, incarnation)
        return True

    def _lose(self, why: str) -> None:
        if not self._held:
            return
        self._held = False
        self.losses += 1
        self._view.fence()
        _log.warning("node %s lost its lease (%s): serving nothing it leads", self.node_id, why)

    async def _run(self) -> None:
        while True:
            try:
                if self._held:
                    await self._keep_alive()
                else:
                    await self._rejoin()
            except Exception:  # the heartbeat must outlive any one failure
                _log.exception("node %s: membership step failed", self.node_id)
                self._lose("membership step failed")
                await asyncio.sleep(self._interval)

    async def _keep_alive(self) -> None:
        now = self._clock()
        if now >= self._deadline:
            self._lose("no keepalive answered within the TTL")
            return
        sent = now
        try:
            async with asyncio.timeout(max(0.01, self._deadline - sent)):
                remaining = await self._client.keepalive(self._lease)
        except (EtcdUnavailableError, TimeoutError) as exc:
            _log.debug("keepalive failed: %s", exc)
            # Try again soon, but never sleep past the deadline.
            await asyncio.sleep(max(0.0, min(self._interval / 2, self._deadline - self._clock())))
            return
        if remaining <= 0:
            self._lose("etcd expired the lease")
            return
        self._deadline = sent + self._ttl - self._margin
        await asyncio.sleep(max(0.0, sent + self._interval - self._clock()))

    async def _rejoin(self) -> None:
        try:
            if self._lease:
                # Our old key, if etcd still has it, goes with its lease.
                await self._client.revoke(self._lease)
                self._lease = 0
            if await self._register():
                # Serve again only from a view at least as new as the registration.
                await self._catch_up()
                self._held = True
                self._view.unfence()
                _log.info("node %s serves again", self.node_id)
                return
        except EtcdUnavailableError as exc:
            _log.debug("rejoin failed: %s", exc)
        await asyncio.sleep(self._interval)
