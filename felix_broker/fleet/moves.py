"""Planned moves on the broker side: holding writes, ending readers, copying a shard.

The control plane's placer drives a move in etcd (felix_controlplane/placement.py)
in two phases: the catch-up (the assignment ``active`` with a ``successor`` named:
the old leader still serves it and copies it meanwhile), then the fence
(``moving``) once the successor reported the catch-up under
``P/progress/{successor}/moves/...`` (its own lease), and the cut-over (``active``,
leader = successor, a new generation) once it reported the installed copy. Here:

- **Holding** (`MoveHold`): a write (publish, cache or counter op, group request,
  publish_if, commit) for a shard whose assignment is ``moving`` or ``draining``
  waits, before admission, until the routes show the shard served again, then is
  dispatched anew (served here, or forwarded to the new owner). Bounded: at most
  `hold_ms` per request and `hold_max` held at once on this broker; past either it is
  refused ``shard_unavailable`` with reason ``moving`` and ``retry_after_ms``, and
  nothing was written. Reads (subscribe, cache_watch, stream_read, offset_for_time)
  are never held: they are refused ``shard_unavailable/moving`` at once.
- **Ending readers** (`MoveService.on_change`): when this broker stops serving a
  shard it served (a fence, a cut-over, a lapsed lease), each subscription and cache
  watch on it gets what was queued and then ``shard_moved {subscription_id,
  resume_from, node_id, addr, generation}`` (for clients that offered
  FEATURE_SHARD_MOVED; others see their stream end). ``node_id``/``addr`` name the
  successor during a move, the leader after; none for a lapsed lease (the client
  finds the shard again).
- **Catching up** (old leader, while it still takes writes): bounded passes over
  the shard's files, each sending (`move_chunk` at the catch-up's generation) what
  the successor lacks: a log segment (append-only while its log is open) from where
  the last pass stopped, a file replaced (another inode) or shorter from its start.
  A pass that sent at most `catchup_bytes` is the last (or after `catchup_passes`);
  then `move_caught_up`, and the successor reports it, which brings the fence.
- **Copying the last delta** (old leader): once fenced it lets the publishes already
  admitted land, waits (bounded) for its readers to end, closes the shard's storage
  (stream log, group log with cursors and dead letters, or cache log; producer state
  and commit state live in the stream log's batch marks), sends what changed since
  the last pass (segments from where they stopped, every other file whole) and
  `move_final` listing every file with its size. Any failure sends it all again.
  `MoveService.stats` keeps what went before and under the fence. An in-memory
  shard sends no file (it resumes at the new tail).
- **Installing** (successor): chunks are staged beside the shard's folders and
  carried from the catch-up on to the fence (same sender); at `move_final` the
  successor drops staged files the list lacks, refuses unless every listed file
  holds exactly its size, closes whatever it had of the shard, replaces the folders
  with the staged copy and reports ``MoveCopied {generation}`` in etcd. A piece for
  another generation, a sender that is not the shard's leader, or a shard not
  moving to this broker is refused (nothing is installed). The rename into place
  is followed by an fsync of the parent folder, before the report. A move dropped
  before its cut-over (cancelled, retaken) drops what was staged.
- **Discarding** (old leader): once the assignment cuts over to the successor, the
  old leader closes and removes its own copy of the shard (never served again; a
  later move back brings a fresh copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import shutil
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from felix_broker.fleet.peer import PeerDialer, PeerOrigin, PeerUnavailableError
from felix_broker.fleet.routing import (
    AssignmentState,
    Member,
    Route,
    RoutingSnapshot,
    ShardId,
    ShardKind,
)
from felix_broker.fleet.view import FleetView
from felix_broker.storage.paths import Area, log_dir
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import (
    AssignmentKind,
    ForwardRefusal,
    ForwardRefused,
    MoveCaughtUp,
    MoveChunk,
    MoveChunkOk,
    MoveCopied,
    MoveDone,
    MoveDoneOk,
    MoveFile,
    MoveFinal,
    PeerError,
    PeerMessage,
)
from felix_wire.messages import ErrorDetail

__all__ = [
    "CHUNK_BYTES",
    "IN_A_MOVE",
    "MoveHold",
    "MoveService",
    "MoveStats",
    "ShardStorage",
    "moving_refusal",
]

_log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # one move_chunk's data (base64 in a peer frame far below its cap)
IN_A_MOVE = frozenset({AssignmentState.MOVING, AssignmentState.DRAINING})
# How a refused held write tells the client to come back.
RETRY_AFTER_MS = 100
# Bounds of the old leader's steps (each one bounded, so a stuck step never hangs a move).
_SETTLE_S = 5.0  # admitted publishes landing
_READERS_S = 2.0  # readers writing what was queued, then shard_moved
_COPY_ATTEMPTS = 5
_ROUTE_WAIT_S = 5.0  # a successor waiting for its watch to show the fence
_TAIL_BYTES = 4096  # the end of what was sent of a file, compared before its next delta

# Set while a held request is dispatched again: it is not held a second time.
_redispatched: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "felix_move_redispatched", default=False
)


def in_a_move(route: Route | None) -> bool:
    return route is not None and route.state in IN_A_MOVE


def moving_refusal(what: str) -> tuple[str, ErrorDetail]:
    """The text and detail of a write refused because its shard is moving."""
    return (
        f"shard unavailable: moving ({what})",
        ErrorDetail(reason="moving", retry_after_ms=RETRY_AFTER_MS),
    )


class MoveHold:
    """Writes waiting for a move's cut-over, bounded in time and in count."""

    def __init__(self, view: FleetView, *, hold_ms: int, hold_max: int) -> None:
        self._view = view
        self.hold_s = hold_ms / 1000
        self.hold_max = hold_max
        self.held = 0  # writes waiting now
        self.refused = 0  # writes refused at a bound (since start)

    @property
    def redispatched(self) -> bool:
        """Whether the running request was held once already."""
        return _redispatched.get()

    async def wait(self, shard: ShardId) -> bool:
        """Wait until `shard` is out of its move; False (refuse it) when the hold's time
        or count bound was reached first."""
        if self.held >= self.hold_max or self.hold_s <= 0:
            self.refused += 1
            return False
        self.held += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.hold_s
            while in_a_move(self._view.snapshot.route(shard)):
                left = deadline - loop.time()
                if left <= 0:
                    self.refused += 1
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._view.wait_changed()
            return True
        finally:
            self.held -= 1

    async def again(self, dispatch: Callable[[], Awaitable[None]]) -> None:
        """Dispatch a held request anew (it is not held a second time)."""
        token = _redispatched.set(True)
        try:
            await dispatch()
        finally:
            _redispatched.reset(token)


