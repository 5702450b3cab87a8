"""The idempotent producers' answer table, row by row, and against a model under hypothesis."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from felix_broker.streams.producers import (
    MAX_PRODUCERS,
    REMEMBERED_BATCHES,
    Append,
    Duplicate,
    ProducerTable,
    Refusal,
    RefusalReason,
    payload_digest,
)

D1 = payload_digest([b"a"])
D2 = payload_digest([b"b"])


def _table_with(
    producer: int, batches: int, *, remembered: int = REMEMBERED_BATCHES
) -> ProducerTable:
    table = ProducerTable(remembered=remembered)
    for sequence in range(batches):
        table.record(producer, sequence, payload_digest([bytes([sequence % 256])]), 10 * sequence)
    return table


def test_unknown_producer_starts_at_zero_only() -> None:
    table = ProducerTable()
    assert table.check(7, 0, D1, reused_refusal=True) == Append()
    assert table.check(7, 1, D1, reused_refusal=True) == Refusal(RefusalReason.UNKNOWN_PRODUCER)


def test_next_expected_appends_and_ahead_is_a_gap() -> None:
    table = _table_with(7, 3)
    assert table.check(7, 3, D1, reused_refusal=True) == Append()
    assert table.check(7, 5, D1, reused_refusal=True) == Refusal(RefusalReason.SEQUENCE_GAP, 3)


def test_remembered_same_digest_is_the_original_offset() -> None:
    table = _table_with(7, 3)
    digest = payload_digest([bytes([1])])
    assert table.check(7, 1, digest, reused_refusal=True) == Duplicate(10)
    assert table.check(7, 1, digest, reused_refusal=False) == Duplicate(10)


def test_remembered_other_digest_is_reused_only_for_clients_that_offered_it() -> None:
    table = _table_with(7, 3)
    assert table.check(7, 1, D2, reused_refusal=True) == Refusal(RefusalReason.SEQUENCE_REUSED)
    # Without FEATURE_SEQUENCE_REUSED: publish_ok with the original offset, nothing written.
    assert table.check(7, 1, D2, reused_refusal=False) == Duplicate(10)


def test_older_than_remembered_is_expired() -> None:
    table = _table_with(7, REMEMBERED_BATCHES + 5)
    oldest_kept = 5
    digest = payload_digest([bytes([oldest_kept])])
    assert table.check(7, oldest_kept, digest, reused_refusal=True) == Duplicate(10 * oldest_kept)
    assert table.check(7, oldest_kept - 1, D1, reused_refusal=True) == Refusal(
        RefusalReason.SEQUENCE_EXPIRED
    )


def test_coldest_producer_is_forgotten_past_the_bound() -> None:
    table = ProducerTable()
    for producer in range(MAX_PRODUCERS):
        table.record(producer, 0, D1, producer)
    table.record(0, 1, D1, MAX_PRODUCERS)  # producer 0 is now the warmest
    table.record(MAX_PRODUCERS, 0, D1, MAX_PRODUCERS + 1)
    assert len(table) == MAX_PRODUCERS
    assert 1 not in table  # the coldest went
    assert 0 in table
    assert table.check(1, 1, D1, reused_refusal=True) == Refusal(RefusalReason.UNKNOWN_PRODUCER)


def test_retention_forgets_batches_and_then_the_producer() -> None:
    table = _table_with(7, 3)  # offsets 0, 10, 20
    table.trim(15)
    assert table.check(7, 1, payload_digest([bytes([1])]), reused_refusal=True) == Refusal(
        RefusalReason.SEQUENCE_EXPIRED
    )
    assert table.next_sequence(7) == 3
    table.trim(21)
    assert 7 not in table
    assert table.check(7, 3, D1, reused_refusal=True) == Refusal(RefusalReason.UNKNOWN_PRODUCER)


def test_digest_separates_record_boundaries() -> None:
    assert payload_digest([b"ab", b"c"]) != payload_digest([b"a", b"bc"])
    assert payload_digest([b"ab"]) != payload_digest([b"ab", b""])
    assert payload_digest([b"x", b"y"]) == payload_digest([b"x", b"y"])


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ProducerTable(remembered=0)


# --- against a model --------------------------------------------------------------------

REMEMBER = 4
PRODUCERS = 3


@dataclass
class _ModelProducer:
    batches: list[tuple[int, int, int]] = field(default_factory=list)  # (sequence, digest, offset)
    last_append: int = 0


class ProducerMachine(RuleBasedStateMachine):
    """Sends, resends (same or other payloads), retention and restarts of one shard.

    The model keeps every batch a producer ever appended and derives the answer
    by slicing; the log is the list of appended marks, and a restart rebuilds the
    table from the retained part of it, as a durable shard does on open.
    """

    def __init__(self) -> None:
        super().__init__()
        self.table = ProducerTable(remembered=REMEMBER, max_producers=PRODUCERS)
        self.model: dict[int, _ModelProducer] = {}
        self.log: list[tuple[int, int, int, int]] = []  # (producer, sequence, digest, offset)
        self.tail = 0
        self.start = 0
        self.clock = 0

    def _expected(self, producer: int, sequence: int, digest: int, reused: bool) -> object:
        state = self.model.get(producer)
        if state is None:
            return Append() if sequence == 0 else Refusal(RefusalReason.UNKNOWN_PRODUCER)
        kept = state.batches[-REMEMBER:]
        nxt = state.batches[-1][0] + 1
        if sequence == nxt:
            return Append()
        if sequence > nxt:
            return Refusal(RefusalReason.SEQUENCE_GAP, nxt)
        for seq, dig, offset in kept:
            if seq == sequence:
                if dig == digest or not reused:
                    return Duplicate(offset)
                return Refusal(RefusalReason.SEQUENCE_REUSED)
        return Refusal(RefusalReason.SEQUENCE_EXPIRED)

    @rule(
        producer=st.integers(0, 4),
        delta=st.integers(-6, 2),
        payload=st.integers(0, 2),
        count=st.integers(1, 3),
        reused=st.booleans(),
    )
    def send(self, producer: int, delta: int, payload: int, count: int, reused: bool) -> None:
        state = self.model.get(producer)
        base = state.batches[-1][0] + 1 if state else 0
        sequence = max(0, base + delta)
        digest = payload_digest([bytes([payload])] * count)
        decision = self.table.check(producer, sequence, digest, reused_refusal=reused)
        assert decision == self._expected(producer, sequence, digest, reused)
        if isinstance(decision, Append):
            offset = self.tail
            self.tail += count
            self.table.record(producer, sequence, digest, offset)
            self.log.append((producer, sequence, digest, offset))
            self.clock += 1
            if state is None:
                state = self.model[producer] = _ModelProducer()
            state.batches.append((sequence, digest, offset))
            state.last_append = self.clock
            if len(self.model) > PRODUCERS:
                coldest = min(self.model, key=lambda p: self.model[p].last_append)
                del self.model[coldest]

    @rule(upto=st.integers(0, 8))
    def retention(self, upto: int) -> None:
        self.start = min(self.tail, self.start + upto)
        self.table.trim(self.start)
        for producer in list(self.model):
            state = self.model[producer]
            state.batches = [b for b in state.batches if b[2] >= self.start]
            if not state.batches:
                del self.model[producer]

    @rule()
    def restart(self) -> None:
        self.table = ProducerTable(remembered=REMEMBER, max_producers=PRODUCERS)
        self.table.replay(mark for mark in self.log if mark[3] >= self.start)
        self.table.trim(self.start)

    @invariant()
    def same_producers(self) -> None:
        assert len(self.table) == len(self.model)
        for producer, state in self.model.items():
            assert self.table.next_sequence(producer) == state.batches[-1][0] + 1


ProducerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
test_producer_machine = ProducerMachine.TestCase
