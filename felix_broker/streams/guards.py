"""Checks that run where a shard assigns offsets, and what a shard derives from its marks.

A publish may carry an :class:`AppendGuard`. The tenant's publish worker, which
appends one batch at a time, asks the guard right before the append
(:meth:`AppendGuard.admit` with the shard's raw tail, the offset the batch
would start at) and tells it what happened (:meth:`AppendGuard.appended`,
then :meth:`AppendGuard.durable` once the batch is durable per fsync mode,
before the answer). Check and offset assignment run in the same synchronous
step of the worker, so no other append of the shard can come between them:
of N conditional writes expecting the same offset exactly one is admitted.

Guards:

- :class:`ProducerGuard`: an idempotent producer's numbered batch (the answer
  table of :mod:`felix_broker.streams.producers`); durable shards store the
  producer mark with the batch.
- :class:`ConditionalGuard`: ``publish_if``; admitted only at ``expected_offset``.
- :class:`CommitGuard`: ``commit``, optionally conditional; the event and its
  state changes are one stored record, applied to the state view once durable.

:class:`ShardMarks` holds a shard's producer table and state view, rebuilt
from the log's extension areas when the shard opens and trimmed as retention
moves the log's start (checked on use, so storage needs no callback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from felix_broker.storage import Log
from felix_broker.storage.format import BatchExtension, CommitMark, ProducerMark
from felix_broker.streams.producers import (
    Append,
    Duplicate,
    ProducerTable,
    Refusal,
    RefusalReason,
)
from felix_broker.streams.state import StateView
from felix_wire.messages import (
    OffsetMismatch,
    PublishRefusal,
    PublishRefusalReason,
    PublishRefused,
    SequenceGap,
)

__all__ = [
    "Admission",
    "AppendGuard",
    "AppendRefusedError",
    "CommitGuard",
    "ConditionalGuard",
    "ProducerGuard",
    "ShardMarks",
    "TailMismatch",
    "publish_refused",
]


@dataclass(frozen=True, slots=True)
class TailMismatch:
    """A conditional write expected another tail; ``tail`` is the one checked."""

    tail: int


Admission = Append | Duplicate | Refusal | TailMismatch


class AppendRefusedError(Exception):
    """A guard refused the batch; nothing was appended."""

    def __init__(self, admission: Refusal | TailMismatch) -> None:
        super().__init__(_describe(admission))
        self.admission = admission


class ShardMarks:
    """A shard's idempotent producers and commit state, derived from its log only."""

    def __init__(self) -> None:
        self.producers = ProducerTable()
        self.state = StateView()
        self._start = 0
        # False on a replicated stream shard: its producer table forgets batches only
        # at the retention cuts of its replication log (`cut_producers`), the same
        # place on every replica, never at its own log's start (decision
        # quorum-retention-cut).
        self.producers_follow_log = True

    @classmethod
    def rebuild(cls, log: Log | None) -> ShardMarks:
        """Replay every retained producer mark and commit of ``log`` (blocking reads)."""
        marks = cls()
        if log is None:
            return marks
        for offset, _count, extension in log.extensions():
            marks.replay(offset, extension)
        marks.follow(log.start_offset)
        return marks

    def replay(self, offset: int, extension: BatchExtension) -> None:
        """Account one stored batch's extension, in log order."""
        mark = extension.producer
        if mark is not None:
            self.producers.record(mark.producer_id, mark.sequence, mark.digest, offset)
        if extension.commit is not None:
            self.state.apply(offset, extension.commit)

    def follow(self, start_offset: int) -> None:
        """Forget what retention removed, once the log's start has moved past it."""
        if start_offset > self._start:
            self._start = start_offset
            if self.producers_follow_log:
                self.producers.trim(start_offset)
            self.state.trim(start_offset)

    def cut_producers(self, retain_from: int) -> None:
        """A replicated retention cut: forget the producer batches below ``retain_from``."""
        self.producers.trim(retain_from)


class AppendGuard(Protocol):
    """What the publish worker asks around the append of a guarded batch."""

    def admit(self, tail: int, start: int) -> Admission:
        """Append, answer a duplicate's offset, or refuse.

        ``tail`` is the shard's raw next offset, ``start`` its oldest retained one.
        """
        ...

    def extension(self, durable: bool) -> BatchExtension | None:
        """What a durable shard stores with the batch (None for in-memory shards)."""
        ...

    def appended(self, offset: int) -> None:
        """The batch was appended at ``offset`` (not yet durable)."""
        ...

    def durable(self, offset: int) -> None:
        """The batch appended at ``offset`` is durable; called before it is answered."""
        ...