class ShardStorage(Protocol):
    """What the broker's services do for a move (composition root: felix_broker.app)."""

    root: Path | None  # the durable storage folder; None: nothing is durable here

    def durable(self, shard: ShardId) -> bool:
        """Whether `shard` keeps files (a durable stream, or a cache with its log)."""
        ...

    def end_readers(self, shard: ShardId, moved_to: tuple[str | None, str | None, int]) -> int:
        """End the subscriptions or watches of `shard` after what is queued, with
        shard_moved naming `moved_to`; how many were ended."""
        ...

    def readers(self, shard: ShardId) -> int:
        """How many readers of `shard` are still open."""
        ...

    async def settle(self) -> None:
        """Let every admitted publish land."""
        ...

    async def release(self, shard: ShardId) -> None:
        """Close and forget what this broker has open of `shard` (its files stay)."""
        ...


Report = Callable[[ShardId, MoveCopied], Awaitable[None]]


def _ends_with(path: Path, size: int, tail: bytes) -> bool:
    """Whether `path`'s bytes just below `size` are still `tail`."""
    try:
        with path.open("rb") as handle:
            handle.seek(size - len(tail))
            return handle.read(len(tail)) == tail
    except OSError:
        return False


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _install_folder(staging: Path, target: Path) -> None:
    """Put the staged copy in `target`'s place (an older copy must never be served)
    and fsync the parent, so the rename survives a crash before the copy is reported."""
    if target.exists():
        shutil.rmtree(target)
    if staging.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
    if target.parent.is_dir():
        _fsync_dir(target.parent)


def _remove_folders(folders: Iterable[Path]) -> None:
    for folder in folders:
        if folder.exists():
            shutil.rmtree(folder)
            _fsync_dir(folder.parent)


def _areas(shard: ShardId) -> tuple[Area, ...]:
    return ("streams", "groups") if shard.kind is ShardKind.STREAM else ("cache",)


def _kind(shard: ShardId) -> AssignmentKind:
    return AssignmentKind(shard.kind.value)


def _shard_of(message: MoveChunk | MoveDone | MoveCaughtUp | MoveFinal) -> ShardId:
    kind = ShardKind(str(message.kind))
    return ShardId(kind, message.tenant_id, message.namespace, message.name, message.shard)


