"""The replication core of one shard on one broker: a sans-IO state machine.

A shard has a replica set (node ids) and, at each generation, at most one
leader. The generation comes from outside (the etcd `mod_revision` of the
shard's assignment key: strictly increasing, never reused), so two promotions
never share one. Everything the core does is an answer to an input:

- `append(request_id, payloads, now)`: a client's Quorum write, at the leader;
- `promote(generation, now)`: the control plane made this replica leader;
- `receive(message, now)`: a peer message (ship, ship answers, fence, fence answers);
- `synced(length)`: the log's first `length` records are now on disk (fsync done);
- `applied(length)`: the log's first `length` records are applied to the shard's
  stream log (the driver's apply task; in-memory entries below it may go);
- `tick(now)`: time passed (retransmissions, `quorum_timeout`);
- `lease_expired()` / `lease_renewed()`: the broker's etcd lease lapsed / came back;
- `Replica.recover(...)`: a restart from what the disk kept.

Each returns a list of effects, to be carried out in order: `Send` a peer
message, `WriteRecords` / `Truncate` / `PersistBallot` on the disk (a truncation
and a ballot are synchronous: fsynced before the next effect; records are
durable only once `synced` says so), and client outcomes (`Acked`, `Refused`)
and `PromotionRefused` / `Halted` for the fleet; `ShipStored` (ship records the
core no longer holds in memory, read from the disk) and `CompactLog` (the disk may
drop its records below an offset).

**The bound on what is held.** In memory the core keeps only the records from
`base`: `base` is the least of what is applied (`applied`), committed (`commit`)
and durable here (`synced_length`), so every record below it is on this
replica's disk, committed, and in the stream log. What remains in memory is the
uncommitted suffix plus what is committed but not yet applied. The leader bounds
the uncommitted suffix: an append that would take it past
`Config.max_uncommitted` records is refused `overloaded` (retry after; nothing
written), so a leader that has lost its majority holds at most that many
records, never an unbounded log. A follower holds at most what a leader shipped
past the mark. A follower behind `base` is shipped from the disk (`ShipStored`:
the adapter reads the records and sends an ordinary ship), so lagging costs disk
reads, not memory.

**Compaction of the replication log file.** The disk keeps the records from
`stored_from`. The leader moves it to the least of `base` and every follower's
`durable` (what all replicas hold through a crash, committed and applied here), and tells the
followers in each ship (`compacted`); a follower moves its own to the least of
that and its `base`. `CompactLog(length)` says the disk may drop what is below.
Every record below `stored_from` is held by every replica, so no ship ever needs
it. A follower that never comes back (a dead replica not yet replaced) holds
`stored_from` where it stopped: the disk file then grows with the stream log
(bounded by the stream's own retention only); rebuilding such a follower from
the stream log instead is not implemented.

The rules (the design the fleet serves; decision `quorum-ack-model` in
spec/messages.yaml):

- **The quorum mark.** A write is acknowledged once a majority of the replica
  set, the leader included, holds it durably at the leader's generation: the
  leader's own fsynced length and each follower's `ShipOk.durable` (its fsynced
  length of the prefix it verified against this leader). No coordinator write is
  on this path: safety comes from promotion fencing a majority at the new
  generation instead (majority overlap).
- **Generation-start record.** A new leader appends a record of its own
  generation first, and the mark counts a majority only at a record of the
  leader's generation (Raft's figure-8 rule), so the first mark of a generation
  also commits everything before it. Until then the leader is *settling*: it
  takes writes but serves no reads (`not_ready`).
- **Promotion only of a caught-up replica.** The candidate persists its ballot,
  fences every replica (each persists the ballot and refuses older leaders from
  then on) and, on the first majority of answers (itself included), opens only
  if no answer shows a log further ahead by (generation of the last record,
  length). Otherwise it refuses the promotion (`PromotionRefused`, naming who is
  ahead) and the shard stays unavailable until the fleet promotes another: it is
  never served empty or short.
- **Followers keep a prefix of the leader's log.** A ship carries the offset and
  generation of the record before it; a follower that does not hold that record
  answers where to resume, and one that holds a different record at an offset the
  ship covers truncates from there (what it never had committed) before writing.
  A conflict below the follower's known mark is impossible in a correct fleet;
  the follower halts rather than lose a committed record.
- **Each record is shipped once while its ship is unanswered.** A follower's
  `next_offset` moves past every ship sent; at most `Config.ship_window` ships
  wait for an answer (the next append or answer ships what is new, up to
  `ship_max_records`); an answer frees the ships it covers. A ship unanswered for
  `retransmit_ms` is resent from its start (one ship), and a refusal answering a
  ship sent before such a resend is not acted on. So N writes in flight cost a
  bounded number of ships per follower, not N overlapping ones.
- **Readers stop at the mark**: `read` answers records below it only, skipping
  generation-start records (they take an offset and are never delivered).
- **Refusals.** Not the leader: `not_leader` (redirect; nothing written). Lease
  lapsed: `shard_unavailable/fenced` (retry; nothing written), and writes already
  waiting get `leadership_lost` (outcome unknown). No majority within
  `quorum_timeout_ms`: `quorum_timeout` (outcome unknown: the record may still
  commit). Deposed while waiting: `leadership_lost`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import ShipRefusal  # the catalogued refusal reasons (spec/fleet.yaml)

__all__ = [
    "Acked",
    "CompactLog",
    "Config",
    "DiskImage",
    "Effect",
    "Entry",
    "Fence",
    "FenceOk",
    "FenceRefused",
    "Halted",
    "Message",
    "PeerProgress",
    "PersistBallot",
    "Phase",
    "PromotionRefused",
    "ReadResult",
    "Refused",
    "Replica",
    "Send",
    "Ship",
    "ShipOk",
    "ShipRefusal",
    "ShipRefused",
    "ShipStored",
    "Truncate",
    "WriteRecords",
]


# --- records, messages, effects ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One record: the generation that *wrote* it (kept when shipped), its payload,
    and whether it is a generation-start record (takes an offset, never delivered)."""

    generation: int
    payload: bytes
    start: bool = False


