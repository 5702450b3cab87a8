"""The state view of atomic commits on one shard, derived from its log, sans IO.

A commit is one record of the shard's log: its payload is the event, and the
same batch carries the entity key and the puts and deletes of that entity's
state (:class:`~felix_broker.storage.format.CommitMark`). The view is a fold
of those records in offset order and nothing else: it is never stored, and a
durable shard rebuilds it from its log when it opens, before it answers any
``state_get``. It is fed only records that are durable (per fsync mode), so a
read never shows a commit that a crash could still take away.

Answers (:meth:`StateView.get`): ``value`` is the latest put of the key (None
when never written or deleted since), ``version`` the offset of the commit
that wrote it, ``as_of`` the offset of the last commit applied: every commit
at or below it is reflected, none after (None before the first commit).

Retention that removes commit records removes the state they wrote
(:meth:`StateView.trim`): a key whose latest write lies below the log's new
start reads as never written, and ``as_of`` is None once no retained commit
is left, exactly as a rebuild from the retained log would answer. Memory
holds every live key of every entity of the shard; it is bounded by what the
shard's retention keeps, as the log is.
"""

from __future__ import annotations

from dataclasses import dataclass

from felix_broker.storage.format import CommitMark

__all__ = ["StateRead", "StateView"]


@dataclass(frozen=True, slots=True)
class StateRead:
    """One key's committed value, the commit that wrote it and the last commit reflected."""

    value: bytes | None
    version: int | None
    as_of: int | None


class StateView:
    """Every entity's state on one shard, as of the last commit applied."""

    def __init__(self) -> None:
        self._values: dict[tuple[bytes, str], tuple[bytes, int]] = {}
        self._as_of: int | None = None

    @property
    def as_of(self) -> int | None:
        """The offset of the last commit applied, None before the first."""
        return self._as_of

    def __len__(self) -> int:
        return len(self._values)

    def apply(self, offset: int, commit: CommitMark) -> None:
        """Apply the commit stored at ``offset``; commits come in offset order."""
        if self._as_of is not None and offset <= self._as_of:
            raise ValueError(f"commit at {offset} is not after the last applied ({self._as_of})")
        entity = commit.entity_key
        for change in commit.changes:
            if change.value is None:
                self._values.pop((entity, change.key), None)
            else:
                self._values[(entity, change.key)] = (change.value, offset)
        self._as_of = offset

    def get(self, entity_key: bytes, key: str) -> StateRead:
        """The committed value of ``key`` in ``entity_key``'s state."""
        found = self._values.get((entity_key, key))
        if found is None:
            return StateRead(None, None, self._as_of)
        value, version = found
        return StateRead(value, version, self._as_of)

    def trim(self, start_offset: int) -> None:
        """Retention removed every record below ``start_offset``, and the state they wrote."""
        stale = [name for name, (_, version) in self._values.items() if version < start_offset]
        for name in stale:
            del self._values[name]
        if self._as_of is not None and self._as_of < start_offset:
            # No retained commit is reflected any more: answer as a rebuild would.
            self._as_of = None
