"""The sans-IO group state machine: claims, cursor, dead letters, without sockets."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from felix_broker.groups.records import (
    GroupChange,
    GroupDurable,
    Kind,
    apply_change,
    decode_change,
    encode_change,
    snapshot_changes,
)
from felix_broker.groups.state import (
    ClaimState,
    GroupLimits,
    GroupRefusedError,
    GroupState,
    SeekTarget,
)

LIMITS = GroupLimits(visibility_ms=1000, max_visibility_ms=5000, max_attempts=3, max_in_flight=8)


def fresh(tail: int = 0, limits: GroupLimits = LIMITS) -> GroupState:
    return GroupState.build("g", GroupDurable(), limits, tail)


def poll(state: GroupState, now: int, n: int, tail: int, conn: int = 1) -> list[tuple[int, int]]:
    offers = state.offer(now, n, conn, 0, tail)
    state.claim(now, offers, conn, None)
    return [(o.offset, o.attempts) for o in offers]


def test_first_poll_creates_the_group_at_zero_and_hands_out_in_order() -> None:
    state = fresh()
    assert poll(state, 0, 3, tail=5) == [(0, 1), (1, 1), (2, 1)]
    assert state.take_writes() == [GroupChange(Kind.CURSOR, "g", 0)]
    assert poll(state, 0, 10, tail=5) == [(3, 1), (4, 1)]


def test_cursor_advances_only_over_contiguous_acks() -> None:
    state = fresh()
    poll(state, 0, 3, tail=3)
    state.take_writes()
    state.ack(0, 1, 3)
    # Held back by 0: the cursor stays, the acknowledgement itself is kept.
    assert state.position == 0 and state.take_writes() == [GroupChange(Kind.ACKED, "g", 1)]
    state.ack(0, 0, 3)
    assert state.position == 2
    assert state.take_writes() == [GroupChange(Kind.CURSOR, "g", 2)]


def test_lapsed_claims_are_owed_before_new_records_and_count_attempts() -> None:
    state = fresh()
    poll(state, 0, 2, tail=4)
    assert poll(state, 999, 1, tail=4) == [(2, 1)]
    assert poll(state, 1000, 4, tail=4) == [(0, 2), (1, 2), (3, 1)]


def test_past_max_attempts_a_record_is_dead_lettered() -> None:
    state = fresh()
    for attempt in (1, 2, 3):
        assert poll(state, attempt * 1000, 1, tail=1) == [(0, attempt)]
        state.nack(attempt * 1000, 0, 1, attempts=attempt)
    assert state.durable.dead == {0} and state.position == 1
    kinds = [c.kind for c in state.take_writes()]
    assert kinds.index(Kind.DEAD) < kinds.index(Kind.CURSOR, 1)  # listed first, then finished


def test_in_flight_cap_counts_delayed_nacks() -> None:
    state = fresh(limits=GroupLimits(max_in_flight=2))
    assert len(poll(state, 0, 5, tail=5)) == 2
    state.nack(0, 0, 5, delay_ms=500)
    assert poll(state, 0, 5, tail=5) == []
    assert poll(state, 500, 5, tail=5) == [(0, 2)]


def test_nack_naming_a_stale_delivery_is_refused_fatal() -> None:
    state = fresh()
    poll(state, 0, 1, tail=1)
    with pytest.raises(GroupRefusedError) as info:
        state.nack(0, 0, 1, attempts=2)
    assert info.value.stale and info.value.fatal
    state.nack(0, 0, 1, delay_ms=100, attempts=1)
    with pytest.raises(GroupRefusedError):  # a second nack naming the same delivery
        state.nack(0, 0, 1, attempts=1)
    with pytest.raises(GroupRefusedError):  # a delayed record cannot be extended
        state.extend(0, 0, 1, 100)


def test_extend_keeps_a_claim_and_is_capped() -> None:
    state = fresh()
    poll(state, 0, 1, tail=1)
    assert state.extend(900, 0, 1, 60_000) == 5000
    assert poll(state, 1500, 1, tail=1) == []
    with pytest.raises(GroupRefusedError) as info:
        state.extend(0, 0, 1, 0)
    assert not info.value.stale
    assert poll(state, 5900, 1, tail=1) == [(0, 2)]
    with pytest.raises(GroupRefusedError) as info:
        state.extend(5900, 0, 1, 100)  # that delivery lapsed and went out again
    assert info.value.fatal


def test_settle_rules_of_a_rebuilt_state() -> None:
    state = GroupState.build("g", GroupDurable(cursor=2), LIMITS, tail=5)
    state.ack(0, 1, 5)  # below the position: a duplicate
    state.ack(0, 3, 5)  # claimed before the rebuild: taken
    with pytest.raises(GroupRefusedError):
        state.ack(0, 5, 5)  # at the tail
    with pytest.raises(GroupRefusedError) as info:
        state.ack(0, 6, 7)  # written after the rebuild, never handed out
    assert info.value.stale and not info.value.fatal
    assert poll(state, 0, 10, tail=7) == [(2, 1), (4, 1), (5, 1), (6, 1)]


def test_a_rebuilt_state_never_hands_out_what_acks_moved_its_position_over() -> None:
    # Issue 19 (chaos seed 4): a promoted leader rebuilds its group at the cursor
    # (1762) with the acks above it (1765-1779); consumers then ack records the old
    # leader handed them (1762-1764), so the position jumps over everything acked.
    # The poll after must start at the position, never at the rebuilt state's
    # first new record (which the jump left behind).
    durable = GroupDurable(cursor=1762, acked=set(range(1765, 1780)))
    state = GroupState.build("g", durable, LIMITS, tail=1800)
    for offset in (1762, 1763, 1764):
        state.ack(0, offset, 1800)
    assert state.position == 1780
    assert poll(state, 0, 5, tail=1800) == [(o, 1) for o in range(1780, 1785)]


def test_seek_voids_claims_and_keeps_dead_letters() -> None:
    state = fresh()
    poll(state, 0, 4, tail=10)
    state.dead_letter(0, 1, 10)
    assert state.seek(SeekTarget(offset=6), False, 0, 10) == (6, True)
    assert state.durable.dead == {1}
    state.ack(0, 2, 10)  # below the new position: a duplicate
    with pytest.raises(GroupRefusedError):
        state.ack(0, 7, 10)
    with pytest.raises(GroupRefusedError):
        state.seek(SeekTarget(offset=11), False, 0, 10)
    assert state.seek(SeekTarget(earliest=True), True, 0, 10) == (6, False)


def test_dead_letter_by_hand_then_redrive_and_discard() -> None:
    state = fresh()
    poll(state, 0, 2, tail=2)
    state.dead_letter(0, 0, 2)
    with pytest.raises(GroupRefusedError):
        state.dead_letter(0, 0, 2)
    state.ack(0, 1, 2)
    assert state.position == 2
    with pytest.raises(GroupRefusedError):
        state.dead_letter(0, 1, 2)  # already finished
    state.redrive(0)
    assert poll(state, 0, 5, tail=2) == [(0, 1)]  # owed again, attempts reset, cursor kept
    assert state.position == 2
    state.dead_letter(0, 0, 2)
    state.discard(0)
    assert state.durable.dead == set()
    with pytest.raises(GroupRefusedError):
        state.discard(0)


def test_reclaim_moves_a_members_claims_to_the_newest_connection() -> None:
    state = fresh()
    member = ("w1", "alice")
    offers = state.offer(0, 2, 1, 0, 5)
    state.claim(0, offers, 1, member)
    state.reclaim(10, 2, member)
    assert all(c.state is ClaimState.RESERVED for c in state.claims.values())
    offers = state.offer(10, 1, 2, 0, 5)
    assert [(o.offset, o.attempts) for o in offers] == [(0, 2)]
    assert [o.offset for o in state.offer(10, 5, 3, 0, 5)] == [2, 3, 4]  # others skip reserved
    state.reclaim(10, 1, member)  # an older connection: a plain poll
    assert state.claims[1].holder == 2


def test_records_round_trip_and_replay() -> None:
    durable: dict[str, GroupDurable] = {}
    changes = [
        GroupChange(Kind.CURSOR, "g", 7),
        GroupChange(Kind.DEAD, "g", 3),
        GroupChange(Kind.DEAD, "g", 4),
        GroupChange(Kind.REDRIVE, "g", 4),
        GroupChange(Kind.CURSOR, "h", 1),
        GroupChange(Kind.DELETE, "h"),
    ]
    for change in changes:
        apply_change(durable, decode_change(encode_change(change)))
    assert durable == {"g": GroupDurable(cursor=7, dead={3}, redriven={4})}
    again: dict[str, GroupDurable] = {}
    for change in snapshot_changes(durable.items()):
        apply_change(again, change)
    assert again == durable


# -- property: against a reference model ---------------------------------------------


class GroupMachine(RuleBasedStateMachine):
    """Random polls, acks, nacks, extends, lapses, seeks and restarts never lose a
    record and never give one record to two holders at once."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = GroupLimits(
            visibility_ms=100, max_visibility_ms=400, max_attempts=3, max_in_flight=6
        )
        self.now = 0
        self.tail = 0
        self.durable = GroupDurable()
        self.state = GroupState.build("g", self.durable, self.limits, 0)
        self.held: dict[int, tuple[int, int]] = {}  # offset -> (conn, deadline) per model
        self.acked: set[int] = set()
        self.floor = 0  # records below a seek target are given up on purpose

    def _persist(self) -> None:
        self.state.take_writes()

    @rule(n=st.integers(1, 4))
    def publish(self, n: int) -> None:
        self.tail += n

    @rule(n=st.integers(1, 5), conn=st.integers(1, 3))
    def poll(self, n: int, conn: int) -> None:
        offers = self.state.offer(self.now, n, conn, 0, self.tail)
        for offer in offers:
            # Only a lapsed or handed-back claim may go out again: never two holders.
            previous = self.held.get(offer.offset)
            assert previous is None or previous[1] <= self.now
            assert offer.offset not in self.state.claims
        self.state.claim(self.now, offers, conn, None)
        self._persist()
        for offer in offers:
            self.held[offer.offset] = (conn, self.now + self.limits.visibility_ms)

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        live = sorted(self.state.claims)
        if not live:
            return
        offset = data.draw(st.sampled_from(live))
        self.state.ack(self.now, offset, self.tail)
        self._persist()
        self.acked.add(offset)
        self.held.pop(offset, None)

    @rule(data=st.data(), delay=st.sampled_from([0, 0, 50]))
    def nack(self, data: st.DataObject, delay: int) -> None:
        self.state.expire(self.now)  # a claim lapsed by now is refused, rightly
        live = sorted(o for o, c in self.state.claims.items() if c.state is ClaimState.HELD)
        if not live:
            return
        offset = data.draw(st.sampled_from(live))
        self.state.nack(self.now, offset, self.tail, delay, self.state.claims[offset].attempts)
        self._persist()
        self.held.pop(offset, None)

    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        self.state.expire(self.now)  # a claim lapsed by now is refused, rightly
        live = sorted(o for o, c in self.state.claims.items() if c.state is ClaimState.HELD)
        if not live:
            return
        offset = data.draw(st.sampled_from(live))
        self.state.extend(self.now, offset, self.state.claims[offset].attempts, 100)
        self.held[offset] = (self.held[offset][0], self.now + 100)

    @rule(ms=st.integers(1, 250))
    def lapse(self, ms: int) -> None:
        self.now += ms

    @rule()
    def restart(self) -> None:
        # Only what was written survives; the rebuilt state owes everything unsettled.
        self.state = GroupState.build("g", self.durable, self.limits, self.tail)
        self.held.clear()  # a rebuilt state redelivers sooner (leader memory is gone)

    @rule(data=st.data())
    def seek(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.state.position, self.tail))
        self.state.seek(SeekTarget(offset=target), False, 0, self.tail)
        self._persist()
        self.floor = max(self.floor, target)
        self.held.clear()  # a seek voids every standing claim

    @invariant()
    def one_holder_each(self) -> None:
        for offset, claim in self.state.claims.items():
            assert offset not in self.state.owed
            assert claim.attempts <= self.limits.max_attempts
        assert len(self.state.claims) <= self.limits.max_in_flight

    @invariant()
    def nothing_is_lost(self) -> None:
        # Drain: acknowledge everything that comes out until nothing does, then every
        # record from the floor up is acknowledged or dead-lettered.
        probe = GroupState.build("g", _copy(self.durable), self.limits, self.tail)
        probe.claims = dict(self.state.claims)
        probe._expiry = list(self.state._expiry)
        probe._stamps = itertools.count(10**9)
        probe.owed = dict(self.state.owed)
        probe.finished = set(self.state.finished)
        probe.position = self.state.position
        probe.next_new = self.state.next_new
        now = self.now + 10 * self.limits.max_visibility_ms
        done: set[int] = set(self.acked)
        for _ in range(200):
            offers = probe.offer(now, 50, 99, 0, self.tail)
            if not offers:
                break
            probe.claim(now, offers, 99, None)
            for offer in offers:
                probe.ack(now, offer.offset, self.tail)
                done.add(offer.offset)
        assert probe.position == self.tail
        for offset in range(self.floor, self.tail):
            assert offset in done or offset in probe.durable.dead, offset


def _copy(durable: GroupDurable) -> GroupDurable:
    return GroupDurable(durable.cursor, set(durable.dead), set(durable.redriven))


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
