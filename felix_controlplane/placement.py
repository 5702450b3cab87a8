"""Placement: which live broker leads each shard, written to etcd by one placer at a time.

Election: an instance becomes the placer by creating ``P/placer`` (its id, under
its own lease) in a transaction that compares ``create_revision == 0``. The key's
create revision is the holder's *token*. Every assignment write is one
transaction comparing

- the assignment key's ``mod_revision`` with the one this pass planned from
  (``create_revision == 0`` for a new key), and
- ``P/placer``'s ``create_revision`` with the token,

so a placer that lost its lease (or was replaced) can never write, and two
placers can never both win. The write's revision is the shard's new generation.

The rule (`plan`, a pure function of the catalog, the live members and the
current assignments):

- every shard of every catalog stream and cache gets an ``active`` leader among
  the live members, spread by count (at most ceil(shards / members) each,
  rendezvous hashing choosing among those under the cap);
- a shard with a replication factor N > 1 gets a replica set of N distinct live
  members, the leader first, the others those holding the fewest replicas
  (rendezvous order among equals), written in ``Assignment.replicas``; with
  fewer than N live members it waits ``unavailable/not_assigned``. A placed
  replica set is kept as it is (through the leader's loss and return);
- a replicated (Quorum) shard whose leader is gone, with a majority of its
  replica set live: a live replica is promoted (``active``, a new generation);
  the replica's core decides whether it is caught up (it refuses otherwise);
- a promotion refused (``P/progress/{replica}/refused/...`` at the assignment's
  own generation): a live replica the refusal names as ahead is promoted at a new
  generation; none live: ``unavailable/owner_unavailable`` with one of them as
  leader (it takes the shard back on return); a replica whose refusal stands is
  not promoted again;
- a shard whose leader is gone: an in-memory stream shard is re-placed at once;
  a durable one (durable streams, and caches, whose logs live on their broker)
  becomes ``unavailable/owner_unavailable`` with its leader kept, and turns
  ``active`` again when that broker returns; never served empty elsewhere;
- no live member at all: a new or re-placed shard is ``unavailable/not_assigned``;
- shards whose stream or cache left the catalog lose their assignment key;
- a planned move (`Placer.move`, `Placer.drain`) has two phases. The catch-up:
  the assignment stays ``active`` (leader kept) with its ``successor`` named,
  while the leader copies the shard to it. The fence: ``moving`` (same leader and
  successor), once the successor reports that copy under
  ``P/progress/{successor}/moves/...`` for exactly the catch-up's generation. It
  cuts over (``active``, leader = successor, a new generation) once the successor
  reports the copy for exactly the fence's generation. It is dropped (``active``
  under the old leader, no successor) when the successor leaves first, or when
  cancelled (`Placer.cancel`: ``cancel`` during the catch-up, ``retake`` after);
- at most ``max_moves`` copies are in progress at once across the fleet (catching
  up or fenced; 0: no cap): a drain starts that many, the rest of its shards wait
  (`Placer.queued`) and start as moves end; `Placer.move` past it is 409
  ``move_limit``;
- a broker with a ``P/drains/{node_id}`` key gets nothing new, and every shard
  it leads is moved to the member the rule picks among the others; the key is
  deleted once that broker leaves;
- a replicated (Quorum) shard is never copied: its truth is its replication log.
  A drain (or `Placer.move` to a member of its replica set) hands it to a live
  replica by promotion (``active``, a new generation, the replica set kept,
  drained broker included); with no majority live outside the drained brokers the
  drain leaves it where it is (logged); a move to a broker outside its replica set
  is 409 ``replicated``;
- a fence (`Placer.fence`: ``moving`` with the leader as its own successor)
  never cuts over: it lasts until cancelled.

A pass runs at once when a member comes or goes (a watch on the members), and
otherwise every `interval_s` (catalog changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from felix_common.etcd import (
    Compare,
    Delete,
    EtcdClient,
    EtcdRequestError,
    EtcdUnavailableError,
    Put,
    lease_clock,
)
from felix_common.feed import cache_spec, stream_spec
from felix_common.fleet import (
    Assignment,
    AssignmentState,
    Drain,
    Keyspace,
    PromotionRefusal,
    RecordError,
    ShardId,
    ShardKind,
    decode_assignment,
    decode_move_copied,
    decode_promotion_refusal,
    encode_record,
)
from felix_controlplane.fleet_api import DEFAULT_MAX_MOVES, MoveError
from felix_controlplane.store import Snapshot
from felix_wire.errors import DETAIL_REASONS, ErrorCode

__all__ = [
    "DEFAULT_MAX_MOVES",
    "Cancelled",
    "Held",
    "MoveError",
    "Placement",
    "Placer",
    "ShardSpec",
    "Write",
    "plan",
    "rendezvous",
    "shard_specs",
    "store_catalog",
]

_log = logging.getLogger(__name__)

OWNER_UNAVAILABLE = "owner_unavailable"
MOVING = AssignmentState.MOVING
NOT_ASSIGNED = "not_assigned"
assert {OWNER_UNAVAILABLE, NOT_ASSIGNED} <= set(DETAIL_REASONS[ErrorCode.SHARD_UNAVAILABLE])

_ACTIVE = AssignmentState.ACTIVE
_UNAVAILABLE = AssignmentState.UNAVAILABLE
_IN_A_MOVE = frozenset({AssignmentState.DRAINING, AssignmentState.MOVING})


def _record(
    state: AssignmentState,
    leader: str | None,
    reason: str | None = None,
    replicas: Sequence[str] = (),
) -> Assignment:
    return Assignment(state=state, leader=leader, replicas=list(replicas), reason=reason)


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard the catalog has, whether its data lives on its leader, and the size
    of its replica set (1: the leader alone, no replicas listed)."""

    shard: ShardId
    durable: bool
    replication_factor: int = 1
    replicated: bool = False  # Quorum with RF > 1: its replicas hold its log (promotable)


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A cancelled move: the generation the old leader serves at again, and whether
    the move was cancelled before its fence (``cancel``) or after (``retake``)."""

    generation: int
    outcome: str


@dataclass(frozen=True, slots=True)
class Held:
    """An assignment as etcd has it: the record and its key's mod_revision."""

    record: Assignment
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Write:
    """One planned change: `record` None deletes the key. `expected` is the key's
    mod_revision the plan was made from (0: the key must not exist)."""

    shard: ShardId
    record: Assignment | None
    expected: int


