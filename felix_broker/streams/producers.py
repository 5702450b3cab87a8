"""Idempotent producers of one shard: the protocol's answer table, sans IO.

A producer numbers its batches per shard from 0, one per batch. For each
producer the shard remembers the next expected sequence and where the last
:data:`REMEMBERED_BATCHES` batches landed (their first offset and a digest
of their payloads), for at most :data:`MAX_PRODUCERS` producers:

============================================  ==========================================
incoming sequence                             answer (:meth:`ProducerTable.check`)
============================================  ==========================================
unknown producer, sequence 0                  :class:`Append`
unknown producer, sequence != 0               refused ``unknown_producer``
next expected                                 :class:`Append`
ahead of expected                             refused ``sequence_gap {expected}``
remembered, same digest                       :class:`Duplicate` (original offset, nothing
                                              appended)
remembered, different digest                  refused ``sequence_reused`` to a client that
                                              offered FEATURE_SEQUENCE_REUSED; otherwise
                                              :class:`Duplicate` of the original (the
                                              protocol's "publish_ok, silently not written")
older than anything remembered                refused ``sequence_expired``
============================================  ==========================================

The table changes only through :meth:`ProducerTable.record` (a batch was
appended) and :meth:`ProducerTable.trim` (retention removed the log below an
offset). A durable shard replays the producer marks stored in its log through
``record`` and ``trim`` when it opens, so after a restart it answers every
resend exactly as before: the table is a pure function of the retained log.
That is also why "coldest" means "whose last appended batch is oldest": a
duplicate answered changes nothing, since it writes nothing the log could
replay.

Bounds: a producer keeps at most :data:`REMEMBERED_BATCHES` entries (the
oldest goes first; a resend of it is then ``sequence_expired``). Past
:data:`MAX_PRODUCERS` producers the coldest is forgotten, and a producer is
forgotten when retention removes its last remembered batch; a forgotten
producer's next batch (sequence != 0) is refused ``unknown_producer``. Each
entry costs a few dozen bytes, so a shard's table is bounded at about
4,096 x 64 entries.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_PRODUCERS",
    "REMEMBERED_BATCHES",
    "Append",
    "Decision",
    "Duplicate",
    "ProducerTable",
    "Refusal",
    "RefusalReason",
    "payload_digest",
]

REMEMBERED_BATCHES = 64
MAX_PRODUCERS = 4096

_LENGTH = struct.Struct(">I")


def payload_digest(payloads: Sequence[bytes]) -> int:
    """A 64-bit digest of a batch: its record count and every payload with its length.

    BLAKE2b with an 8-byte digest (stdlib, in C): a resend carrying the same
    records in the same order has the same digest, and different batches
    collide with probability about 2**-64.
    """
    digest = hashlib.blake2b(_LENGTH.pack(len(payloads)), digest_size=8)
    for payload in payloads:
        digest.update(_LENGTH.pack(len(payload)))
        digest.update(payload)
    return int.from_bytes(digest.digest(), "big")


class RefusalReason(enum.Enum):
    """Why a numbered batch was not appended (the wire's publish_refused reasons)."""

    UNKNOWN_PRODUCER = "unknown_producer"
    SEQUENCE_GAP = "sequence_gap"
    SEQUENCE_EXPIRED = "sequence_expired"
    SEQUENCE_REUSED = "sequence_reused"


@dataclass(frozen=True, slots=True)
class Append:
    """Append the batch, then :meth:`ProducerTable.record` it."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Already appended at ``offset``: answer with it and append nothing."""

    offset: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """Refuse; ``expected`` is the next expected sequence for ``SEQUENCE_GAP``."""

    reason: RefusalReason
    expected: int | None = None


Decision = Append | Duplicate | Refusal

_APPEND = Append()


@dataclass(frozen=True, slots=True)
class _Entry:
    sequence: int
    digest: int
    offset: int


class _Producer:
    __slots__ = ("entries",)

    def __init__(self, remembered: int) -> None:
        self.entries: deque[_Entry] = deque(maxlen=remembered)

    @property
    def next_sequence(self) -> int:
        return self.entries[-1].sequence + 1

    def find(self, sequence: int) -> _Entry | None:
        entries = self.entries
        # Sequences are consecutive in a producer's deque.
        at = sequence - entries[0].sequence
        if 0 <= at < len(entries):
            return entries[at]
        return None


class ProducerTable:
    """One shard's idempotent producers (see the module docs)."""

    def __init__(
        self, *, remembered: int = REMEMBERED_BATCHES, max_producers: int = MAX_PRODUCERS
    ) -> None:
        if remembered < 1 or max_producers < 1:
            raise ValueError("remembered and max_producers must be at least 1")
        self._remembered = remembered
        self._max_producers = max_producers
        # Coldest first: a producer moves to the end whenever a batch of it is recorded.
        self._producers: OrderedDict[int, _Producer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._producers

    def next_sequence(self, producer_id: int) -> int | None:
        """The sequence the producer's next batch must carry; None for an unknown producer."""
        producer = self._producers.get(producer_id)
        return None if producer is None else producer.next_sequence

    def check(
        self, producer_id: int, sequence: int, digest: int, *, reused_refusal: bool
    ) -> Decision:
        """The answer to batch ``sequence`` of ``producer_id`` with payload ``digest``.

        ``reused_refusal``: the client offered FEATURE_SEQUENCE_REUSED, so a
        remembered sequence with other payloads is refused ``sequence_reused``.
        Changes nothing: call :meth:`record` once an :class:`Append` is appended.
        """
        producer = self._producers.get(producer_id)
        if producer is None:
            if sequence == 0:
                return _APPEND
            return Refusal(RefusalReason.UNKNOWN_PRODUCER)
        expected = producer.next_sequence
        if sequence == expected:
            return _APPEND
        if sequence > expected:
            return Refusal(RefusalReason.SEQUENCE_GAP, expected)
        entry = producer.find(sequence)
        if entry is None:
            return Refusal(RefusalReason.SEQUENCE_EXPIRED)
        if entry.digest == digest or not reused_refusal:
            return Duplicate(entry.offset)
        return Refusal(RefusalReason.SEQUENCE_REUSED)

    def record(self, producer_id: int, sequence: int, digest: int, offset: int) -> None:
        """Batch ``sequence`` of ``producer_id`` was appended at ``offset``.

        Called after every append that :meth:`check` allowed, and for every
        producer mark while a log is replayed. A mark that does not continue
        the producer (sequence 0 of a producer the table still holds, which
        only a log written by other code could contain) starts it afresh.
        """
        producer = self._producers.get(producer_id)
        if producer is None or sequence != producer.next_sequence:
            producer = _Producer(self._remembered)
            self._producers[producer_id] = producer
        producer.entries.append(_Entry(sequence, digest, offset))
        self._producers.move_to_end(producer_id)
        while len(self._producers) > self._max_producers:
            self._producers.popitem(last=False)

    def trim(self, start_offset: int) -> None:
        """Retention removed every record below ``start_offset``: forget batches there.

        A producer whose every remembered batch is gone is forgotten.
        """
        gone: list[int] = []
        for producer_id, producer in self._producers.items():
            entries = producer.entries
            while entries and entries[0].offset < start_offset:
                entries.popleft()
            if not entries:
                gone.append(producer_id)
        for producer_id in gone:
            del self._producers[producer_id]

    def replay(self, marks: Iterable[tuple[int, int, int, int]]) -> None:
        """:meth:`record` each ``(producer_id, sequence, digest, offset)``, in log order."""
        for producer_id, sequence, digest, offset in marks:
            self.record(producer_id, sequence, digest, offset)
