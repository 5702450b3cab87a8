"""The state machine of one consumer group on one stream shard (sans-IO).

No clock, no log, no sockets: every call is given the time (`now`, ms on any
monotonic clock) and the shard's log bounds (`log_start`, `tail`), changes
the in-memory state synchronously and queues the durable changes it made in
`writes` for the owner to append to the shard's group log (group_records.py)
before it answers. The owner (groups.py) reads payloads and moves bytes.

Offsets of the group's shard, from the group's `position` (its cursor: all
below is finished) up:

- `claims`: handed out and standing. A claim is HELD by the connection it went
  to until its deadline, DELAYED after a nack with a delay (it keeps its
  in-flight slot and comes back at the deadline), or RESERVED by a reclaiming
  connection (Q16) that has not been sent it yet.
- `owed`: handed out before, to go out again (lapsed, nacked, redriven),
  lowest offset first, before any new record.
- `finished`: acknowledged or dead-lettered above the position; the position
  moves only over a contiguous run of them (Q7).
- offsets from `next_new` on were never handed out since this state was built;
  `next_new` never trails the position (everything below it is finished).

What a state rebuilt after a restart or an idle eviction (or voided by a seek)
cannot know is who held what: it accepts a settle of anything below
`accept_below` (the tail it first saw, or the seek's target) that it has not
handed out itself, and refuses one above with stale_claim, retryable (Q8, Q9).

Bounds: at most `max_in_flight` claims (delayed nacks and reservations count);
new records are read at most `window` offsets past the position, so the set
of finished offsets above a stuck record stays bounded (a poll then answers
empty until the stuck record is settled, lapses into the dead letters or is
seeked past); at most `max_dead_letters` dead letters per group, past which
the lowest is discarded (and that discard written like any other); at most
`max_members` consumer names remembered for reclaims, oldest forgotten first.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass, field

from felix_broker.groups.records import GroupChange, GroupDurable, Kind

__all__ = [
    "Claim",
    "ClaimState",
    "GroupLimits",
    "GroupRefusedError",
    "GroupState",
    "Member",
    "Offer",
    "SeekTarget",
]

# (consumer name, authenticated principal): the same name under another token is
# another member (Q16).
Member = tuple[str, str]


class GroupRefusedError(Exception):
    """A request the state refuses. `stale` marks a stale_claim refusal (retryable
    unless `fatal`); otherwise it is invalid_request."""

    def __init__(self, text: str, *, stale: bool = False, fatal: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.stale = stale
        self.fatal = fatal


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The knobs of one group's state (config's group_* values, in ms)."""

    visibility_ms: int = 30_000
    max_visibility_ms: int = 43_200_000
    max_attempts: int = 5
    max_in_flight: int = 10_000
    window: int = 100_000
    max_dead_letters: int = 100_000
    max_members: int = 4096


class ClaimState(enum.Enum):
    HELD = "held"
    DELAYED = "delayed"
    RESERVED = "reserved"


@dataclass(slots=True)
class Claim:
    attempts: int  # deliveries so far; a RESERVED claim's next delivery is attempts + 1
    deadline: int
    holder: int  # connection sequence number (higher = newer connection)
    member: Member | None
    state: ClaimState = ClaimState.HELD
    stamp: int = 0  # tells a live expiry-heap entry from a stale one
    handed_at: float = 0.0  # when the poll handed it out, on the caller's clock (s)


@dataclass(frozen=True, slots=True)
class Offer:
    """A record a poll may hand out, and the attempts it would carry."""

    offset: int
    attempts: int


@dataclass(frozen=True, slots=True)
class SeekTarget:
    """`earliest`, `latest` or an exact offset."""

    earliest: bool = False
    latest: bool = False
    offset: int | None = None