def rendezvous(shard: ShardId, node_id: str) -> int:
    """The weight of `node_id` for `shard` (highest wins): stable across placers."""
    text = f"{shard.kind.value}/{shard.tenant}/{shard.namespace}/{shard.name}/{shard.shard}"
    digest = hashlib.blake2b(f"{text}\0{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _pick(shard: ShardId, live: Sequence[str], load: Counter[str], cap: int) -> str:
    under = [n for n in live if load[n] < cap] or list(live)
    return max(under, key=lambda n: (rendezvous(shard, n), n))


def plan(
    specs: Iterable[ShardSpec],
    live: Iterable[str],
    current: Mapping[ShardId, Held],
    *,
    draining: Iterable[str] = (),
    copied: Mapping[tuple[str, ShardId], int] | None = None,
    refused: Mapping[tuple[str, ShardId], PromotionRefusal] | None = None,
    max_moves: int = 0,
) -> list[Write]:
    """The writes that bring `current` to the placement rule (module docs).
    `draining`: brokers being drained; `copied`: (successor, shard) -> the
    generation its reported copy was made for; `refused`: (replica, shard) -> the
    promotion that replica refused (a replica ahead of it); `max_moves`: at most
    this many copies in progress at once across the fleet (0: no cap); a drained
    broker's other shards wait (queued) until one ends."""
    refusals = refused or {}
    in_progress = sum(1 for held in current.values() if copying(held.record))
    alive = set(live)
    drained = set(draining) & alive
    members = sorted(alive - drained)  # who may take shards
    copies = copied or {}
    wanted = {spec.shard: spec for spec in specs}
    load: Counter[str] = Counter(
        held.record.leader
        for shard, held in current.items()
        if shard in wanted and held.record.leader in members
    )
    cap = math.ceil(len(wanted) / len(members)) if members else 0
    held_by: Counter[str] = Counter(  # replicas per member, to spread followers
        node for held in current.values() for node in held.record.replicas if node in members
    )
    writes: list[Write] = []

    def place(shard: ShardId, expected: int) -> None:
        factor = wanted[shard].replication_factor
        if not members or len(members) < factor:
            # A replica set is never smaller than asked: it waits for enough brokers.
            record = _record(_UNAVAILABLE, None, NOT_ASSIGNED)
        else:
            leader = _pick(shard, members, load, cap)
            load[leader] += 1
            replicas = _replica_set(shard, leader, members, held_by, factor)
            held_by.update(replicas)
            record = _record(_ACTIVE, leader, replicas=replicas)
        writes.append(Write(shard, record, expected))

    for shard in sorted(wanted):
        spec = wanted[shard]
        held = current.get(shard)
        if held is None:
            place(shard, 0)
            continue
        record = held.record
        if record.state in _IN_A_MOVE or (catching_up(record) and record.leader in alive):
            step = _move_step(shard, held, alive, copies)
            if step is not None:
                writes.append(step)
            continue
        if record.leader is not None and record.leader in drained:
            if spec.replicated and record.replicas:
                # A replicated shard's truth is its replication log, held by its replica
                # set: leadership goes to a live replica (a promotion at this write's
                # generation, the set kept), never a copy of the stream files.
                handed_to = _handoff(spec, record, members)
                if record.state == _ACTIVE and handed_to is not None:
                    promoted = _record(_ACTIVE, handed_to, replicas=record.replicas)
                    writes.append(Write(shard, promoted, held.mod_revision))
                elif record.state == _UNAVAILABLE:  # its broker is back: serve, then hand off
                    back = _record(_ACTIVE, record.leader, replicas=record.replicas)
                    writes.append(Write(shard, back, held.mod_revision))
                elif record.state == _ACTIVE:
                    _log.warning(
                        "placer: not draining %s from %s: no majority of its replica set"
                        " is live outside the drained brokers",
                        _shard_text(shard),
                        record.leader,
                    )
                continue
            if record.state == _ACTIVE and members:
                if max_moves and in_progress >= max_moves:
                    continue  # queued: it starts once a move in progress ends
                in_progress += 1
                successor = _pick(shard, members, load, cap)
                load[successor] += 1
                writes.append(Write(shard, _catch_up(record.leader, successor), held.mod_revision))
            elif record.state == _UNAVAILABLE:
                writes.append(Write(shard, _record(_ACTIVE, record.leader), held.mod_revision))
            continue
        refusal = refusals.get((record.leader or "", shard))
        if (
            refusal is not None
            and record.state == _ACTIVE
            and refusal.generation == held.mod_revision
            and spec.replicated
        ):
            # The promoted replica found one further ahead and did not open: promote
            # one it names (live) at a new generation; none live: unavailable, leader
            # one of them, so that it takes the shard back when it returns.
            ahead = [n for n in refusal.ahead if n in record.replicas]
            live = [n for n in ahead if n in members]
            if live:
                choice = max(live, key=lambda n: (rendezvous(shard, n), n))
                promoted = _record(_ACTIVE, choice, replicas=record.replicas)
            elif ahead:
                promoted = _record(
                    _UNAVAILABLE, ahead[0], OWNER_UNAVAILABLE, replicas=record.replicas
                )
            else:
                continue
            writes.append(Write(shard, promoted, held.mod_revision))
            continue
        if record.leader is not None and record.leader in members:
            if record.state == _UNAVAILABLE:  # its broker is back
                back = _record(_ACTIVE, record.leader, replicas=record.replicas)
                writes.append(Write(shard, back, held.mod_revision))
            continue
        behind = {node for (node, s) in refusals if s == shard}
        promoted_to = _successor(spec, record, members, behind)
        if promoted_to is not None:
            # A replicated shard's leader is gone: a live replica takes over at a new
            # generation (this write's revision). Its core fences a majority and opens
            # only if none is ahead of it, so a lagging one refuses, never serves short.
            promoted = _record(_ACTIVE, promoted_to, replicas=record.replicas)
            writes.append(Write(shard, promoted, held.mod_revision))
            continue
        if spec.durable and record.leader is not None:
            if record.state != _UNAVAILABLE or record.reason != OWNER_UNAVAILABLE:
                kept = _record(
                    _UNAVAILABLE, record.leader, OWNER_UNAVAILABLE, replicas=record.replicas
                )
                writes.append(Write(shard, kept, held.mod_revision))
            continue
        too_few = len(members) < max(1, spec.replication_factor)
        if too_few and record.state == _UNAVAILABLE and record.reason == NOT_ASSIGNED:
            continue
        place(shard, held.mod_revision)
    for shard in sorted(set(current) - set(wanted)):
        writes.append(Write(shard, None, current[shard].mod_revision))
    return writes


def catching_up(record: Assignment) -> bool:
    """A move's first phase: served by its leader (``active``) while the leader copies
    it to the named successor."""
    return (
        record.state == _ACTIVE
        and record.successor is not None
        and record.leader is not None
        and record.successor != record.leader
    )


def copying(record: Assignment) -> bool:
    """A move in progress that copies a shard (catching up or fenced); not a fence."""
    if catching_up(record):
        return True
    return (
        record.state in _IN_A_MOVE
        and record.successor is not None
        and record.successor != record.leader
    )


def _catch_up(leader: str, successor: str) -> Assignment:
    return Assignment(state=_ACTIVE, leader=leader, replicas=[], successor=successor)


def _move_step(
    shard: ShardId, held: Held, alive: set[str], copied: Mapping[tuple[str, ShardId], int]
) -> Write | None:
    """The next step of a move in progress: a catch-up is fenced once the successor
    holds what it copied (for this very generation); a fence cuts over once the
    successor holds the copy made for its generation; retake when the successor left."""
    record = held.record
    successor, leader = record.successor, record.leader
    if successor is None or leader is None:
        return None
    if successor == leader:
        return None  # a fence: lasts until cancelled
    if successor not in alive:
        kept = record.replicas
        if leader in alive:
            return Write(shard, _record(_ACTIVE, leader, replicas=kept), held.mod_revision)
        gone = _record(_UNAVAILABLE, leader, OWNER_UNAVAILABLE, replicas=kept)
        return Write(shard, gone, held.mod_revision)
    if copied.get((successor, shard)) != held.mod_revision:
        return None
    if catching_up(record):
        fenced = Assignment(state=MOVING, leader=leader, replicas=[], successor=successor)
        return Write(shard, fenced, held.mod_revision)
    return Write(shard, _record(_ACTIVE, successor), held.mod_revision)


def _handoff(spec: ShardSpec, record: Assignment, members: Sequence[str]) -> str | None:
    """The live replica (outside the drained brokers) a drained leader of a replicated
    shard hands it to: only while a majority of its replica set is live and taking
    shards, since the promotion's fence needs a majority that does not lean on the
    drained broker staying."""
    live = [n for n in record.replicas if n in members and n != record.leader]
    if len(live) + 1 < len(record.replicas) // 2 + 1 or not live:
        return None
    shard = spec.shard
    return max(live, key=lambda n: (rendezvous(shard, n), n))


def _successor(
    spec: ShardSpec, record: Assignment, members: Sequence[str], behind: Iterable[str] = ()
) -> str | None:
    """The live replica to promote when a replicated shard's leader is gone: only while
    a majority of its replica set is live (the promotion's fence needs one), and never
    one that refused a promotion of it (it is behind: it withdraws the refusal once it
    holds a newer generation)."""
    if not spec.replicated or not record.replicas:
        return None
    live = [n for n in record.replicas if n in members and n != record.leader]
    if len(live) < len(record.replicas) // 2 + 1:
        return None
    candidates = [n for n in live if n not in set(behind)]
    if not candidates:
        return None
    shard = spec.shard
    return max(candidates, key=lambda n: (rendezvous(shard, n), n))


def _replica_set(
    shard: ShardId, leader: str, members: Sequence[str], held_by: Counter[str], factor: int
) -> list[str]:
    """The leader and `factor - 1` other distinct members (fewest replicas held first,
    then rendezvous order); empty for a shard without replicas (factor 1)."""
    if factor <= 1:
        return []
    others = sorted(
        (n for n in members if n != leader),
        key=lambda n: (held_by[n], -rendezvous(shard, n), n),
    )
    return [leader, *others[: factor - 1]]


CatalogShards = Callable[[], Awaitable[list[ShardSpec]]]
WriteListener = Callable[[Write, int], None]


class Placer:
    """Campaigns for ``P/placer``; while it holds it, keeps every shard placed."""

    def __init__(
        self,
        client: EtcdClient,
        keys: Keyspace,
        holder_id: str,
        catalog: CatalogShards,
        *,
        lease_ttl_s: int = 10,
        interval_s: float = 1.0,
        max_moves: int = DEFAULT_MAX_MOVES,
    ) -> None:
        if lease_ttl_s < 1:
            raise ValueError("the placer lease TTL must be at least 1 s")
        if max_moves < 0:
            raise ValueError("max_moves must be 0 (no cap) or more")
        self.max_moves = max_moves
        self._client = client
        self._keys = keys
        self.holder_id = holder_id
        self._catalog = catalog
        self._ttl = lease_ttl_s
        self._interval = interval_s
        self._lease = 0
        self._token = 0  # P/placer's create_revision while we hold it
        self._wake = asyncio.Event()
        self._listeners: list[WriteListener] = []
        self.passes = 0
        self.writes = 0

    @property
    def holding(self) -> bool:
        return self._token != 0

    def add_listener(self, listener: WriteListener) -> None:
        """Called with (write, revision) after every write etcd accepted."""
        self._listeners.append(listener)

    def wake(self) -> None:
        """Run a pass now (a member came or went)."""
        self._wake.set()

    async def run(self) -> None:
        """Campaign and place until cancelled; releases the placer key when cancelled."""
        delay = 0.05
        try:
            while True:
                try:
                    if await self._campaign():
                        delay = 0.05
                        await self._lead()
                    else:
                        await asyncio.sleep(self._interval)
                except EtcdUnavailableError as exc:
                    _log.debug("placer %s: etcd failed: %s", self.holder_id, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                finally:
                    self._token = 0
        finally:
            await self._release()

    async def _release(self) -> None:
        lease, self._lease = self._lease, 0
        if lease:
            with contextlib.suppress(EtcdUnavailableError, EtcdRequestError):
                await self._client.revoke(lease)

    async def _campaign(self) -> bool:
        """One attempt to become the placer."""
        if not self._lease:
            self._lease = await self._client.grant(self._ttl)
        placer = self._keys.placer
        ok, revision = await self._client.txn(
            [Compare(placer, "create_revision", "==", 0)],
            [Put(placer, self.holder_id.encode(), self._lease)],
        )
        if not ok:
            # Someone else holds it; our lease is not needed meanwhile.
            await self._release()
            return False
        self._token = revision
        _log.info("placer %s holds placement (token %d)", self.holder_id, revision)
        return True

    async def _lead(self) -> None:
        """Keep the lease and place, until the lease or the placer key is lost."""
        keepalive = asyncio.create_task(self._keep_alive(), name="placer-keepalive")
        members = asyncio.create_task(self._watch_members(), name="placer-members")
        passes = asyncio.create_task(self._passes(), name="placer-passes")
        try:
            done, _ = await asyncio.wait(
                {keepalive, members, passes}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # re-raise EtcdUnavailableError
        finally:
            for task in (keepalive, members, passes):
                task.cancel()
            # Collects the children's ends; a cancellation of this task still propagates.
            await asyncio.gather(keepalive, members, passes, return_exceptions=True)
            _log.info("placer %s no longer holds placement", self.holder_id)
            await self._release()

    async def _keep_alive(self) -> None:
        interval = self._ttl / 3
        deadline = lease_clock() + self._ttl * 3 / 4
        while True:
            sent = lease_clock()
            if sent >= deadline:
                return
            try:
                async with asyncio.timeout(max(0.01, deadline - sent)):
                    left = await self._client.keepalive(self._lease)
            except (EtcdUnavailableError, TimeoutError):
                await asyncio.sleep(max(0.0, min(interval / 2, deadline - lease_clock())))
                continue
            if left <= 0:
                return
            deadline = sent + self._ttl * 3 / 4
            await asyncio.sleep(max(0.0, sent + interval - lease_clock()))

    async def _watch_members(self) -> None:
        """Wake a pass on every change of the members, a move's progress or a drain."""
        revision, _ = await self._client.get_prefix(self._keys.members)
        self.wake()
        wanted = (self._keys.members, self._keys.progress, self._keys.drains)
        async for event in self._client.watch_prefix(self._keys.root, revision + 1):
            if event.key.startswith(wanted):
                self.wake()

    async def _passes(self) -> None:
        while True:
            if not await self.reconcile():
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()

    async def reconcile(self) -> bool:
        """One pass; False when this instance no longer holds placement."""
        self.passes += 1
        specs = await self._catalog()
        keys = self._keys
        _, kvs = await self._client.get_prefix(keys.root)
        members: set[str] = set()
        current: dict[ShardId, Held] = {}
        draining: dict[str, int] = {}
        copied: dict[tuple[str, ShardId], int] = {}
        refused: dict[tuple[str, ShardId], PromotionRefusal] = {}
        holder_ok = False
        for kv in kvs:
            if kv.key == keys.placer:
                holder_ok = kv.create_revision == self._token
            elif kv.key.startswith(keys.members):
                members.add(keys.node_of(kv.key))
            elif kv.key.startswith(keys.drains):
                try:
                    draining[keys.drained_node_of(kv.key)] = kv.mod_revision
                except RecordError as exc:
                    _log.warning("placer: ignoring %s: %s", kv.key, exc)
            elif (asker := keys.drain_requester_of(kv.key)) is not None:
                draining.setdefault(asker, 0)  # goes with the broker's lease
            elif kv.key.startswith(keys.progress) and "/refused/" in kv.key:
                try:
                    found = keys.refusal_of(kv.key)
                    if found is not None:
                        refused[found] = decode_promotion_refusal(kv.value)
                except RecordError as exc:
                    _log.warning("placer: ignoring %s: %s", kv.key, exc)
            elif kv.key.startswith(keys.progress):
                try:
                    node, shard = keys.progress_of(kv.key)
                    copied[(node, shard)] = decode_move_copied(kv.value).generation
                except RecordError as exc:
                    _log.warning("placer: ignoring %s: %s", kv.key, exc)
            elif kv.key.startswith(keys.assignments):
                try:
                    shard = keys.shard_of(kv.key)
                    current[shard] = Held(decode_assignment(kv.value), kv.mod_revision)
                except RecordError as exc:
                    _log.warning("placer: ignoring %s: %s", kv.key, exc)
        if not holder_ok:
            return False
        for node, revision in draining.items():
            if revision and node not in members:  # a drained broker left: its next start is welcome
                await self._delete_if(keys.drain(node), revision)
        writes = plan(
            specs,
            members,
            current,
            draining=draining,
            copied=copied,
            refused=refused,
            max_moves=self.max_moves,
        )
        for write in writes:
            if not await self._write(write):
                # Planned from a stale view (or placement lost): read again.
                held = await self._client.get(keys.placer)
                if held is None or held.create_revision != self._token:
                    return False
                self.wake()
                break
        return True

    # -- planned moves (the control plane's fleet API) --------------------------------

    def _require_holding(self) -> None:
        if not self.holding:
            raise MoveError(503, "not_placer", f"{self.holder_id} does not hold placement now")

    async def _held(self, shard: ShardId) -> Held:
        kv = await self._client.get(self._keys.assignment(shard))
        if kv is None:
            raise MoveError(404, "not_found", f"no assignment for {_shard_text(shard)}")
        try:
            return Held(decode_assignment(kv.value), kv.mod_revision)
        except RecordError as exc:
            raise MoveError(409, "conflict", str(exc)) from None

    async def _live(self) -> set[str]:
        _, kvs = await self._client.get_prefix(self._keys.members)
        return {self._keys.node_of(kv.key) for kv in kvs}

    async def _step(self, write: Write) -> int:
        ok, revision = await self._txn_write(write)
        if not ok:
            self._require_holding()
            raise MoveError(409, "conflict", "the assignment changed meanwhile: try again")
        self.wake()
        return revision

    async def moves(self) -> dict[ShardId, Held]:
        """The moves (and fences) in progress, as etcd has them now."""
        _, kvs = await self._client.get_prefix(self._keys.assignments)
        out: dict[ShardId, Held] = {}
        for kv in kvs:
            try:
                record = decode_assignment(kv.value)
                if record.state in _IN_A_MOVE or catching_up(record):
                    out[self._keys.shard_of(kv.key)] = Held(record, kv.mod_revision)
            except RecordError as exc:
                _log.warning("placer: ignoring %s: %s", kv.key, exc)
        return out

    async def move(self, shard: ShardId, to: str) -> int:
        """Start moving `shard` to the broker `to`: the fence (``moving``). Returns the
        fence's generation. The placer cuts over once `to` reports its copy."""
        self._require_holding()
        held = await self._held(shard)
        record = held.record
        if record.state != _ACTIVE or record.leader is None:
            raise MoveError(
                409, "conflict", f"{_shard_text(shard)} is {record.state}, not active: not movable"
            )
        if to == record.leader:
            raise MoveError(409, "conflict", f"{to} already leads {_shard_text(shard)}")
        if to not in await self._live():
            raise MoveError(404, "not_found", f"no live broker {to!r}")
        if await self._replicated(shard) and record.replicas:
            # Its truth is its replication log: leadership goes to a member of its replica
            # set by promotion (a new generation, the set kept); no file copy.
            if to not in record.replicas:
                raise MoveError(
                    409,
                    "replicated",
                    f"{_shard_text(shard)} is replicated (replicas {', '.join(record.replicas)}):"
                    f" it moves only to a member of its replica set, not {to}",
                )
            promoted = _record(_ACTIVE, to, replicas=record.replicas)
            return await self._step(Write(shard, promoted, held.mod_revision))
        if record.successor is not None:
            raise MoveError(
                409,
                "already_moving",
                f"{_shard_text(shard)} is moving to {record.successor} already",
            )
        if self.max_moves:
            busy = sum(1 for held in (await self._assignments()).values() if copying(held.record))
            if busy >= self.max_moves:
                raise MoveError(
                    409,
                    "move_limit",
                    f"{busy} move(s) in progress, at the limit of {self.max_moves}: try again "
                    "once one ends",
                )
        # The catch-up: its leader copies it to `to` while still serving it; the fence
        # (moving) follows once `to` reports the copy, the cut-over once it holds the rest.
        return await self._step(Write(shard, _catch_up(record.leader, to), held.mod_revision))

    async def _replicated(self, shard: ShardId) -> bool:
        return any(spec.shard == shard and spec.replicated for spec in await self._catalog())

    async def fence(self, shard: ShardId) -> tuple[str, int]:
        """Fence `shard` as a move does, with no successor: its leader holds and then
        refuses writes and ends its readers until `cancel`. Returns (leader, generation)."""
        self._require_holding()
        held = await self._held(shard)
        record = held.record
        if record.leader is None:
            raise MoveError(409, "conflict", f"{_shard_text(shard)} has no leader to fence")
        if record.state == MOVING and record.successor == record.leader:
            return record.leader, held.mod_revision  # fenced already
        if catching_up(record):
            raise MoveError(
                409, "already_moving", f"{_shard_text(shard)} is moving to {record.successor}"
            )
        if record.state != _ACTIVE:
            raise MoveError(409, "conflict", f"{_shard_text(shard)} is {record.state}")
        fenced = Assignment(
            state=MOVING, leader=record.leader, replicas=record.replicas, successor=record.leader
        )
        return record.leader, await self._step(Write(shard, fenced, held.mod_revision))

    async def cancel(self, shard: ShardId) -> Cancelled:
        """Cancel the move (or fence) of `shard` before its cut-over: the old leader
        serves it again at a new generation, without a successor. ``cancel`` during
        the catch-up (nothing was held, no reader ended), ``retake`` after the fence
        (held writes go to the old leader, and readers ended with shard_moved are
        answered not_leader naming it by the successor). 409 when no move is in
        progress (never started, or cut over already)."""
        self._require_holding()
        held = await self._held(shard)
        record = held.record
        if (record.state not in _IN_A_MOVE and not catching_up(record)) or record.leader is None:
            raise MoveError(
                409, "conflict", f"{_shard_text(shard)} is not moving (cut over, or never moved)"
            )
        outcome = "cancel" if catching_up(record) else "retake"
        back = _record(_ACTIVE, record.leader, replicas=record.replicas)
        return Cancelled(await self._step(Write(shard, back, held.mod_revision)), outcome)

    async def drain(self, node_id: str, requested_by: str) -> list[tuple[ShardId, str]]:
        """Move every shard `node_id` leads elsewhere, and place nothing new on it.
        Returns the replicated shards it leads that cannot be handed to a replica now
        (shard, why): the drain leaves them where they are while that lasts."""
        self._require_holding()
        live = await self._live()
        if node_id not in live:
            raise MoveError(404, "not_found", f"no live broker {node_id!r}")
        record = encode_record(Drain(requested_by=requested_by))
        holder = Compare(self._keys.placer, "create_revision", "==", self._token)
        ok, _ = await self._client.txn([holder], [Put(self._keys.drain(node_id), record)])
        if not ok:
            self._require_holding()
        self.wake()
        return await self._kept_by_drain(node_id, live)

    async def _kept_by_drain(self, node_id: str, live: set[str]) -> list[tuple[ShardId, str]]:
        _, kvs = await self._client.get_prefix(self._keys.drains)
        drained = {node_id}
        for kv in kvs:
            with contextlib.suppress(RecordError):
                drained.add(self._keys.drained_node_of(kv.key))
        members = sorted(live - drained)
        replicated = {spec.shard: spec for spec in await self._catalog() if spec.replicated}
        kept: list[tuple[ShardId, str]] = []
        for shard, held in sorted((await self._assignments()).items()):
            record = held.record
            spec = replicated.get(shard)
            if spec is None or record.leader != node_id or not record.replicas:
                continue
            if _handoff(spec, record, members) is None:
                why = "replicated: no majority of its replica set live outside draining brokers"
                kept.append((shard, why))
        return kept

    async def _assignments(self) -> dict[ShardId, Held]:
        _, kvs = await self._client.get_prefix(self._keys.assignments)
        out: dict[ShardId, Held] = {}
        for kv in kvs:
            with contextlib.suppress(RecordError):
                record = decode_assignment(kv.value)
                out[self._keys.shard_of(kv.key)] = Held(record, kv.mod_revision)
        return out

    async def queued(self) -> list[tuple[ShardId, str]]:
        """The shards a drain will move that wait for a free move slot (`max_moves`):
        (shard, its leader), in the order the placer takes them."""
        _, kvs = await self._client.get_prefix(self._keys.drains)
        drained: set[str] = set()
        for kv in kvs:
            with contextlib.suppress(RecordError):
                drained.add(self._keys.drained_node_of(kv.key))
        if not drained:
            return []
        replicated = {spec.shard for spec in await self._catalog() if spec.replicated}
        out: list[tuple[ShardId, str]] = []
        for shard, held in sorted((await self._assignments()).items()):
            record = held.record
            if (
                record.leader in drained
                and record.state == _ACTIVE
                and record.successor is None
                and not (shard in replicated and record.replicas)
            ):
                out.append((shard, record.leader))
        return out

    async def undrain(self, node_id: str) -> bool:
        """Stop draining `node_id` (moves already fenced go on); False if it was not."""
        self._require_holding()
        kv = await self._client.get(self._keys.drain(node_id))
        if kv is None:
            return False
        await self._delete_if(self._keys.drain(node_id), kv.mod_revision)
        self.wake()
        return True

    async def _delete_if(self, key: str, revision: int) -> None:
        holder = Compare(self._keys.placer, "create_revision", "==", self._token)
        await self._client.txn(
            [Compare(key, "mod_revision", "==", revision), holder], [Delete(key)]
        )

    async def _write(self, write: Write) -> bool:
        ok, _ = await self._txn_write(write)
        return ok

    async def _txn_write(self, write: Write) -> tuple[bool, int]:
        key = self._keys.assignment(write.shard)
        guard = (
            Compare(key, "mod_revision", "==", write.expected)
            if write.expected
            else Compare(key, "create_revision", "==", 0)
        )
        holder = Compare(self._keys.placer, "create_revision", "==", self._token)
        op: Put | Delete = (
            Put(key, encode_record(write.record)) if write.record is not None else Delete(key)
        )
        ok, revision = await self._client.txn([guard, holder], [op])
        if not ok:
            return False, 0
        self.writes += 1
        for listener in self._listeners:
            try:
                listener(write, revision)
            except Exception:
                _log.exception("placer write listener failed")
        return True, revision


def _shard_text(shard: ShardId) -> str:
    return f"{shard.kind.value} {shard.tenant}/{shard.namespace}/{shard.name} shard {shard.shard}"


def shard_specs(
    streams: Iterable[tuple[str, str, str, int, bool]],
    caches: Iterable[tuple[str, str, str, int]],
    replication: Mapping[tuple[ShardKind, str, str, str], int] | None = None,
    replicated: frozenset[tuple[ShardKind, str, str, str]] = frozenset(),
) -> list[ShardSpec]:
    """Every shard of the given streams (tenant, namespace, name, shards, durable) and
    caches (tenant, namespace, name, shards). Caches count as durable: their logs
    live on their leader, so they are never served empty elsewhere. `replication`
    gives a replication factor per (kind, tenant, namespace, name); 1 otherwise;
    `replicated` names those whose writes run through replication (Quorum)."""
    factors = replication or {}
    out: list[ShardSpec] = []
    for tenant, namespace, name, count, durable in streams:
        named = (ShardKind.STREAM, tenant, namespace, name)
        factor = factors.get(named, 1)
        for index in range(count):
            shard = ShardId(ShardKind.STREAM, tenant, namespace, name, index)
            out.append(ShardSpec(shard, durable, factor, named in replicated))
    for tenant, namespace, name, count in caches:
        named = (ShardKind.CACHE, tenant, namespace, name)
        factor = factors.get(named, 1)
        for index in range(count):
            shard = ShardId(ShardKind.CACHE, tenant, namespace, name, index)
            out.append(ShardSpec(shard, True, factor, named in replicated))
    return out


class _CatalogStore(Protocol):
    def snapshot(self) -> Snapshot: ...


def store_catalog(store: _CatalogStore) -> CatalogShards:
    """The catalog's shards, read from the control plane's store on each pass."""

    async def read() -> list[ShardSpec]:
        snap = await asyncio.to_thread(store.snapshot)
        streams: list[tuple[str, str, str, int, bool]] = []
        caches: list[tuple[str, str, str, int]] = []
        factors: dict[tuple[ShardKind, str, str, str], int] = {}
        quorum: set[tuple[ShardKind, str, str, str]] = set()
        for key, body in snap.resources:
            if key.kind == "stream":
                spec = stream_spec(key.tenant, key.namespace, body)
                streams.append((key.tenant, key.namespace, key.name, spec.shards, spec.durable))
                named = (ShardKind.STREAM, key.tenant, key.namespace, key.name)
                factors[named] = spec.replication_factor
                if spec.replicated:
                    quorum.add(named)
            elif key.kind == "cache":
                cache = cache_spec(key.tenant, key.namespace, body)
                caches.append((key.tenant, key.namespace, key.name, cache.shards))
                named = (ShardKind.CACHE, key.tenant, key.namespace, key.name)
                factors[named] = cache.replication_factor
                if cache.replicated:
                    quorum.add(named)
        return shard_specs(streams, caches, factors, frozenset(quorum))

    return read


class Placement:
    """The placer as `felix-controlplane --etcd-endpoints` runs it: its own etcd client,
    the catalog read from the control plane's store on every pass."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str,
        holder_id: str,
        store: _CatalogStore,
        lease_ttl_s: int = 10,
        interval_s: float = 1.0,
        max_moves: int = DEFAULT_MAX_MOVES,
    ) -> None:
        self.client = EtcdClient(endpoints, timeout_s=max(0.5, lease_ttl_s / 3))
        self.placer = Placer(
            self.client,
            Keyspace(prefix),
            holder_id,
            store_catalog(store),
            lease_ttl_s=lease_ttl_s,
            interval_s=interval_s,
            max_moves=max_moves,
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.placer.run(), name="placer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.client.close()