@dataclass(frozen=True, slots=True)
class Ship:
    """Leader to follower: records from `offset`; `prev_generation` labels the record
    at `offset - 1` (0 when `offset` is 0); `commit` is the leader's mark."""

    generation: int
    leader: str
    offset: int
    prev_generation: int
    entries: tuple[Entry, ...]
    commit: int
    compacted: int = 0  # every replica holds the records below: the disk may drop them


@dataclass(frozen=True, slots=True)
class ShipOk:
    """Follower to leader: it holds the leader's log up to `matched`, and durably up
    to `durable` (never more than `matched`)."""

    generation: int
    sender: str
    durable: int
    matched: int


@dataclass(frozen=True, slots=True)
class ShipRefused:
    generation: int
    sender: str
    refusal: ShipRefusal
    resume_at: int = 0


@dataclass(frozen=True, slots=True)
class Fence:
    """A candidate at `generation` asks a replica to refuse older leaders."""

    generation: int
    candidate: str


@dataclass(frozen=True, slots=True)
class FenceOk:
    """The replica persisted the ballot; its log's last record generation and length."""

    generation: int
    sender: str
    last_generation: int
    length: int


@dataclass(frozen=True, slots=True)
class FenceRefused:
    generation: int  # the newer generation the replica holds
    sender: str


Message = Ship | ShipOk | ShipRefused | Fence | FenceOk | FenceRefused


@dataclass(frozen=True, slots=True)
class Send:
    to: str
    message: Message


@dataclass(frozen=True, slots=True)
class WriteRecords:
    """Write `entries` at `offset` (the log's length at that point; not yet durable)."""

    offset: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    """Cut the log to `length` records, synchronously (before the next effect)."""

    length: int


@dataclass(frozen=True, slots=True)
class PersistBallot:
    """Persist (generation, leader) synchronously; `leader` is None when not known yet."""

    generation: int
    leader: str | None


@dataclass(frozen=True, slots=True)
class Acked:
    """A client write is committed: held durably by a majority at `generation`."""

    request_id: int
    first_offset: int
    count: int
    generation: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A client write answered without an acknowledgement; `retry` says whether it
    may have been applied (outcome_unknown) or definitely was not."""

    request_id: int
    code: ErrorCode
    retry: RetryClass
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PromotionRefused:
    """The candidate is behind `ahead`: it does not open; promote one of those."""

    generation: int
    ahead: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Halted:
    """A ship conflicts below this follower's known mark: it stops replicating."""

    generation: int
    offset: int


@dataclass(frozen=True, slots=True)
class ShipStored:
    """Ship `count` records from `offset` to `to`, read from the disk (they are below
    the core's in-memory `base`): the adapter fills in `entries` and the generation
    of the record at `offset - 1` and sends `Ship(generation, leader, offset, ...,
    commit, compacted)`."""

    to: str
    generation: int
    leader: str
    offset: int
    count: int
    commit: int
    compacted: int


