"""Deliberately broken replicas, for tests only: each drops one rule of the core.

The model checker and the history checker must catch every one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from felix_broker.replication.core import Effect, Entry, Replica, WriteRecords


@dataclass(slots=True)
class AcksBeforeMajority(Replica):
    """Counts only its own disk: a write is acknowledged once the leader holds it."""

    def _quorum_length(self) -> int:
        return self.synced_length


@dataclass(slots=True)
class PromotesLagging(Replica):
    """Opens on any fenced majority, even when a fenced replica is further ahead."""

    def _caught_up(self) -> tuple[str, ...]:
        return ()


@dataclass(slots=True)
class KeepsOnRejoin(Replica):
    """A follower that never truncates: where a ship conflicts with what it holds, it
    keeps its own records and writes only past its tail, yet reports the ship held."""

    def _store(self, at: int, entries: Sequence[Entry]) -> list[Effect]:
        fresh = tuple(entries[max(self.length - at, 0) :])
        if not fresh:
            return []
        offset = self.length
        self.log.extend(fresh)
        return [WriteRecords(offset, fresh)]


BROKEN: tuple[type[Replica], ...] = (AcksBeforeMajority, PromotesLagging, KeepsOnRejoin)