@dataclass(slots=True)
class GroupState:
    limits: GroupLimits
    durable: GroupDurable
    accept_below: int
    position: int = 0
    next_new: int = 0
    lost_below: int = 0
    claims: dict[int, Claim] = field(default_factory=dict)
    owed: dict[int, int] = field(default_factory=dict)  # offset -> deliveries so far
    finished: set[int] = field(default_factory=set)
    writes: list[GroupChange] = field(default_factory=list)
    name: str = ""
    reclaimers: dict[Member, int] = field(default_factory=dict)
    _expiry: list[tuple[int, int, int]] = field(default_factory=list)
    _stamps: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def build(cls, name: str, durable: GroupDurable, limits: GroupLimits, tail: int) -> GroupState:
        """A state (re)built from what survived: it owes the redriven records and
        accepts settles of anything below `tail` it has not handed out."""
        position = durable.cursor or 0
        state = cls(
            limits=limits,
            durable=durable,
            accept_below=tail,
            position=position,
            next_new=position,
            name=name,
        )
        for offset in durable.redriven:
            state.owed[offset] = 0
        for offset in durable.dead | durable.acked:
            if offset >= position:
                state.finished.add(offset)
        return state

    # -- views -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.claims)

    @property
    def busy(self) -> bool:
        """Whether dropping this state would lose something (a standing claim or delay)."""
        return bool(self.claims)

    def next_deadline(self) -> int | None:
        while self._expiry:
            deadline, offset, stamp = self._expiry[0]
            claim = self.claims.get(offset)
            if claim is not None and claim.stamp == stamp:
                return deadline
            heapq.heappop(self._expiry)
        return None

    def take_writes(self) -> list[GroupChange]:
        writes, self.writes = self.writes, []
        return writes

    # -- time --------------------------------------------------------------------

    def expire(self, now: int) -> None:
        """Claims past their deadline are owed again (or dead-lettered at the bound)."""
        while self._expiry and self._expiry[0][0] <= now:
            _, offset, stamp = heapq.heappop(self._expiry)
            claim = self.claims.get(offset)
            if claim is None or claim.stamp != stamp:
                continue
            del self.claims[offset]
            self._owe(offset, claim.attempts)

    def _arm(self, offset: int, claim: Claim, deadline: int) -> None:
        claim.deadline = deadline
        claim.stamp = next(self._stamps)
        heapq.heappush(self._expiry, (deadline, offset, claim.stamp))

    def _visibility(self, asked_ms: int) -> int:
        chosen = asked_ms or self.limits.visibility_ms
        return min(chosen, max(self.limits.max_visibility_ms, self.limits.visibility_ms))

    # -- polls -------------------------------------------------------------------

    def reclaim(self, now: int, conn: int, member: Member, visibility_ms: int = 0) -> None:
        """Reserve `member`'s claims held by older connections for `conn` (Q16):
        only on the first reclaiming poll of the newest reclaiming connection."""
        self.expire(now)
        latest = self.reclaimers.get(member)
        if latest is not None and conn <= latest:
            return  # a later reclaim on the same connection, or an older one: plain poll
        self.reclaimers.pop(member, None)
        self.reclaimers[member] = conn
        while len(self.reclaimers) > self.limits.max_members:
            del self.reclaimers[next(iter(self.reclaimers))]
        deadline = now + self._visibility(visibility_ms)
        for offset in sorted(self.claims):
            claim = self.claims[offset]
            if claim.member != member or claim.holder >= conn:
                continue
            if claim.state is ClaimState.DELAYED:
                continue  # already handed back; it comes round on its own
            # Each reclaimed record counts one more attempt, at the bound it is dead.
            if claim.attempts >= self.limits.max_attempts:
                del self.claims[offset]
                self._dead_letter(offset)
                continue
            claim.state = ClaimState.RESERVED
            claim.holder = conn
            self._arm(offset, claim, deadline)

    def offer(self, now: int, limit: int, conn: int, log_start: int, tail: int) -> list[Offer]:
        """What a poll of `conn` may take now, in the order it should: records reserved
        for it, then owed ones (lowest offset first), then new ones. Changes only what
        time and retention decided; `claim` takes the prefix the caller keeps."""
        self.expire(now)
        self._forget_below(log_start)
        offers = [
            Offer(o, c.attempts + 1)
            for o, c in sorted(self.claims.items())
            if c.state is ClaimState.RESERVED and c.holder == conn
        ][:limit]
        room = min(limit - len(offers), self.limits.max_in_flight - len(self.claims))
        if room <= 0:
            return offers
        for offset in heapq.nsmallest(room, self.owed):
            offers.append(Offer(offset, self.owed[offset] + 1))
            room -= 1
        offset = max(self.next_new, log_start)
        horizon = min(tail, self.position + self.limits.window)
        while room > 0 and offset < horizon:
            if offset not in self.finished and offset not in self.owed:
                offers.append(Offer(offset, 1))
                room -= 1
            offset += 1
        return offers

    def claim(
        self,
        now: int,
        offers: list[Offer],
        conn: int,
        member: Member | None,
        visibility_ms: int = 0,
        handed_at: float = 0.0,
    ) -> None:
        """Hand out `offers` (a prefix of what `offer` returned, with no await since);
        `handed_at` is kept for `ack` to report (any clock of the caller's, seconds)."""
        deadline = now + self._visibility(visibility_ms)
        for item in offers:
            offset = item.offset
            self.owed.pop(offset, None)
            claim = Claim(item.attempts, deadline, conn, member, handed_at=handed_at)
            self.claims[offset] = claim
            self._arm(offset, claim, deadline)
            if offset >= self.next_new:
                self.next_new = offset + 1
        if self.durable.cursor is None:
            # A group is created by its first poll, at its position (Q2).
            self._set_cursor(self.position)

    def release(self, offsets: list[int]) -> None:
        """Claims whose answer never reached the client: owed again at once."""
        for offset in offsets:
            claim = self.claims.pop(offset, None)
            if claim is not None:
                # The client never saw this delivery, so it does not count.
                self._owe(offset, claim.attempts - 1)

    def _forget_below(self, log_start: int) -> None:
        """Retention removed what the group still owed: it cannot be delivered."""
        if log_start <= self.lost_below:
            return
        self.lost_below = log_start
        for offset in [o for o in self.owed if o < log_start]:
            del self.owed[offset]
            self._finish(offset)
        if self.next_new < log_start:
            self.next_new = log_start
        self._advance()

    # -- settles -----------------------------------------------------------------

    def _check_tail(self, offset: int, tail: int) -> None:
        if offset >= tail:
            raise GroupRefusedError(f"offset {offset} is at or past the log tail {tail}")

    def _take(self, offset: int) -> bool:
        """Take whatever claim or debt the group has on `offset` (Q8: whoever holds it)."""
        return self.claims.pop(offset, None) is not None or self.owed.pop(offset, None) is not None

    def _unclaimed(self, offset: int) -> bool:
        """For an offset neither claimed nor owed: whether a settle of it is accepted
        as for a claim the state cannot see (True), or a harmless duplicate (False).
        Raises stale_claim for a record written after the state was built."""
        if offset < self.position or offset in self.finished or offset < self.next_new:
            return False
        if offset < self.accept_below:
            return True
        raise GroupRefusedError(f"offset {offset} was not handed out: nothing applied", stale=True)

    def ack(self, now: int, offset: int, tail: int) -> float | None:
        """Finish a record, whoever holds it (Q8). Returns when the delivery it ended
        was handed out (`claim`'s `handed_at`) if a held claim ended, else None."""
        self.expire(now)
        self._check_tail(offset, tail)
        claim = self.claims.get(offset)
        handed = claim.handed_at if claim is not None and claim.state is ClaimState.HELD else None
        if self._take(offset) or self._unclaimed(offset):
            self._finish(offset)
        return handed

    def nack(self, now: int, offset: int, tail: int, delay_ms: int = 0, attempts: int = 0) -> None:
        """Hand a record back now or after `delay_ms`; naming `attempts`, only while
        that delivery's claim stands (Q10)."""
        self.expire(now)
        self._check_tail(offset, tail)
        claim = self.claims.get(offset)
        if attempts and (
            claim is None or claim.state is not ClaimState.HELD or claim.attempts != attempts
        ):
            raise GroupRefusedError(
                f"delivery {attempts} of offset {offset} no longer holds a claim",
                stale=True,
                fatal=True,
            )
        if claim is None:
            if offset not in self.owed:
                self._unclaimed(offset)  # nothing to hand back; stale if never handed out
            return
        if delay_ms > 0:
            claim.state = ClaimState.DELAYED
            self._arm(offset, claim, now + min(delay_ms, self.limits.max_visibility_ms))
            return
        del self.claims[offset]
        self._owe(offset, claim.attempts)

    def extend(self, now: int, offset: int, attempts: int, extend_ms: int) -> int:
        """Keep a standing claim for `extend_ms` from now; returns the ms granted (Q11)."""
        self.expire(now)
        if extend_ms <= 0:
            raise GroupRefusedError("extend_ms must be more than 0")
        claim = self.claims.get(offset)
        if claim is None or claim.state is not ClaimState.HELD or claim.attempts != attempts:
            raise GroupRefusedError(
                f"delivery {attempts} of offset {offset} no longer holds a claim",
                stale=True,
                fatal=True,
            )
        granted = min(extend_ms, max(self.limits.max_visibility_ms, self.limits.visibility_ms))
        self._arm(offset, claim, now + granted)
        return granted

    def dead_letter(self, now: int, offset: int, tail: int) -> None:
        """List a record as a dead letter and finish it (Q12)."""
        self.expire(now)
        self._check_tail(offset, tail)
        if offset in self.durable.dead:
            raise GroupRefusedError(f"offset {offset} is already a dead letter")
        if self._take(offset) or self._unclaimed(offset):
            self._dead_letter(offset)
        else:
            raise GroupRefusedError(f"offset {offset} is already finished")

    # -- dead letters --------------------------------------------------------------

    def redrive(self, offset: int) -> None:
        """A dead letter owed again with its attempts reset; the cursor stays (Q13)."""
        if offset not in self.durable.dead:
            raise GroupRefusedError(f"offset {offset} is not a dead letter")
        self.durable.dead.discard(offset)
        self.durable.redriven.add(offset)
        self.writes.append(GroupChange(Kind.REDRIVE, self.name, offset))
        self.finished.discard(offset)
        self.owed[offset] = 0

    def discard(self, offset: int) -> None:
        if offset not in self.durable.dead:
            raise GroupRefusedError(f"offset {offset} is not a dead letter")
        self.durable.dead.discard(offset)
        self.writes.append(GroupChange(Kind.DISCARD, self.name, offset))

    # -- lifecycle -----------------------------------------------------------------

    def seek(self, target: SeekTarget, if_new: bool, log_start: int, tail: int) -> tuple[int, bool]:
        """Move the cursor (Q14); returns (position, moved)."""
        untouched = not (self.claims or self.owed) and self.next_new == self.position
        if if_new and (self.durable.cursor is not None or not untouched):
            return self.position, False
        if target.earliest:
            offset = log_start
        elif target.latest:
            offset = tail
        else:
            assert target.offset is not None
            offset = target.offset
            if not log_start <= offset <= tail:
                raise GroupRefusedError(
                    f"seek offset {offset} is outside the log's [{log_start}, {tail}]"
                )
        # Standing claims are void: a settle at or above the new position is stale,
        # one below a duplicate. Dead letters and redriven records are kept.
        self.claims.clear()
        self._expiry.clear()
        self.owed = {o: 0 for o in self.durable.redriven}
        self.finished = {o for o in self.durable.dead if o >= offset}
        self.position = self.next_new = self.accept_below = offset
        self.durable.cursor = offset
        self.durable.acked = set()
        self.writes.append(GroupChange(Kind.SEEK, self.name, offset))
        self._advance()
        return self.position, True

    # -- internals -----------------------------------------------------------------

    def _owe(self, offset: int, attempts: int) -> None:
        if attempts >= self.limits.max_attempts:
            self._dead_letter(offset)  # listed first, then finished (Q6)
        else:
            self.owed[offset] = attempts

    def _dead_letter(self, offset: int) -> None:
        dead = self.durable.dead
        if len(dead) >= self.limits.max_dead_letters:
            lowest = min(dead)
            dead.discard(lowest)
            self.writes.append(GroupChange(Kind.DISCARD, self.name, lowest))
        dead.add(offset)
        self.durable.redriven.discard(offset)
        self.writes.append(GroupChange(Kind.DEAD, self.name, offset))
        if offset >= self.position:
            self.finished.add(offset)
            self._advance()

    def _finish(self, offset: int) -> None:
        if offset in self.durable.redriven:
            self.durable.redriven.discard(offset)
            self.writes.append(GroupChange(Kind.SETTLED, self.name, offset))
        if offset < self.position:
            return
        self.finished.add(offset)
        self._advance()
        if offset >= self.position:
            # Held back by an unfinished record below: written on its own, so a
            # restart does not hand an acknowledged record out again.
            self.durable.acked.add(offset)
            self.writes.append(GroupChange(Kind.ACKED, self.name, offset))

    def _advance(self) -> None:
        """Move the position over the finished offsets at its head (and over what
        retention removed before anyone could take it)."""
        position = self.position
        while True:
            if position in self.finished:
                self.finished.discard(position)
            elif not (
                position < self.lost_below
                and position not in self.claims
                and position not in self.owed
            ):
                break
            position += 1
        if position != self.position:
            self.position = position
            # A rebuilt state accepts acks of records it never handed out (claimed
            # before the rebuild): they can carry the position past `next_new`, and
            # what lies between is finished, never new (issue 19).
            self.next_new = max(self.next_new, position)
            self._set_cursor(position)

    def _set_cursor(self, position: int) -> None:
        if self.durable.cursor != position:
            self.durable.move_cursor(position)
            self.writes.append(GroupChange(Kind.CURSOR, self.name, position))