@dataclass(frozen=True, slots=True)
class CompactLog:
    """The disk may drop every record below `length` (every replica holds them)."""

    length: int


Effect = (
    Send
    | WriteRecords
    | Truncate
    | PersistBallot
    | Acked
    | Refused
    | PromotionRefused
    | Halted
    | ShipStored
    | CompactLog
)


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Records below the mark from `offset`: (offset, payload), start records skipped;
    or a refusal (`code`, `reason`) when this replica cannot serve reads."""

    records: tuple[tuple[int, bytes], ...] = ()
    next_offset: int = 0
    code: ErrorCode | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class DiskImage:
    """What a restarted replica finds on disk: its ballot and its durable records from
    `base` (the records below were compacted away; `base_generation` labels the
    record at `base - 1`)."""

    ballot_generation: int = 0
    ballot_leader: str | None = None
    entries: tuple[Entry, ...] = ()
    base: int = 0
    base_generation: int = 0


@dataclass(frozen=True, slots=True)
class Config:
    quorum_timeout_ms: int = 5000  # FELIX_PUBLISH_QUORUM_TIMEOUT_MS
    retransmit_ms: int = 200  # resend an unanswered ship or fence after this long
    ship_max_records: int = 64  # records per ship (the bound on one message)
    ship_window: int = 4  # unanswered ships per follower; more wait for an answer
    max_uncommitted: int = 4096  # records a leader holds past its mark; more: overloaded
    # Deliberately broken, test mode only (FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY): the
    # mark counts the leader's own disk alone, so writes are acked before a majority.
    ack_before_majority: bool = False
    # Consistency `Leader` (decision `leader-consistency-replication`): a write is
    # acknowledged, applied and readable once the leader's own disk holds it (its
    # `mark`); followers get it asynchronously. The majority mark (`commit`) is kept
    # as in Quorum mode: it is what followers apply, what compaction and conflict
    # checks rest on, and what a failover never loses.
    leader_acks: bool = False

    def __post_init__(self) -> None:
        if (
            self.quorum_timeout_ms <= 0
            or self.retransmit_ms <= 0
            or self.ship_max_records <= 0
            or self.ship_window <= 0
            or self.max_uncommitted <= 0
        ):
            raise ValueError("replication timeouts, the ship size and bounds must be positive")


class Phase(enum.Enum):
    FOLLOWER = "follower"
    FENCING = "fencing"  # a candidate waiting for a majority of fence answers
    LEADER = "leader"  # settling while `mark` is None
    HALTED = "halted"


@dataclass(frozen=True, slots=True)
class PeerProgress:
    """A follower as its leader (or a candidate) knows it."""

    node_id: str
    next_offset: int
    matched: int
    durable: int
    fenced: bool | None = None  # while fencing: whether it answered the fence


@dataclass(slots=True)
class _Pending:
    request_id: int
    first_offset: int
    end: int  # offset after the write's last record
    deadline: int


@dataclass(frozen=True, slots=True)
class _InFlight:
    """A ship not yet answered: its records [start, end), sent at `sent_at`."""

    start: int
    end: int
    sent_at: int


@dataclass(slots=True)
class _Peer:
    next_offset: int = 0  # where the next ship starts (past every ship in flight)
    matched: int = 0  # prefix verified to equal the leader's, at this generation
    durable: int = 0  # of which fsynced (what the mark counts)
    sent_at: int | None = None  # while fencing: when the unanswered fence left
    in_flight: list[_InFlight] = field(default_factory=list)  # oldest first
    told_commit: int = 0
    told_compacted: int = 0


# --- the state machine ---------------------------------------------------------------


@dataclass(slots=True)
class Replica:
    node_id: str
    replicas: tuple[str, ...]  # the replica set, this node included
    config: Config = field(default_factory=Config)
    phase: Phase = Phase.FOLLOWER
    generation: int = 0  # the ballot: the newest generation this replica accepted
    leader: str | None = None
    log: list[Entry] = field(default_factory=list)  # the records from `base` (in memory)
    base: int = 0  # the offset of log[0]: below it, applied, committed and on disk
    base_generation: int = 0  # the generation of the record at base - 1 (0 at 0)
    stored_from: int = 0  # the disk may have dropped the records below (all hold them)
    applied_length: int = 0  # records applied to the stream log (the adapter says)
    synced_length: int = 0
    commit: int = 0  # the highest mark this replica knows (never moves backwards)
    mark: int | None = None  # a leader's mark at its generation; None while settling
    lease_lapsed: bool = False
    _matched: int = 0  # as follower: prefix verified against the current leader
    _told_durable: int = 0
    _peers: dict[str, _Peer] = field(default_factory=dict)
    _fence_answers: dict[str, tuple[int, int]] = field(default_factory=dict)
    _pending: list[_Pending] = field(default_factory=list)
    _generation_start: int = 0  # offset of this leader's generation-start record
    _told_compacted: int = 0  # as follower: the leader's `compacted`

    _HANDLERS: ClassVar[dict[type, Callable[[Replica, Message, int], list[Effect]]]]

    def __post_init__(self) -> None:
        if self.node_id not in self.replicas:
            raise ValueError(f"{self.node_id!r} is not in its replica set {self.replicas!r}")
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replica set {self.replicas!r} names a node twice")

    @classmethod
    def recover(
        cls, node_id: str, replicas: Sequence[str], disk: DiskImage, config: Config | None = None
    ) -> Replica:
        """A replica after a restart: a follower at its persisted ballot. A leader that
        restarts leads again only when promoted at a newer generation."""
        replica = cls(node_id, tuple(replicas), config or Config())
        replica.generation = disk.ballot_generation
        replica.leader = disk.ballot_leader if disk.ballot_leader != node_id else None
        replica.log = list(disk.entries)
        replica.base = replica.stored_from = disk.base
        replica.base_generation = disk.base_generation
        replica.synced_length = disk.base + len(disk.entries)
        replica.commit = disk.base  # only committed records are ever compacted
        return replica

    # -- derived views

    @property
    def majority(self) -> int:
        return len(self.replicas) // 2 + 1

    @property
    def followers(self) -> tuple[str, ...]:
        return tuple(r for r in self.replicas if r != self.node_id)

    @property
    def settling(self) -> bool:
        return self.phase is Phase.LEADER and self.mark is None

    @property
    def accepts_writes(self) -> bool:
        return self.phase is Phase.LEADER and not self.lease_lapsed

    @property
    def apply_to(self) -> int:
        """How far the adapter applies the log to the stream log: the commit mark; a
        Leader-consistency leader also what it acknowledged (its own durable mark)."""
        if self.config.leader_acks and self.phase is Phase.LEADER and self.mark is not None:
            return max(self.commit, self.mark)
        return self.commit

    @property
    def verified_length(self) -> int:
        """As follower: the prefix of our log verified to equal the current leader's."""
        return self._matched

    @property
    def length(self) -> int:
        """The log's length (records below `base` included)."""
        return self.base + len(self.log)

    def entry(self, offset: int) -> Entry:
        """The record at `offset`, which must be at or above `base` (in memory)."""
        if offset < self.base:
            raise IndexError(f"record {offset} is below the in-memory base {self.base}")
        return self.log[offset - self.base]

    def entries(self, low: int, high: int) -> list[Entry]:
        """The in-memory records in [low, high) (low at or above `base`)."""
        if low < self.base:
            raise IndexError(f"record {low} is below the in-memory base {self.base}")
        return self.log[low - self.base : high - self.base]

    @property
    def state(self) -> str:
        """The core's state in one word: leader, settling, fencing, follower, halted."""
        if self.phase is Phase.LEADER:
            return "settling" if self.mark is None else "leader"
        return str(self.phase.value)

    def progress(self) -> tuple[PeerProgress, ...]:
        """As leader or candidate: each follower's progress as this replica knows it."""
        return tuple(
            PeerProgress(
                peer,
                state.next_offset,
                state.matched,
                state.durable,
                fenced=peer in self._fence_answers if self.phase is Phase.FENCING else None,
            )
            for peer, state in sorted(self._peers.items())
        )

    def tail(self) -> tuple[int, int]:
        """(generation of the last record, length): how far ahead this log is."""
        return (self.log[-1].generation if self.log else self.base_generation, self.length)

    def _generation_before(self, offset: int) -> int | None:
        """The generation of the record at `offset - 1`: 0 at 0, None when it was
        compacted (committed: every correct leader's record there is the same)."""
        if offset == 0:
            return 0
        if offset - 1 >= self.base:
            return self.log[offset - 1 - self.base].generation
        return self.base_generation if offset == self.base else None

    def read(self, offset: int, limit: int) -> ReadResult:
        """What a reader of this shard may see from `offset`: records below the mark."""
        if self.phase is not Phase.LEADER:
            return ReadResult(code=ErrorCode.NOT_LEADER)
        if self.lease_lapsed:
            return ReadResult(code=ErrorCode.SHARD_UNAVAILABLE, reason="fenced")
        if self.mark is None:
            return ReadResult(code=ErrorCode.SHARD_UNAVAILABLE, reason="not_ready")
        records: list[tuple[int, bytes]] = []
        at = max(offset, self.base)  # below `base`: in the stream log, read it there
        while at < self.mark and len(records) < limit:
            entry = self.log[at - self.base]
            if not entry.start:
                records.append((at, entry.payload))
            at += 1
        return ReadResult(records=tuple(records), next_offset=at)

    # -- client writes

    def append(self, request_id: int, payloads: Sequence[bytes], now: int) -> list[Effect]:
        if self.phase is not Phase.LEADER:
            return [Refused(request_id, ErrorCode.NOT_LEADER, RetryClass.REDIRECT)]
        if self.lease_lapsed:
            return [Refused(request_id, ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, "fenced")]
        if not payloads:
            return [Refused(request_id, ErrorCode.INVALID_REQUEST, RetryClass.FATAL, "empty")]
        if self.length - self.commit + len(payloads) > self.config.max_uncommitted:
            return [Refused(request_id, ErrorCode.OVERLOADED, RetryClass.RETRY_AFTER)]
        first = self.length
        entries = tuple(Entry(self.generation, p) for p in payloads)
        self.log.extend(entries)
        deadline = now + self.config.quorum_timeout_ms
        self._pending.append(_Pending(request_id, first, self.length, deadline))
        effects: list[Effect] = [WriteRecords(first, entries)]
        for peer in self.followers:
            effects.extend(self._ship_more(peer, now))
        return effects

    # -- the fleet's signals

    def promote(self, generation: int, now: int) -> list[Effect]:
        """Become the candidate at `generation`: persist the ballot and fence everyone."""
        if generation <= self.generation or self.phase is Phase.HALTED:
            return []
        effects = self._adopt(generation, self.node_id)
        self.phase = Phase.FENCING
        self._fence_answers = {}
        self._peers = {peer: _Peer() for peer in self.followers}
        effects.extend(self._maybe_open(now))
        for peer in self.followers:
            self._peers[peer].sent_at = now
            effects.append(Send(peer, Fence(generation, self.node_id)))
        return effects

    def lease_expired(self) -> list[Effect]:
        self.lease_lapsed = True
        return self._fail_pending(ErrorCode.LEADERSHIP_LOST)

    def lease_renewed(self) -> list[Effect]:
        self.lease_lapsed = False
        return []

    def synced(self, length: int) -> list[Effect]:
        """The disk holds the first `length` records durably (after every effect so far)."""
        self.synced_length = min(max(self.synced_length, length), self.length)
        if self.phase is Phase.LEADER:
            return [*self._advance_mark(), *self._compact()]
        if self.phase is Phase.FOLLOWER and self.leader is not None:
            durable = min(self.synced_length, self._matched)
            if durable > self._told_durable:
                self._told_durable = durable
                return [
                    Send(
                        self.leader,
                        ShipOk(self.generation, self.node_id, durable, self._matched),
                    ),
                    *self._compact(),
                ]
        return self._compact()

    def applied(self, length: int) -> list[Effect]:
        """The first `length` records are applied to the stream log: what is also
        committed and durable here leaves memory (and maybe the disk)."""
        self.applied_length = max(self.applied_length, length)
        return self._compact()

    def tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        expired = [p for p in self._pending if p.deadline <= now]
        if expired:
            self._pending = [p for p in self._pending if p.deadline > now]
            effects.extend(
                Refused(
                    p.request_id,
                    ErrorCode.QUORUM_TIMEOUT,
                    RetryClass.OUTCOME_UNKNOWN,
                )
                for p in expired
            )
        due = self.config.retransmit_ms
        if self.phase is Phase.FENCING:
            for peer, state in self._peers.items():
                if peer not in self._fence_answers and (
                    state.sent_at is None or now - state.sent_at >= due
                ):
                    state.sent_at = now
                    effects.append(Send(peer, Fence(self.generation, self.node_id)))
        elif self.phase is Phase.LEADER:
            for peer, state in self._peers.items():
                if state.in_flight:
                    if now - state.in_flight[0].sent_at >= due:
                        # No answer in time (lost, or the follower is gone): ship again
                        # from the oldest unanswered ship, one ship at a time.
                        state.next_offset = state.in_flight[0].start
                        state.in_flight.clear()
                        effects.extend(self._ship(peer, now))
                    continue
                behind = (
                    state.matched < self.length
                    or state.told_commit < self.commit
                    or state.told_compacted < self.stored_from
                )
                if behind:
                    effects.extend(self._ship(peer, now))
        return effects

    # -- peer messages

    def receive(self, message: Message, now: int) -> list[Effect]:
        if self.phase is Phase.HALTED:
            return []
        return self._HANDLERS[type(message)](self, message, now)

    def _on_ship(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, Ship)
        if message.generation < self.generation:
            return [Send(message.leader, self._fenced_answer())]
        effects: list[Effect] = []
        if message.generation > self.generation:
            effects.extend(self._adopt(message.generation, message.leader))
        elif self.phase is not Phase.FOLLOWER:
            return []  # our own generation names us; a ship from another is impossible
        elif self.leader is None:
            self.leader = message.leader
            effects.append(PersistBallot(self.generation, self.leader))
        at = message.offset
        before = self._generation_before(at) if at <= self.length else None
        if at > self.length or before not in (None, message.prev_generation):
            return [
                *effects,
                Send(
                    message.leader,
                    ShipRefused(
                        self.generation, self.node_id, ShipRefusal.RESUME, self._resume_at(at)
                    ),
                ),
            ]
        effects.extend(self._store(at, message.entries))
        if self.phase is Phase.HALTED:
            return effects
        self._matched = max(self._matched, at + len(message.entries))
        self.commit = max(self.commit, min(message.commit, self._matched))
        self._told_compacted = max(self._told_compacted, message.compacted)
        durable = min(self.synced_length, self._matched)
        self._told_durable = max(self._told_durable, durable)
        effects.append(
            Send(message.leader, ShipOk(self.generation, self.node_id, durable, self._matched))
        )
        effects.extend(self._compact())
        return effects

    def _on_ship_ok(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, ShipOk)
        state = self._peers.get(message.sender)
        if self.phase is not Phase.LEADER or message.generation != self.generation or not state:
            return []
        state.matched = max(state.matched, message.matched)
        state.durable = max(state.durable, min(message.durable, state.matched))
        state.next_offset = max(state.next_offset, state.matched)
        # The ships this answer covers are answered (a durable-only answer covers the
        # ships it did before; the ones after it stay in flight).
        state.in_flight = [f for f in state.in_flight if f.end > state.matched]
        effects = [*self._advance_mark(), *self._compact()]
        effects.extend(self._ship_more(message.sender, now))
        return effects

    def _on_ship_refused(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, ShipRefused)
        if message.refusal is ShipRefusal.FENCED:
            return self._step_down(message.generation)
        state = self._peers.get(message.sender)
        if self.phase is not Phase.LEADER or message.generation != self.generation or not state:
            return []
        if any(f.start <= message.resume_at for f in state.in_flight):
            # A ship from there is on its way already: this refusal answers one sent
            # before it (pipelined behind a lost or refused ship), not news.
            return []
        state.in_flight.clear()
        # The follower's word is what it holds now: one that restarted has lost what
        # it received but never synced, so what it once matched above `resume_at` is
        # gone (shipping from the old `matched` would be refused forever).
        state.matched = min(state.matched, message.resume_at)
        state.next_offset = max(state.matched, min(message.resume_at, state.next_offset - 1))
        return self._ship(message.sender, now)

    def _on_fence(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, Fence)
        if message.generation < self.generation or (
            message.generation == self.generation and self.leader not in (None, message.candidate)
        ):
            return [Send(message.candidate, FenceRefused(self.generation, self.node_id))]
        if message.generation == self.generation and self.phase is not Phase.FOLLOWER:
            return []  # we are the candidate of this generation (a fence from ourselves)
        effects: list[Effect] = []
        if message.generation > self.generation:
            effects.extend(self._adopt(message.generation, message.candidate))
        elif self.leader is None:
            # We knew the generation (a refusal told us, or we restarted) but not its
            # leader: one candidate per generation, so this is it.
            self.leader = message.candidate
            effects.append(PersistBallot(self.generation, self.leader))
        last, length = self.tail()
        effects.append(
            Send(message.candidate, FenceOk(self.generation, self.node_id, last, length))
        )
        return effects

    def _on_fence_ok(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, FenceOk)
        if self.phase is not Phase.FENCING or message.generation != self.generation:
            return []
        if message.sender not in self._peers:
            return []
        self._fence_answers[message.sender] = (message.last_generation, message.length)
        self._peers[message.sender].next_offset = min(message.length, self.length)
        return self._maybe_open(now)

    def _on_fence_refused(self, message: Message, now: int) -> list[Effect]:
        assert isinstance(message, FenceRefused)
        return self._step_down(message.generation)

    # -- internals

    def _fenced_answer(self) -> ShipRefused:
        return ShipRefused(self.generation, self.node_id, ShipRefusal.FENCED)

    def _resume_at(self, offset: int) -> int:
        """Where a leader should resume shipping to us, given a ship at `offset` we
        cannot take: our length, or the start of our run of records of the generation
        before `offset` (one round trip per generation, not per record)."""
        if offset > self.length:
            return self.length
        if offset - 1 < self.base:  # a compacted (committed) record: resume at base
            return self.base
        generation = self.log[offset - 1 - self.base].generation
        at = offset - 1
        while at > self.base and self.log[at - 1 - self.base].generation == generation:
            at -= 1
        return at

    def _store(self, at: int, entries: Sequence[Entry]) -> list[Effect]:
        """Write a verified ship's records, truncating what conflicts with them."""
        effects: list[Effect] = []
        for index, entry in enumerate(entries):
            offset = at + index
            if offset < self.base:
                continue  # committed and compacted: the same record in a correct fleet
            if offset < self.length:
                if self.log[offset - self.base] == entry:
                    continue
                if offset < self.commit:
                    self.phase = Phase.HALTED
                    return [Halted(self.generation, offset)]
                effects.extend(self._truncate(offset))
            rest = tuple(entries[index:])
            self.log.extend(rest)
            effects.append(WriteRecords(offset, rest))
            break
        return effects

    def _truncate(self, length: int) -> list[Effect]:
        assert length >= self.base, "a truncation below the committed base"
        del self.log[length - self.base :]
        self.synced_length = min(self.synced_length, length)
        # Only a former Leader-consistency leader applied records above the commit
        # mark; the adapter cuts its stream log back with the replication log.
        self.applied_length = min(self.applied_length, length)
        return [Truncate(length)]

    def _adopt(self, generation: int, leader: str | None) -> list[Effect]:
        """Accept a newer generation led by `leader` (as follower unless it is us)."""
        effects = self._fail_pending(ErrorCode.LEADERSHIP_LOST)
        self.generation = generation
        self.leader = leader
        self.phase = Phase.FOLLOWER
        self.mark = None
        self._matched = 0
        self._told_durable = 0
        self._peers = {}
        self._fence_answers = {}
        self._told_compacted = 0
        effects.insert(0, PersistBallot(generation, leader))
        return effects

    def _step_down(self, generation: int) -> list[Effect]:
        if generation <= self.generation:
            return []
        return self._adopt(generation, None)

    def _fail_pending(self, code: ErrorCode) -> list[Effect]:
        failed, self._pending = self._pending, []
        return [Refused(p.request_id, code, RetryClass.OUTCOME_UNKNOWN) for p in failed]

    def _caught_up(self) -> tuple[str, ...]:
        """The fenced replicas whose log is further ahead than ours (empty: we may open)."""
        mine = self.tail()
        return tuple(sorted(p for p, tail in self._fence_answers.items() if tail > mine))

    def _maybe_open(self, now: int) -> list[Effect]:
        if len(self._fence_answers) + 1 < self.majority:
            return []
        ahead = self._caught_up()
        if ahead:
            generation = self.generation
            self.phase = Phase.FOLLOWER
            self.leader = None
            self._peers = {}
            return [PersistBallot(generation, None), PromotionRefused(generation, ahead)]
        self.phase = Phase.LEADER
        self.mark = None
        self._generation_start = self.length
        start = (Entry(self.generation, b"", start=True),)
        self.log.extend(start)
        effects: list[Effect] = [WriteRecords(self._generation_start, start)]
        for peer in self.followers:
            self._peers[peer].sent_at = None
            self._peers[peer].in_flight.clear()
            effects.extend(self._ship(peer, now))
        return effects

    def _ship_more(self, peer: str, now: int) -> list[Effect]:
        """Ship the records `peer` has not been sent yet, if its window has room."""
        state = self._peers[peer]
        if len(state.in_flight) >= self.config.ship_window or state.next_offset >= self.length:
            return []
        return self._ship(peer, now)

    def _ship(self, peer: str, now: int) -> list[Effect]:
        """One ship from the peer's `next_offset`, which then moves past it."""
        state = self._peers[peer]
        # Below `stored_from` every replica holds the records: never ship from there.
        at = max(min(state.next_offset, self.length), self.stored_from)
        state.told_commit = self.commit
        state.told_compacted = self.stored_from
        if at < self.base:  # no longer in memory: from the disk
            count = min(self.config.ship_max_records, self.base - at)
            state.in_flight.append(_InFlight(at, at + count, now))
            state.next_offset = at + count
            return [
                ShipStored(
                    peer,
                    self.generation,
                    self.node_id,
                    at,
                    count,
                    self.commit,
                    self.stored_from,
                )
            ]
        low = at - self.base
        entries = tuple(self.log[low : low + self.config.ship_max_records])
        state.in_flight.append(_InFlight(at, at + len(entries), now))
        state.next_offset = at + len(entries)
        previous = self._generation_before(at)
        assert previous is not None  # at >= base
        ship = Ship(
            self.generation, self.node_id, at, previous, entries, self.commit, self.stored_from
        )
        return [Send(peer, ship)]

    def _compact(self) -> list[Effect]:
        """Drop from memory what is applied, committed and durable here; move the
        disk's floor to what every replica holds (see the module docstring)."""
        floor = min(self.applied_length, self.commit, self.synced_length, self.length)
        if floor > self.base:
            self.base_generation = self.log[floor - 1 - self.base].generation
            del self.log[: floor - self.base]
            self.base = floor
        if self.phase is Phase.LEADER:
            # `durable`, not `matched`: a follower's unsynced records die with it.
            held = min([self.base, *(p.durable for p in self._peers.values())])
        elif self.phase is Phase.FOLLOWER and self.leader is not None:
            held = min(self.base, self._told_compacted)
        else:
            return []
        if held <= self.stored_from:
            return []
        self.stored_from = held
        return [CompactLog(held)]

    def _quorum_length(self) -> int:
        """The longest prefix a majority (this leader included) holds durably."""
        if self.config.ack_before_majority:
            return self.synced_length
        held = sorted(
            [self.synced_length, *(p.durable for p in self._peers.values())], reverse=True
        )
        return held[self.majority - 1] if len(held) >= self.majority else 0

    def _advance_mark(self) -> list[Effect]:
        if self.config.leader_acks:
            return self._advance_leader_marks()
        candidate = self._quorum_length()
        if candidate <= self._generation_start:
            return []  # the majority has not reached a record of our generation yet
        if self.mark is not None and candidate <= self.mark:
            return []
        self.mark = candidate
        self.commit = max(self.commit, candidate)
        return self._release()

    def _advance_leader_marks(self) -> list[Effect]:
        """Leader consistency: the mark (acks, reads, the leader's applying) follows
        this leader's own durable length, or the majority's when that is further (the
        followers may fsync first: an ack then promises more), the commit (what
        followers apply) the majority's, each only from a record of this generation
        on. The mark never trails the commit, so nothing is applied before its ack
        is released."""
        majority = self._quorum_length()
        if majority > self._generation_start:
            self.commit = max(self.commit, majority)
        own = max(self.synced_length, majority)
        if own <= self._generation_start or (self.mark is not None and own <= self.mark):
            return []
        self.mark = own
        return self._release()

    def _release(self) -> list[Effect]:
        mark = self.mark
        assert mark is not None
        done = [p for p in self._pending if p.end <= mark]
        self._pending = [p for p in self._pending if p.end > mark]
        return [
            Acked(p.request_id, p.first_offset, p.end - p.first_offset, self.generation)
            for p in done
        ]


def _handlers() -> dict[type, Callable[[Replica, Message, int], list[Effect]]]:
    return {
        Ship: Replica._on_ship,
        ShipOk: Replica._on_ship_ok,
        ShipRefused: Replica._on_ship_refused,
        Fence: Replica._on_fence,
        FenceOk: Replica._on_fence_ok,
        FenceRefused: Replica._on_fence_refused,
    }


Replica._HANDLERS = _handlers()
