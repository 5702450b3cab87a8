"""The nemesis: bounded faults, one at a time, chosen by a seeded RNG.

Each round: a quiet spell, then one fault held for a bounded time, then its heal,
then a liveness check (every shard of every stream and cache served again, and an
acknowledged publish through every broker, within `liveness_bound` seconds).
The same seed gives the same sequence of choices (faults, targets, holds); what
the fleet does meanwhile is the run's own.

Faults (`FaultKind`):

- ``kill``: ``kill -9`` of a broker (the owner of a checked log shard, the RF1
  log's or the Quorum log's leader, or another one), down for the hold, then
  restarted on the same data folder and ports;
- ``pause``: SIGSTOP, then SIGCONT after the hold (past the 3 s lease TTL, the
  broker's shards go unavailable meanwhile);
- ``link``: drop, reset or stall the link interposer's flows (clients entering
  through it) for the hold;
- ``etcd``: etcd stopped by its PID for the hold, then started on the same data;
- ``fsync_slow``: the broker's fault file makes every fsync sleep 50–500 ms;
- ``fsync_fail``: every fsync fails (EIO); a failed log acknowledges nothing until
  reopened, so the heal is a ``kill -9`` and a restart;
- ``partition``: broker-to-broker messages lost (the fault files' ``peer_blocked_out``
  / ``peer_blocked_in``, applied by every peer message: replication, forwarding,
  moves), between the target and every other broker or one other, both ways or one
  way (out: the target's messages lost, it still hears; in: it hears nothing, its
  own messages arrive). A one-way cut is written on either end at random (the
  sender's ``out`` or the receiver's ``in``), so both halves of the peer layer are
  exercised. Clients and etcd still reach every broker: leases hold, nothing fails
  over, Quorum writes on a cut leader time out (outcome unknown) and forwards
  across the cut fail; the heal clears the files;
- ``clock``: the target's wall clock jumps 1 s to 10 min forward or back (its fault
  file's ``clock_offset_ms``: append times, cache TTLs, log stamps; never monotonic
  timers or leases) for the hold, then jumps back to the host's time. Checked by the
  checker's ``append_time_order`` (a log's append times never decrease).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import signal
from dataclasses import dataclass, field

import msgspec

from felix_broker.chaos.faults import Faults, FsyncFault
from felix_broker.fixture.link import Fault
from felix_client import Client
from felix_client.errors import BrokerError, ClientError

from .fleet import BrokerProcess, ChaosFleet, FleetError

__all__ = ["FaultEvent", "FaultKind", "Nemesis"]

_log = logging.getLogger(__name__)


class FaultKind(enum.Enum):
    KILL = "kill"
    PAUSE = "pause"
    LINK = "link"
    ETCD = "etcd"
    FSYNC_SLOW = "fsync_slow"
    FSYNC_FAIL = "fsync_fail"
    PARTITION = "partition"
    CLOCK = "clock"


class Cut(enum.Enum):
    """Which messages of a partition are lost, seen from its target."""

    BOTH = "both ways"
    OUT = "one way, out"  # the target's messages to the others
    IN = "one way, in"  # the others' messages to the target


# Faults that stop a broker (its lease may lapse: a failover); the others keep it a member.
_FAILOVER_KINDS = frozenset({FaultKind.KILL, FaultKind.PAUSE, FaultKind.FSYNC_FAIL})


class FaultEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One injected fault, on the history's clock."""

    kind: str
    target: str
    start: float
    healed: float
    detail: str = ""
    recovered_s: float | None = None  # heal to every shard serving (None: not within bound)


