"""Idempotent batches of a Quorum stream judged at their place in the log
(replication/apply.py, decision quorum-idempotent-producers): every replica checks a
numbered batch against its own producer table when the batch's turn comes, so every
replica appends the same batches and keeps the same table; a duplicate, a gap, an
unknown producer or a reused sequence writes nothing; `apply`'s verdict decodes to
the protocol's answer; the restart walk and the compaction weighing count a refused
batch as no records."""

from __future__ import annotations

import pytest

from felix_broker.replication.apply import decode_verdict, encode_batch, encode_verdict
from felix_broker.replication.core import Entry
from felix_broker.streams.producers import (
    Append,
    Duplicate,
    Refusal,
    RefusalReason,
    payload_digest,
)
from felix_wire.fleet import ReplicatedBatch

from .apply_support import SPEC, Replica, replicas

__all__ = ["replicas"]

pytestmark = pytest.mark.timeout(30)

P = 0xFEED


def numbered(sequence: int, *payloads: bytes, producer: int = P) -> Entry:
    replicated = ReplicatedBatch(
        timestamp_us=1,
        payloads=list(payloads),
        producer_id=producer,
        sequence=sequence,
        digest=payload_digest(list(payloads)),
    )
    return Entry(1, encode_batch(replicated))


def plain(*payloads: bytes) -> Entry:
    return Entry(1, encode_batch(ReplicatedBatch(timestamp_us=1, payloads=list(payloads))))


def answers(verdicts: list[int | None], *, reused_refusal: bool) -> list[object]:
    return [
        None if v is None else decode_verdict(v, reused_refusal=reused_refusal) for v in verdicts
    ]


ENTRIES = [
    Entry(1, b"", start=True),
    plain(b"r0"),
    numbered(0, b"a0", b"a1"),  # appended at 1
    numbered(0, b"a0", b"a1"),  # a resend: the original's offset
    numbered(3, b"g"),  # a gap: the table expects 1
    numbered(1, b"other", b"x"),  # appended at 3
    numbered(1, b"reused"),  # same sequence, other payloads
    numbered(4, b"u", producer=P + 1),  # an unknown producer
    numbered(2, b"c"),  # appended at 5
]


async def test_numbered_batches_are_judged_at_their_place_in_the_log_on_every_replica(
    replicas: list[Replica],
) -> None:
    for replica in replicas:
        verdicts = await replica.applier.apply(ENTRIES)
        assert verdicts[:3] == [None, 0, 1]
        assert answers(verdicts, reused_refusal=True) == [
            None,
            Append(),
            Append(),
            Duplicate(1),
            Refusal(RefusalReason.SEQUENCE_GAP, 1),
            Append(),
            Refusal(RefusalReason.SEQUENCE_REUSED),
            Refusal(RefusalReason.UNKNOWN_PRODUCER),
            Append(),
        ]
        assert verdicts[5] == 3 and verdicts[8] == 5
        # Without FEATURE_SEQUENCE_REUSED a reused sequence is the original's publish_ok.
        assert answers(verdicts, reused_refusal=False)[6] == Duplicate(3)
        assert replica.stream() == [b"r0", b"a0", b"a1", b"other", b"x", b"c"]
        table = replica.engine.shard(SPEC, 0).marks.producers
        assert table.next_sequence(P) == 3 and table.next_sequence(P + 1) is None


async def test_the_restart_walk_and_the_weighing_count_refused_batches_as_nothing(
    replicas: list[Replica],
) -> None:
    replica = replicas[0]
    await replica.applier.apply(ENTRIES)
    # Everything applied: the walk tells applied batches from refused ones by the log.
    assert replica.applier.applied_entries(ENTRIES, 0) == len(ENTRIES)
    assert replica.stream_applier.applied_entries(ENTRIES[1:], 0) == len(ENTRIES) - 1
    # Compaction weighs in log order, each entry once: the sizes judged.
    weights = [replica.applier.records_of(e) for e in ENTRIES]
    assert weights == [0, 1, 2, 0, 0, 2, 0, 0, 1]
    # A numbered batch past the stream log's end is not applied yet (judged when it is).
    pending = [*ENTRIES, numbered(3, b"d")]
    assert replica.applier.applied_entries(pending, 0) == len(ENTRIES)
    assert await replica.applier.apply(pending[-1:]) == [6]


def test_a_verdict_round_trips() -> None:
    cases = [
        (Append(), 7, Append()),
        (Duplicate(0), 9, Duplicate(0)),
        (Duplicate(2**40), 9, Duplicate(2**40)),
        (Refusal(RefusalReason.SEQUENCE_GAP, 12), 3, Refusal(RefusalReason.SEQUENCE_GAP, 12)),
        (Refusal(RefusalReason.SEQUENCE_EXPIRED), 3, Refusal(RefusalReason.SEQUENCE_EXPIRED)),
        (Refusal(RefusalReason.UNKNOWN_PRODUCER), 0, Refusal(RefusalReason.UNKNOWN_PRODUCER)),
    ]
    for decision, at, want in cases:
        value = encode_verdict(decision, at)
        assert decode_verdict(value, reused_refusal=True) == want
        assert (value >= 0) == isinstance(decision, Append)
