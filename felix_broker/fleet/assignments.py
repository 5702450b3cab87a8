"""The assignment watcher: etcd's members, assignments and drains, as this broker's `FleetView`.

It reads the whole fleet prefix once (members and assignments at one revision
R), then watches from R + 1. Every change is applied by generation (the
assignment key's mod_revision): a change at or below the revision already
applied is dropped, so an event seen twice (a re-watch after a broken stream,
a read racing the watch) changes nothing. A watch that starts below etcd's
compaction point reads the prefix again. A broken watch (etcd away) resumes
from the last applied revision + 1, retrying with a bounded backoff.
"""

from __future__ import annotations

import asyncio
import logging

from felix_broker.fleet.routing import AssignmentState, Member, Route, ShardId
from felix_broker.fleet.view import FleetView
from felix_common.etcd import CompactedError, EtcdClient, EtcdUnavailableError, WatchEvent
from felix_common.fleet import (
    Assignment,
    Keyspace,
    RecordError,
    decode_assignment,
    decode_finalized_feature,
    decode_member,
)
from felix_common.fleet import Member as MemberRecord

__all__ = ["AssignmentWatcher", "member_of", "route_of"]

_log = logging.getLogger(__name__)


def member_of(record: MemberRecord) -> Member:
    return Member(
        node_id=record.node_id,
        client_addr=record.client_addr,
        peer_addr=record.peer_addr,
        features=frozenset(record.features),
        ops_addr=record.ops_addr or "",
    )


def route_of(record: Assignment, generation: int) -> Route:
    return Route(
        generation=generation,
        state=AssignmentState(str(record.state)),
        leader=record.leader,
        replicas=tuple(record.replicas),
        reason=record.reason,
        successor=record.successor,
    )


# Between attempts to watch again after etcd failed (doubling up to the cap).
_RETRY_FIRST_S = 0.05
_RETRY_CAP_S = 1.0


class AssignmentWatcher:
    """Keeps a `FleetView` up to date with etcd: one read, then one watch."""

    def __init__(self, client: EtcdClient, keys: Keyspace, view: FleetView) -> None:
        self._client = client
        self._keys = keys
        self._view = view
        self._root = keys.root
        self._task: asyncio.Task[None] | None = None
        self.reads = 0  # full reads of the prefix (the first, then after compaction)

    @property
    def view(self) -> FleetView:
        return self._view

    async def start(self) -> None:
        """Read the prefix (raises EtcdUnavailableError when etcd cannot be read),
        then watch in the background."""
        await self.catch_up()
        self._task = asyncio.create_task(self._run(), name="fleet-assignment-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def catch_up(self) -> None:
        """Read the whole prefix now and apply it: afterwards the view is at least as
        new as this read. A read older than what the watch applied changes nothing."""
        revision, kvs = await self._client.get_prefix(self._root)
        self.reads += 1
        view = self._view
        if revision <= view.revision:
            return
        snap = view.raw
        members: dict[str, Member] = {}
        routes: list[tuple[ShardId, Route]] = []
        finalized: list[str] = []
        drains: list[tuple[str, str]] = []
        for kv in kvs:
            try:
                if (node := self._drained(kv.key)) is not None:
                    drains.append((kv.key, node))
                elif kv.key.startswith(self._keys.members):
                    member = member_of(decode_member(kv.value))
                    members[member.node_id] = member
                elif kv.key.startswith(self._keys.assignments):
                    shard = self._keys.shard_of(kv.key)
                    routes.append((shard, route_of(decode_assignment(kv.value), kv.mod_revision)))
                elif kv.key.startswith(self._keys.features):
                    finalized.append(self._finalized(kv.key, kv.value))
            except RecordError as exc:
                _log.warning("ignoring %s in etcd: %s", kv.key, exc)
        for node_id in list(snap.members):
            if node_id not in members:
                snap = snap.without_member(node_id)
        for member in members.values():
            if snap.members.get(member.node_id) != member:
                snap = snap.with_member(member)
        snap = snap.with_routes(routes).with_finalized(finalized).with_drains(drains)
        present = {shard for shard, _ in routes}
        for shard in [s for s in snap.routes if s not in present]:
            snap = snap.without_route(shard, revision)  # deleted since the last read
        view.revision = revision
        view.update(snap)

    def apply(self, event: WatchEvent) -> None:
        """One watch event; an event at or below the applied revision is dropped."""
        view = self._view
        if event.mod_revision <= view.revision:
            return
        snap = view.raw
        keys = self._keys
        try:
            if (node := self._drained(event.key)) is not None:
                others = {d for d in snap.drains if d[0] != event.key}
                if event.kind != "delete":
                    others.add((event.key, node))
                snap = snap.with_drains(others)
            elif event.key.startswith(keys.members):
                if event.kind == "delete":
                    snap = snap.without_member(keys.node_of(event.key))
                else:
                    snap = snap.with_member(member_of(decode_member(event.value)))
            elif event.key.startswith(keys.assignments):
                shard = keys.shard_of(event.key)
                if event.kind == "delete":
                    snap = snap.without_route(shard, event.mod_revision)
                else:
                    route = route_of(decode_assignment(event.value), event.mod_revision)
                    snap = snap.with_routes([(shard, route)])
            elif event.key.startswith(keys.features) and event.kind != "delete":
                # Finalizing is one-way: a deleted key (an operator's hand) changes nothing.
                snap = snap.with_finalized([self._finalized(event.key, event.value)])
        except RecordError as exc:
            _log.warning("ignoring a change of %s in etcd: %s", event.key, exc)
        view.revision = event.mod_revision
        view.update(snap)

    def _drained(self, key: str) -> str | None:
        """The node a drain key (the operator's, or a broker's own request) drains."""
        keys = self._keys
        if key.startswith(keys.drains):
            try:
                return keys.drained_node_of(key)
            except RecordError:
                return None
        return keys.drain_requester_of(key)

    def _finalized(self, key: str, value: bytes) -> str:
        name = self._keys.feature_of(key)
        record = decode_finalized_feature(value)
        if record.name != name:
            raise RecordError(f"names feature {record.name!r} under the key of {name!r}")
        return name

    async def _run(self) -> None:
        delay = _RETRY_FIRST_S
        must_read = False
        while True:
            try:
                if must_read:
                    await self.catch_up()
                    must_read = False
                start = self._view.revision + 1
                async for event in self._client.watch_prefix(self._root, start):
                    delay = _RETRY_FIRST_S
                    self.apply(event)
            except CompactedError as exc:
                _log.info("assignment watch compacted (%s): reading the prefix again", exc)
                must_read = True
                continue
            except EtcdUnavailableError as exc:
                _log.debug("assignment watch broke: %s", exc)
            except Exception:  # the watch must outlive any one failure
                _log.exception("assignment watch failed")
                must_read = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_CAP_S)