def _common(shard: ShardId, generation: int) -> dict[str, Any]:
    """The fields every move message carries: which shard, at which generation."""
    return {
        "kind": _kind(shard),
        "tenant_id": shard.tenant,
        "namespace": shard.namespace,
        "name": shard.name,
        "shard": shard.shard,
        "generation": generation,
    }


class _Refused(Exception):
    def __init__(self, message: str, code: ErrorCode = ErrorCode.SHARD_UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Staged:
    """The successor's staged copy of one shard: from which sender, for which
    generation (a catch-up's copy is carried on to the fence's), and the size of
    each staged file ((area, name) -> bytes)."""

    sender: str
    generation: int
    files: dict[tuple[str, str], int]


@dataclass(frozen=True, slots=True)
class _Held:
    """What the successor holds of one file: the sender's inode, how many bytes, and
    the last of them (checked again before a delta: a log truncated and written anew
    below that point, after a failed write, is sent again whole)."""

    inode: int
    size: int
    tail: bytes


@dataclass
class _Outgoing:
    """The old leader's side of one move: what it sent to `successor` so far."""

    successor: str
    sent: dict[tuple[str, str], _Held] = field(default_factory=dict)
    passes: int = 0
    precopied: int = 0  # bytes sent by the catch-up passes
    _request_id: int = 0

    def next_id(self) -> int:
        self._request_id += 1
        return self._request_id


@dataclass(frozen=True, slots=True)
class MoveStats:
    """The last move of a shard this broker copied out: how many catch-up passes ran and
    what they sent while writes were still taken, what was sent under the fence (the
    hold covers only that), and the time from the fence to the successor's install."""

    generation: int
    passes: int
    precopied_bytes: int
    fenced_bytes: int
    fenced_s: float


class MoveService:
    """The broker's part in planned moves (see the module docs)."""

    def __init__(
        self,
        *,
        view: FleetView,
        dialer: PeerDialer,
        storage: ShardStorage,
        report: Report,
        catchup_bytes: int = 1 << 20,
        catchup_passes: int = 8,
    ) -> None:
        self._view = view
        self._dialer = dialer
        self._storage = storage
        self._report = report
        # A catch-up pass that sent at most this many bytes is the last one (or after
        # this many passes): the fence follows, and only the last delta is sent under it.
        self._catchup_bytes = catchup_bytes
        self._catchup_passes = catchup_passes
        self._copies: dict[tuple[ShardId, int], asyncio.Task[None]] = {}
        self._outgoing: dict[ShardId, _Outgoing] = {}
        self._staged: dict[ShardId, _Staged] = {}
        self.stats: dict[ShardId, MoveStats] = {}  # the last move out of each shard
        self._install_lock = asyncio.Lock()
        self._discards: set[asyncio.Task[None]] = set()
        self.discarded = 0  # stale copies this broker removed after a cut-over (old leader)
        self.copied = 0  # moves this broker copied out (old leader)
        self.installed = 0  # copies this broker installed (successor)

    @property
    def node_id(self) -> str:
        return self._view.snapshot.node_id

    async def close(self) -> None:
        tasks = [*self._copies.values(), *self._discards]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the view's changes (a listener of FleetView) ---------------------------------

    def on_change(self, previous: RoutingSnapshot, current: RoutingSnapshot) -> None:
        me = current.node_id
        for shard in self._changed(previous, current):
            route = current.route(shard)
            if previous.leads(shard) and not current.leads(shard):
                moved_to = self._moved_to(current, shard)
                ended = self._storage.end_readers(shard, moved_to)
                if ended:
                    _log.info("shard %s left this broker: %d reader(s) ended", shard, ended)
            before = previous.route(shard)
            if (
                before is not None
                and route is not None
                and before.state is AssignmentState.MOVING
                and before.leader == me
                and before.successor == route.leader
                and route.leader != me
                and route.state is AssignmentState.ACTIVE
            ):
                # Cut over to the successor: this broker's copy is stale from now on.
                task = asyncio.get_running_loop().create_task(
                    self._discard(shard, route.generation), name=f"move-discard-{shard.name}"
                )
                self._discards.add(task)
                task.add_done_callback(self._discards.discard)
            if (
                before is not None
                and before.successor == me
                and before.leader != me
                and (route is None or (route.successor != me and route.leader != me))
            ):
                self._abandon(shard)  # cancelled, or retaken: what was staged is dropped
            if (
                route is not None
                and route.state in (AssignmentState.MOVING, AssignmentState.ACTIVE)
                and route.leader == me
                and route.successor not in (None, me)
            ):
                key = (shard, route.generation)
                if key not in self._copies:
                    step = self._copy if route.state is AssignmentState.MOVING else self._catch_up
                    task = asyncio.get_running_loop().create_task(
                        step(shard, route.generation), name=f"move-copy-{shard.name}"
                    )
                    self._copies[key] = task
                    task.add_done_callback(self._forget_copy(key))
            elif route is None or route.successor is None or route.leader != me:
                self._outgoing.pop(shard, None)

    def _forget_copy(self, key: tuple[ShardId, int]) -> Callable[[asyncio.Task[None]], None]:
        def forget(_task: asyncio.Task[None]) -> None:
            self._copies.pop(key, None)

        return forget

    @staticmethod
    def _changed(previous: RoutingSnapshot, current: RoutingSnapshot) -> Iterable[ShardId]:
        for shard, route in current.routes.items():
            if previous.routes.get(shard) != route:
                yield shard

    @staticmethod
    def _moved_to(snapshot: RoutingSnapshot, shard: ShardId) -> tuple[str | None, str | None, int]:
        """(node_id, addr, generation) a reader of `shard` is told at its end: the
        successor during a move, the leader after; nobody when it is this broker
        (a lapsed lease: the client finds the shard again)."""
        route = snapshot.route(shard)
        if route is None:
            return None, None, 0
        target = route.successor if in_a_move(route) else route.leader
        if target is None or (target == snapshot.node_id and not in_a_move(route)):
            return None, None, route.generation
        member = snapshot.members.get(target)
        addr = member.client_addr or None if member is not None else None
        return target, addr, route.generation

    # -- the old leader: catch up, then copy the last delta under the fence -------------

    def _catching_up(self, shard: ShardId, generation: int) -> Member | None:
        """The successor while `shard` is still in its catch-up at `generation` (active,
        led here, a successor named); None once fenced, cancelled or replaced."""
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        if (
            route is None
            or route.generation != generation
            or route.state is not AssignmentState.ACTIVE
            or route.leader != snapshot.node_id
            or route.successor in (None, snapshot.node_id)
        ):
            return None
        assert route.successor is not None
        return snapshot.members.get(route.successor)

    def _still_moving(self, shard: ShardId, generation: int) -> Member | None:
        """The successor while `shard` is still fenced at `generation` with this broker
        leading it; None once the move was cut over, cancelled or replaced."""
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        if (
            route is None
            or route.generation != generation
            or route.state is not AssignmentState.MOVING
            or route.leader != snapshot.node_id
            or route.successor is None
        ):
            return None
        return snapshot.members.get(route.successor)

    async def _catch_up(self, shard: ShardId, generation: int) -> None:
        """Copy `shard` to its successor while it is still served here: bounded passes,
        each sending what was appended since the previous one, until one pass sent at
        most `catchup_bytes` (or `catchup_passes` ran); then ask for the fence."""
        delay = 0.1
        for attempt in range(1, _COPY_ATTEMPTS + 1):
            successor = self._catching_up(shard, generation)
            if successor is None:
                return  # fenced, cancelled or replaced meanwhile
            outgoing = _Outgoing(successor.node_id)
            self._outgoing[shard] = outgoing
            passes = total = 0
            try:
                while passes < self._catchup_passes:
                    if self._catching_up(shard, generation) is None:
                        return
                    sent, _ = await self._send_delta(
                        shard, generation, successor, outgoing, final=False
                    )
                    passes += 1
                    total += sent
                    if sent <= self._catchup_bytes:
                        break
                outgoing.passes, outgoing.precopied = passes, total
                caught_up = MoveCaughtUp(
                    request_id=outgoing.next_id(),
                    passes=passes,
                    bytes=total,
                    **_common(shard, generation),
                )
                await self._exchange(successor, caught_up, MoveDoneOk)
            except (PeerUnavailableError, _Refused, OSError) as exc:
                _log.warning(
                    "catch-up of %s to %s, attempt %d: %s", shard, successor.node_id, attempt, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            _log.info(
                "caught up %s on %s: %d pass(es), %d bytes; asking for the fence",
                shard,
                successor.node_id,
                passes,
                total,
            )
            return
        _log.error(
            "catch-up of %s at generation %d failed %d times; the shard stays served here "
            "until the move is cancelled",
            shard,
            generation,
            _COPY_ATTEMPTS,
        )

    async def _copy(self, shard: ShardId, generation: int) -> None:
        storage = self._storage
        loop = asyncio.get_running_loop()
        fenced_at = loop.time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SETTLE_S):
                await storage.settle()
        deadline = loop.time() + _READERS_S
        while storage.readers(shard) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await storage.release(shard)
        delay = 0.1
        for attempt in range(1, _COPY_ATTEMPTS + 1):
            successor = self._still_moving(shard, generation)
            if successor is None:
                return  # cancelled, or cut over by a copy sent earlier
            outgoing = self._outgoing.get(shard)
            if outgoing is None or outgoing.successor != successor.node_id:
                outgoing = self._outgoing[shard] = _Outgoing(successor.node_id)
            try:
                sent, files = await self._send_delta(
                    shard, generation, successor, outgoing, final=True
                )
                final = MoveFinal(
                    request_id=outgoing.next_id(),
                    files=files,
                    bytes=sent,
                    **_common(shard, generation),
                )
                await self._exchange(successor, final, MoveDoneOk)
            except (PeerUnavailableError, _Refused, OSError) as exc:
                _log.warning(
                    "move of %s to %s, attempt %d: %s", shard, successor.node_id, attempt, exc
                )
                # What the successor holds is unknown now: the next attempt sends it all.
                self._outgoing[shard] = _Outgoing(successor.node_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.copied += 1
            self._outgoing.pop(shard, None)
            self.stats[shard] = MoveStats(
                generation=generation,
                passes=outgoing.passes,
                precopied_bytes=outgoing.precopied,
                fenced_bytes=sent,
                fenced_s=loop.time() - fenced_at,
            )
            _log.info(
                "moved %s to %s: %d file(s); %d bytes before the fence, %d after",
                shard,
                successor.node_id,
                len(files),
                outgoing.precopied,
                sent,
            )
            return
        _log.error(
            "move of %s at generation %d: the copy failed %d times; the shard stays fenced "
            "until the move is cancelled",
            shard,
            generation,
            _COPY_ATTEMPTS,
        )

    async def _discard(self, shard: ShardId, generation: int) -> None:
        """Remove this broker's copy of `shard` once it was cut over to another broker
        (at `generation`): nothing would ever serve it, and a later move back brings a
        fresh copy. Kept if the shard came back here meanwhile."""
        root = self._storage.root
        if root is None or not self._storage.durable(shard):
            return
        async with self._install_lock:
            snapshot = self._view.snapshot
            route = snapshot.route(shard)
            if route is None or route.leader == snapshot.node_id or route.generation < generation:
                return
            await self._storage.release(shard)
            folders = [
                log_dir(root, area, shard.tenant, shard.namespace, shard.name, shard.shard)
                for area in _areas(shard)
            ]
            await asyncio.to_thread(_remove_folders, folders)
        self.discarded += 1
        _log.info(
            "removed the stale copy of %s after its cut-over (generation %d)", shard, generation
        )

    def _files(self, shard: ShardId) -> list[tuple[Area, Path, int, int]]:
        """(area, path, inode, size) of every file of `shard` now."""
        root = self._storage.root
        if root is None or not self._storage.durable(shard):
            return []
        out: list[tuple[Area, Path, int, int]] = []
        for area in _areas(shard):
            folder = log_dir(root, area, shard.tenant, shard.namespace, shard.name, shard.shard)
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if path.name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile (retention)
                    info = path.stat()
                    if stat.S_ISREG(info.st_mode):
                        out.append((area, path, info.st_ino, info.st_size))
        return out

    async def _send_delta(
        self,
        shard: ShardId,
        generation: int,
        successor: Member,
        outgoing: _Outgoing,
        *,
        final: bool,
    ) -> tuple[int, list[MoveFile]]:
        """Send what the successor lacks of each file: a segment (append-only while the
        log is open) from where the last pass stopped; a file replaced (another inode)
        or shorter from its start; in the final pass every other file whole. Returns the
        bytes sent and the files as they are now."""
        files = await asyncio.to_thread(self._files, shard)
        present = {(area, path.name) for area, path, _, _ in files}
        for gone in set(outgoing.sent) - present:
            del outgoing.sent[gone]
        sent = 0
        listed: list[MoveFile] = []
        for area, path, inode, size in files:
            key = (area, path.name)
            listed.append(MoveFile(area=area, path=path.name, size=size))
            held = outgoing.sent.get(key)
            append_only = path.suffix == ".log" or not final
            start = 0
            delta = held is not None and held.inode == inode and held.size <= size
            if (
                held is not None
                and delta
                and append_only
                and await asyncio.to_thread(_ends_with, path, held.size, held.tail)
            ):
                start = held.size
                if start == size:
                    continue
            prefix = held.tail if held is not None and start else b""
            tail = await self._send_file(
                shard, generation, successor, outgoing, area, path, start, size
            )
            outgoing.sent[key] = _Held(inode, size, (prefix + tail)[-_TAIL_BYTES:])
            sent += size - start
        return sent, listed

    async def _send_file(
        self,
        shard: ShardId,
        generation: int,
        successor: Member,
        outgoing: _Outgoing,
        area: Area,
        path: Path,
        start: int,
        end: int,
    ) -> bytes:
        """Send bytes [start, end) of `path` (a file of size 0: one empty chunk);
        returns the last `_TAIL_BYTES` of them."""
        position = start
        tail = b""
        with path.open("rb") as handle:
            handle.seek(start)
            while True:
                data = await asyncio.to_thread(handle.read, min(CHUNK_BYTES, end - position))
                if len(data) < min(CHUNK_BYTES, end - position):
                    raise _Refused(f"{path.name} shrank while it was sent")
                chunk = MoveChunk(
                    request_id=outgoing.next_id(),
                    area=area,
                    path=path.name,
                    position=position,
                    data=data,
                    **_common(shard, generation),
                )
                await self._exchange(successor, chunk, MoveChunkOk)
                position += len(data)
                tail = (tail + data)[-_TAIL_BYTES:]
                if position >= end:
                    return tail

    async def _exchange(self, successor: Member, message: PeerMessage, ok: type) -> None:
        answer = await self._dialer.request(successor.node_id, successor.peer_addr, message)
        if isinstance(answer, ok):
            return
        if isinstance(answer, ForwardRefused) and answer.refusal.error is not None:
            raise _Refused(answer.refusal.error.message)
        raise _Refused(f"unexpected answer {type(answer).__name__}")

    # -- the successor: stage and install --------------------------------------------------

    async def handle(self, message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        """Serve move_chunk, move_caught_up, move_final and move_done (the peer
        listener's table sends them here)."""
        assert isinstance(message, MoveChunk | MoveDone | MoveCaughtUp | MoveFinal)
        try:
            shard = _shard_of(message)
            fenced_only = isinstance(message, MoveDone | MoveFinal)
            await self._check(shard, message.generation, origin.node_id, fenced_only)
            if isinstance(message, MoveChunk):
                await self._stage(shard, message, origin.node_id)
                return MoveChunkOk(request_id=message.request_id)
            if isinstance(message, MoveCaughtUp):
                staged = self._adopt(shard, message.generation, origin.node_id)
                files = len(staged.files) if staged is not None else 0
                size = sum(staged.files.values()) if staged is not None else 0
                record = MoveCopied(generation=message.generation, files=files, bytes=size)
                await self._report(shard, record)
                return MoveDoneOk(request_id=message.request_id)
            if isinstance(message, MoveFinal):
                await self._install_final(shard, message, origin.node_id)
                return MoveDoneOk(request_id=message.request_id)
            await self._install(shard, message, origin.node_id)
            return MoveDoneOk(request_id=message.request_id)
        except _Refused as exc:
            error = PeerError(
                code=exc.code.wire,
                retry=RetryClass.RETRY.wire,
                message=str(exc),
                detail=ErrorDetail(reason="moving")
                if exc.code is ErrorCode.SHARD_UNAVAILABLE
                else None,
            )
            return ForwardRefused(
                request_id=message.request_id, refusal=ForwardRefusal(error=error)
            )
        except (OSError, ValueError) as exc:
            _log.error("move copy of %s: %s", message.name, exc)
            error = PeerError(
                code=ErrorCode.STORAGE.wire,
                retry=RetryClass.RETRY.wire,
                message=f"the successor could not stage the copy: {exc}",
            )
            return ForwardRefused(
                request_id=message.request_id, refusal=ForwardRefusal(error=error)
            )

    async def _check(self, shard: ShardId, generation: int, sender: str, fenced: bool) -> None:
        """The shard must be moving (or, unless `fenced`, catching up) to this broker at
        `generation`, from `sender`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _ROUTE_WAIT_S
        while True:
            route = self._view.snapshot.route(shard)
            if route is not None and route.generation >= generation:
                break
            left = deadline - loop.time()
            if left <= 0:
                raise _Refused(f"no move of {shard.name} at generation {generation} seen here")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._view.wait_changed()
        states = (
            {AssignmentState.MOVING} if fenced else {AssignmentState.MOVING, AssignmentState.ACTIVE}
        )
        if (
            route.generation != generation
            or route.state not in states
            or route.successor != self.node_id
            or route.leader != sender
        ):
            raise _Refused(
                f"{shard.name} shard {shard.shard} is not moving from {sender} to "
                f"{self.node_id} at generation {generation}"
            )

    def _target(self, shard: ShardId, area: Area) -> Path:
        root = self._storage.root
        if root is None:
            raise _Refused("this broker keeps no durable storage", ErrorCode.INVALID_REQUEST)
        return log_dir(root, area, shard.tenant, shard.namespace, shard.name, shard.shard)

    def _staging(self, shard: ShardId, area: Area) -> Path:
        target = self._target(shard, area)
        return target.parent / f".{target.name}.incoming"

    def _adopt(self, shard: ShardId, generation: int, sender: str) -> _Staged | None:
        """What is staged of `shard` from `sender`, carried on to `generation` (a
        catch-up's copy goes on under the fence); None when nothing is."""
        staged = self._staged.get(shard)
        if staged is None or staged.sender != sender or staged.generation > generation:
            return None
        staged.generation = generation
        return staged

    async def _stage(self, shard: ShardId, chunk: MoveChunk, sender: str) -> None:
        area = chunk.area
        if area not in _areas(shard):
            raise _Refused(
                f"no storage area {area!r} for a {shard.kind.value}", ErrorCode.INVALID_REQUEST
            )
        name = chunk.path
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise _Refused(f"bad file name {name!r}", ErrorCode.INVALID_REQUEST)
        staged = self._adopt(shard, chunk.generation, sender)
        if staged is None:
            # Nothing staged from this sender: start afresh (no leftover may be installed).
            await asyncio.to_thread(self._clear_staging, shard)
            staged = self._staged[shard] = _Staged(sender, chunk.generation, {})
        folder = self._staging(shard, area)
        if chunk.position > staged.files.get((area, name), 0):
            raise _Refused(f"{name}: a piece at {chunk.position} past what is staged")

        def write() -> None:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            mode = "wb" if chunk.position == 0 else "r+b"
            with path.open(mode) as handle:
                handle.seek(chunk.position)
                handle.write(chunk.data)
                handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())

        await asyncio.to_thread(write)
        staged.files[(area, name)] = chunk.position + len(chunk.data)

    def _clear_staging(self, shard: ShardId) -> None:
        if self._storage.root is None:
            return
        for area in _areas(shard):
            staging = self._staging(shard, area)
            if staging.exists():
                shutil.rmtree(staging)

    def _abandon(self, shard: ShardId) -> None:
        """A move to this broker ended without a cut-over here: drop what was staged."""
        if self._staged.pop(shard, None) is None:
            return
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._clear_staging, shard), name=f"move-unstage-{shard.name}"
        )
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)

    async def _install_final(self, shard: ShardId, final: MoveFinal, sender: str) -> None:
        staged = self._adopt(shard, final.generation, sender) or _Staged(
            sender, final.generation, {}
        )
        wanted = {(f.area, f.path): f.size for f in final.files}
        for area, _name in wanted:
            if area not in _areas(shard):
                raise _Refused(f"no storage area {area!r} for a {shard.kind.value}")
        if self._storage.root is None or not self._storage.durable(shard):
            on_disk: dict[tuple[str, str], int] = {}
        else:
            on_disk = await asyncio.to_thread(self._match_staging, shard, wanted)
        for key in set(staged.files) - set(wanted):  # gone at the sender (retention)
            del staged.files[key]
        if on_disk != wanted or (wanted and staged.files != wanted):
            self._staged.pop(shard, None)
            raise _Refused(
                f"the staged copy of {shard.name} is not the sender's ({len(on_disk)} "
                f"file(s) staged, {len(wanted)} listed, or sizes differ)"
            )
        await self._install(
            shard,
            MoveDone(
                request_id=final.request_id,
                files=len(wanted),
                bytes=sum(wanted.values()),
                **_common(shard, final.generation),
            ),
            sender,
        )

    def _match_staging(
        self, shard: ShardId, wanted: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """Remove staged files `wanted` does not list; the (area, name) -> size of the
        staged files that remain, as the disk has them."""
        found: dict[tuple[str, str], int] = {}
        for area in _areas(shard):
            folder = self._staging(shard, area)
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                key = (area, path.name)
                if key not in wanted:
                    path.unlink()
                    continue
                found[key] = path.stat().st_size
        return found

    async def _install(self, shard: ShardId, done: MoveDone, sender: str) -> None:
        staged = self._adopt(shard, done.generation, sender) or _Staged(sender, done.generation, {})
        self._staged.pop(shard, None)
        if len(staged.files) != done.files:
            raise _Refused(
                f"staged {len(staged.files)} file(s) of {shard.name}, the sender sent {done.files}"
            )
        async with self._install_lock:
            await self._storage.release(shard)
            if self._storage.root is not None and self._storage.durable(shard):

                def replace() -> None:
                    for area in _areas(shard):
                        target = self._target(shard, area)
                        staging = self._staging(shard, area)
                        # Only what was sent is installed (a staged file the sender no
                        # longer has was dropped by the checks above).
                        _install_folder(staging, target)

                await asyncio.to_thread(replace)
            await self._report(
                shard, MoveCopied(generation=done.generation, files=done.files, bytes=done.bytes)
            )
        self.installed += 1
        _log.info("installed the copy of %s (generation %d)", shard, done.generation)


class ServiceStorage:
    """`ShardStorage` over the broker's services (built by the composition root)."""

    def __init__(
        self,
        *,
        root: Path | None,
        stream_durable: Callable[[ShardId], bool],
        cache_durable: bool,
        streams: Callable[[], _Streams | None],
        engine: Callable[[], _Engine | None],
        groups: Callable[[], _Groups | None],
        cache: Callable[[], _Cache | None],
        states: Callable[[], list[Any]],
    ) -> None:
        self.root = root
        self._stream_durable = stream_durable
        self._cache_durable = cache_durable
        self._streams = streams
        self._engine = engine
        self._groups = groups
        self._cache = cache
        self._states = states

    def durable(self, shard: ShardId) -> bool:
        if self.root is None:
            return False
        if shard.kind is ShardKind.CACHE:
            return self._cache_durable
        return self._stream_durable(shard)

    @staticmethod
    def _key(shard: ShardId) -> tuple[str, str, str, int]:
        return (shard.tenant, shard.namespace, shard.name, shard.shard)

    def end_readers(self, shard: ShardId, moved_to: tuple[str | None, str | None, int]) -> int:
        if shard.kind is ShardKind.CACHE:
            cache = self._cache()
            return cache.end_shard_watches(self._key(shard), moved_to) if cache else 0
        streams = self._streams()
        if streams is None:
            return 0
        return streams.end_shard_subscriptions(self._states(), self._key(shard), moved_to)

    def readers(self, shard: ShardId) -> int:
        if shard.kind is ShardKind.CACHE:
            cache = self._cache()
            return cache.shard_watches(self._key(shard)) if cache else 0
        engine = self._engine()
        return engine.shard_subscribers(*self._key(shard)) if engine else 0

    async def settle(self) -> None:
        engine = self._engine()
        if engine is not None:
            await engine.drain()

    async def release(self, shard: ShardId) -> None:
        key = self._key(shard)
        if shard.kind is ShardKind.CACHE:
            cache = self._cache()
            if cache is not None:
                await cache.release_shard(*key)
            return
        groups = self._groups()
        if groups is not None:
            await groups.release_shard(*key)
        engine = self._engine()
        if engine is not None:
            engine.release_shard(*key)


class _Streams(Protocol):
    def end_shard_subscriptions(
        self,
        states: list[Any],
        key: tuple[str, str, str, int],
        moved_to: tuple[str | None, str | None, int],
    ) -> int: ...


class _Engine(Protocol):
    async def drain(self) -> None: ...

    def shard_subscribers(self, tenant_id: str, namespace: str, stream: str, index: int) -> int: ...

    def release_shard(self, tenant_id: str, namespace: str, stream: str, index: int) -> None: ...


class _Groups(Protocol):
    async def release_shard(
        self, tenant_id: str, namespace: str, stream: str, index: int
    ) -> None: ...


class _Cache(Protocol):
    def end_shard_watches(
        self, key: tuple[str, str, str, int], moved_to: tuple[str | None, str | None, int]
    ) -> int: ...

    def shard_watches(self, key: tuple[str, str, str, int]) -> int: ...

    async def release_shard(
        self, tenant_id: str, namespace: str, cache: str, index: int
    ) -> None: ...