class ProducerGuard:
    """An idempotent producer's batch ``sequence`` on one shard."""

    def __init__(
        self,
        marks: ShardMarks,
        *,
        producer_id: int,
        sequence: int,
        digest: int,
        reused_refusal: bool,
    ) -> None:
        self._marks = marks
        self.producer_id = producer_id
        self.sequence = sequence
        self.digest = digest
        self.reused_refusal = reused_refusal
        self.admission: Admission | None = None
        """What :meth:`admit` decided (a duplicate, for the metrics), once it ran."""

    def admit(self, tail: int, start: int) -> Admission:
        self._marks.follow(start)
        self.admission = self._marks.producers.check(
            self.producer_id, self.sequence, self.digest, reused_refusal=self.reused_refusal
        )
        return self.admission

    def extension(self, durable: bool) -> BatchExtension | None:
        if not durable:
            return None
        return BatchExtension(producer=ProducerMark(self.producer_id, self.sequence, self.digest))

    def appended(self, offset: int) -> None:
        self._marks.producers.record(self.producer_id, self.sequence, self.digest, offset)

    def durable(self, offset: int) -> None:
        return None


class ConditionalGuard:
    """``publish_if``: admitted only when the batch would start at ``expected_offset``."""

    def __init__(self, expected_offset: int) -> None:
        self.expected_offset = expected_offset

    def admit(self, tail: int, start: int) -> Admission:
        if tail != self.expected_offset:
            return TailMismatch(tail)
        return Append()

    def extension(self, durable: bool) -> BatchExtension | None:
        return None

    def appended(self, offset: int) -> None:
        return None

    def durable(self, offset: int) -> None:
        return None


class CommitGuard:
    """``commit``: the event with its entity's state changes, as one stored record."""

    def __init__(
        self, marks: ShardMarks, commit: CommitMark, *, expected_offset: int | None = None
    ) -> None:
        self._marks = marks
        self.commit = commit
        self.expected_offset = expected_offset

    def admit(self, tail: int, start: int) -> Admission:
        self._marks.follow(start)
        if self.expected_offset is not None and tail != self.expected_offset:
            return TailMismatch(tail)
        return Append()

    def extension(self, durable: bool) -> BatchExtension | None:
        # Commits exist on durable shards only (the handler refuses the others);
        # the mark is stored either way so that it can never be silently dropped.
        return BatchExtension(commit=self.commit)

    def appended(self, offset: int) -> None:
        return None

    def durable(self, offset: int) -> None:
        self._marks.state.apply(offset, self.commit)


def _describe(admission: Refusal | TailMismatch) -> str:
    if isinstance(admission, TailMismatch):
        return f"the shard's next offset is {admission.tail}"
    reason = admission.reason
    if reason is RefusalReason.SEQUENCE_GAP:
        return f"sequence gap: the shard expects sequence {admission.expected}"
    if reason is RefusalReason.SEQUENCE_EXPIRED:
        return "sequence expired: older than the batches this shard remembers"
    if reason is RefusalReason.SEQUENCE_REUSED:
        return "sequence reused with different payloads"
    return "unknown producer: start a new producer (producer_init) and resend from sequence 0"


def publish_refused(request_id: int, admission: Refusal | TailMismatch) -> PublishRefused:
    """The wire answer for a refused guarded batch."""
    message = _describe(admission)
    if isinstance(admission, TailMismatch):
        reason: PublishRefusalReason = PublishRefusal(
            offset_mismatch=OffsetMismatch(tail=admission.tail)
        )
    elif admission.reason is RefusalReason.SEQUENCE_GAP:
        expected = admission.expected if admission.expected is not None else 0
        reason = PublishRefusal(sequence_gap=SequenceGap(expected=expected))
    elif admission.reason is RefusalReason.SEQUENCE_EXPIRED:
        reason = "sequence_expired"
    elif admission.reason is RefusalReason.SEQUENCE_REUSED:
        reason = "sequence_reused"
    else:
        reason = "unknown_producer"
    return PublishRefused(request_id=request_id, reason=reason, message=message)