@dataclass
class Nemesis:
    fleet: ChaosFleet
    rng: random.Random
    kinds: tuple[FaultKind, ...] = tuple(FaultKind)
    quiet: tuple[float, float] = (1.0, 4.0)
    hold: tuple[float, float] = (0.5, 4.0)
    liveness_bound: float = 45.0
    roles: tuple[str, ...] = ("owner", "other")  # whom broker faults may hit
    # Kills, pauses and failed disks never hit the Quorum log's leader (see `_failover`
    # for why); partitions and clock jumps still may (no lease lapses).
    spare_quorum_leader: bool = False
    owners: Client | None = None  # asks which broker owns a log shard
    events: list[FaultEvent] = field(default_factory=list)
    liveness_failures: list[str] = field(default_factory=list)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop` is set (a round under way finishes, healed)."""
        while not stop.is_set():
            quiet = self.rng.uniform(*self.quiet)
            try:
                async with asyncio.timeout(quiet):
                    await stop.wait()
                return
            except TimeoutError:
                pass
            await self.round()

    async def _target(self, spare: bool) -> tuple[BrokerProcess, str, str | None]:
        """The owner (leader) of a random checked log's shard (by the routing the
        fleet reports), or another broker: the nemesis's choice, the owner taken from
        the fleet. A Quorum log's leader killed or paused is a failover. The third
        item is the stream whose owner was picked (None for another broker). With
        `spare` (a fault that may fail the target over) and `spare_quorum_leader`,
        never the Quorum log's leader."""
        role = self.rng.choice(self.roles)
        pick = self.rng.randrange(len(self.fleet.brokers))
        owner: BrokerProcess | None = None
        if self.owners is not None:
            stream, shards = self.rng.choice(self.fleet.layout.logs)
            shard = self.rng.randrange(shards)
            try:
                async with asyncio.timeout(5.0):
                    answer = await self.owners.shard_owners(stream)
                addr = next((o.addr for o in answer if o.shard == shard), None)
                owner = self.fleet.by_addr(addr) if addr else None
            except (BrokerError, ClientError, TimeoutError, OSError) as exc:
                _log.info("nemesis: no owner known: %s", exc)
        if role == "owner" and owner is not None:
            chosen, picked = owner, stream
        else:
            others = [b for b in self.fleet.brokers if b is not owner]
            chosen, picked, role = others[pick % len(others)], None, "other"
        spared = await self._quorum_leader() if spare and self.spare_quorum_leader else None
        if spared is not None and chosen is spared:
            others = [b for b in self.fleet.brokers if b is not spared]
            return others[pick % len(others)], "other, the Quorum leader spared", None
        return chosen, role, picked

    async def _quorum_leader(self) -> BrokerProcess | None:
        stream = self.fleet.layout.quorum_stream
        if stream is None or self.owners is None:
            return None
        try:
            async with asyncio.timeout(5.0):
                answer = await self.owners.shard_owners(stream)
        except (BrokerError, ClientError, TimeoutError, OSError) as exc:
            _log.info("nemesis: no Quorum leader known: %s", exc)
            return None
        addr = next((o.addr for o in answer if o.shard == 0), None)
        return self.fleet.by_addr(addr) if addr else None

    async def _failover(self, stream: str | None, old: BrokerProcess) -> str:
        """Wait (bounded) until a follower of the Quorum shard leads and serves.

        A candidate that finds another replica further ahead refuses to open
        (`PromotionRefused`, naming who is ahead), reports it under its own lease,
        and the placer then promotes the replica named ahead, so the shard does not
        stay ``not_ready`` (runs without `spare_quorum_leader`, 2026-12-01: 11 of 11
        failovers of the Quorum leader after kill, pause or failed fsync served
        within 0.1-3.4 s). The old leader returns only after the failover: a leader
        coming back while its successor is still fencing is not exercised.
        `spare_quorum_leader` keeps broker faults off the Quorum leader for runs
        that must stay short (a failover round may wait up to `liveness_bound`)."""
        assert stream is not None
        began = self._now()
        ok = await self.fleet.wait_successor(stream, old.addr, self.liveness_bound)
        took = self._now() - began
        if not ok:
            self.liveness_failures.append(
                f"no follower of {stream} served within {self.liveness_bound:.0f} s "
                f"of {old.node_id}'s loss"
            )
            return f", no failover within {took:.1f} s"
        return f", failover {took:.1f} s"

    def _partition(self, target: BrokerProcess) -> str:
        """Cut `target` off from every other broker or from one, both ways or one way,
        by writing the fault files; returns what was cut (for the fault log)."""
        others = [b for b in self.fleet.brokers if b is not target]
        if self.rng.random() < 0.5:
            peers, whom = others, "every other broker"
        else:
            peer = self.rng.choice(others)
            peers, whom = [peer], peer.node_id
        cut = self.rng.choice(tuple(Cut))
        names = frozenset(b.node_id for b in peers)
        me = frozenset({target.node_id})
        on_target = cut is Cut.BOTH or self.rng.random() < 0.5
        if cut is Cut.BOTH:
            target.set_fault(Faults(blocked_out=names, blocked_in=names))
            written = f"{target.node_id}'s file"
        elif on_target:
            target.set_fault(
                Faults(blocked_out=names) if cut is Cut.OUT else Faults(blocked_in=names)
            )
            written = f"{target.node_id}'s file"
        else:  # the same cut, written at the other end
            for peer in peers:
                peer.set_fault(Faults(blocked_in=me) if cut is Cut.OUT else Faults(blocked_out=me))
            written = "the peers' files"
        arrow = {Cut.BOTH: "<->", Cut.OUT: "->", Cut.IN: "<-"}[cut]
        return f"partition {target.node_id} {arrow} {whom} ({cut.value}, in {written})"

    async def round(self) -> FaultEvent:
        kind = self.rng.choice(self.kinds)
        hold = self.rng.uniform(*self.hold)
        broker, role, stream = await self._target(kind in _FAILOVER_KINDS)
        start = self._now()
        detail = f"{role}, {hold:.1f} s"
        target = broker.node_id
        # A Quorum leader killed or paused returns only once a follower leads and
        # serves (see `_failover`).
        failover = stream is not None and stream == self.fleet.layout.quorum_stream
        if kind is FaultKind.KILL:
            await broker.kill()
            await asyncio.sleep(hold)
            if failover:
                detail += await self._failover(stream, broker)
            await broker.start()
        elif kind is FaultKind.PAUSE:
            broker.signal(signal.SIGSTOP)
            await asyncio.sleep(hold)
            if failover:
                detail += await self._failover(stream, broker)
            broker.signal(signal.SIGCONT)
        elif kind is FaultKind.LINK:
            fault = self.rng.choice(tuple(Fault))
            target, detail = "link", f"{fault.value} in front of node-1, {hold:.1f} s"
            self.fleet.link.apply(fault, int(hold * 1000))
            await asyncio.sleep(hold)
            self.fleet.link.heal()
        elif kind is FaultKind.ETCD:
            target = "etcd"
            await asyncio.to_thread(self.fleet.etcd.stop)
            await asyncio.sleep(hold)
            await asyncio.to_thread(self.fleet.etcd.start)
        elif kind is FaultKind.FSYNC_SLOW:
            delay = self.rng.randint(50, 500)
            detail += f", {delay} ms per fsync"
            broker.set_fault(FsyncFault(delay_ms=delay))
            await asyncio.sleep(hold)
            broker.set_fault(FsyncFault())
        elif kind is FaultKind.PARTITION:
            cut = self._partition(broker)
            detail = f"{role}, {cut}, {hold:.1f} s"
            await asyncio.sleep(hold)
            for member in self.fleet.brokers:
                member.set_fault(Faults())
        elif kind is FaultKind.CLOCK:
            jump_ms = self.rng.choice((-1, 1)) * self.rng.randint(1_000, 600_000)
            detail += f", clock {jump_ms / 1000:+.1f} s"
            broker.set_fault(Faults(clock_offset_ms=jump_ms))
            await asyncio.sleep(hold)
            broker.set_fault(Faults())
        else:
            broker.set_fault(FsyncFault(fail=True))
            await asyncio.sleep(hold)
            broker.set_fault(FsyncFault())
            await broker.kill()
            await broker.start()
            detail += ", then kill -9 and restart"
        healed = self._now()
        recovered: float | None
        try:
            recovered = await self.fleet.wait_ready(self.liveness_bound)
        except FleetError as exc:
            recovered = None
            self.liveness_failures.append(f"{kind.value} on {target}: {exc}")
            await self.fleet.heal()  # whatever is left, so the run goes on
        event = FaultEvent(
            kind=kind.value,
            target=target,
            start=start,
            healed=healed,
            detail=detail,
            recovered_s=recovered,
        )
        self.events.append(event)
        _log.info("nemesis: %s", event)
        return event
