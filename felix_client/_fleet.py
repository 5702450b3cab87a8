"""What the client knows of a fleet of brokers, and the rules for following it (sans-IO).

`Fleet` holds the addresses the client may dial (the configured seeds, then
what `topology` answers, additively: a seed is never dropped), and per shard
the owner it last heard of (from a `not_leader`, a `shard_moved` or the owner
hint of a forwarded binary ack) with that owner's generation. A redirect older
than the generation held for its shard is ignored.

`Attempt` is one request's walk through the fleet: at most
`MAX_HOPS` redirects, never the same broker twice, and one trip back to the
entry broker when a redirect target answers `shard_unavailable` or `draining`.
Nothing here does I/O; the client asks these objects where to go next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from felix_wire.messages import BrokerEndpoint

__all__ = ["ENTRY", "MAX_HOPS", "Attempt", "Fleet", "Owner", "ShardRef"]

logger = logging.getLogger(__name__)

MAX_HOPS = 3
ENTRY: None = None
"""The target meaning "through the entry pools" (the seeds, forwarded as needed)."""

# (kind, namespace, name, shard): kind is "stream" or "cache"; a key watch whose
# shard the broker chooses is named by "key:<key>" instead of a shard number.
ShardRef = tuple[str, str, str, int | str]


@dataclass(frozen=True, slots=True)
class Owner:
    """A broker said to own a shard at `generation`; `addr` None when not published."""

    node_id: str
    addr: str | None
    generation: int


@dataclass
class Fleet:
    """Seeds, learned brokers and per-shard owners. Bounded: owners are kept for at
    most `max_shards` shards (the oldest entry goes first)."""

    seeds: tuple[str, ...]
    max_shards: int = 65536
    learned: dict[str, str] = field(default_factory=dict)  # addr -> node_id
    _owners: dict[ShardRef, Owner] = field(default_factory=dict)
    _generations: dict[ShardRef, int] = field(default_factory=dict)

    @property
    def addrs(self) -> list[str]:
        """Every address worth dialing: the seeds first, then learned brokers."""
        out = list(self.seeds)
        out.extend(a for a in self.learned if a not in self.seeds)
        return out

    def learn(self, brokers: list[BrokerEndpoint]) -> list[str]:
        """Add what a `topology_view` lists (additive); returns the new addresses."""
        new = [b.addr for b in brokers if b.addr and b.addr not in self.learned]
        for broker in brokers:
            if broker.addr:
                self.learned[broker.addr] = broker.node_id
        if new:
            logger.info("fleet: learned broker(s) %s", ", ".join(new))
        return [a for a in new if a not in self.seeds]

    def generation(self, ref: ShardRef) -> int | None:
        return self._generations.get(ref)

    def owner(self, ref: ShardRef) -> Owner | None:
        """The owner to try first for `ref` (None: go through the entry broker)."""
        owner = self._owners.get(ref)
        return owner if owner is not None and owner.addr else None

    def is_stale(self, ref: ShardRef, owner: Owner) -> bool:
        """Whether `owner` is older than the generation held for its shard."""
        held = self._generations.get(ref)
        return held is not None and owner.generation < held

    def note(self, ref: ShardRef, owner: Owner) -> bool:
        """Remember `owner` for `ref` unless it is older than what is held; returns
        whether it was taken. An equal generation replaces the owner (a freshly
        formed fleet has every shard at generation 0)."""
        if self.is_stale(ref, owner):
            held = self._generations.get(ref)
            logger.debug("fleet: ignoring %s for %s: generation below %s", owner, ref, held)
            return False
        self._generations[ref] = owner.generation
        self._owners.pop(ref, None)
        self._owners[ref] = owner
        while len(self._owners) > self.max_shards:
            oldest = next(iter(self._owners))
            del self._owners[oldest]
            self._generations.pop(oldest, None)
        return True

    def forget(self, ref: ShardRef) -> None:
        """Drop the owner of `ref` (it said "nothing applied, not here"); the
        generation stays, so an older redirect is still recognized as older."""
        if self._owners.pop(ref, None) is not None:
            logger.debug("fleet: forgot the owner of %s", ref)


class Attempt:
    """One request's route: where it went, where it may go next.

    Start at `first` (a known owner's address, or ENTRY); call `redirected` with
    each `not_leader` answer and `refused_here` with a `shard_unavailable` or
    `draining` answer; each returns the next target, or raises nothing and
    returns `False` when the request should fail with the answer it got."""

    def __init__(self, fleet: Fleet, ref: ShardRef | None, first: str | None) -> None:
        self.fleet = fleet
        self.ref = ref
        self.target: str | None = first
        self.visited: list[str | None] = [first]
        self.hops = 0
        self._bounced = False

    def at(self, addr: str) -> None:
        """The request reached broker `addr` (for the entry, known once dialed)."""
        if addr not in self.visited:
            self.visited.append(addr)

    def redirected(self, owner: Owner) -> str | bool | None:
        """The next target after a redirect to `owner`, or False to stop."""
        if self.ref is not None and self.fleet.is_stale(self.ref, owner):
            # Older than what we hold: follow what we hold instead, if unvisited.
            held = self.fleet.owner(self.ref)
            if held is None or held.addr in self.visited:
                return False
            return self._go(held.addr)
        if self.ref is not None:
            self.fleet.note(self.ref, owner)
        if owner.addr is None:
            return False
        return self._go(owner.addr)

    def _go(self, addr: str | None) -> str | bool | None:
        if self.hops >= MAX_HOPS or addr in self.visited:
            return False
        self.hops += 1
        self.visited.append(addr)
        self.target = addr
        return addr

    def refused_here(self) -> str | bool | None:
        """A target other than the entry said it cannot serve the shard now: back
        to the entry broker, once per attempt. False to stop."""
        if self.ref is not None:
            self.fleet.forget(self.ref)
        if self.target is ENTRY or self._bounced:
            return False
        self._bounced = True
        self.target = ENTRY
        return ENTRY
