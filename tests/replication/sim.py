"""A simulated replica set: the replication core with a lossy network and real-ish disks.

Each node has a `Disk` that keeps what the core wrote, with a synced prefix: a
crash drops the unsynced suffix, a restart rebuilds the core from what is left
(`Replica.recover`). The network is a bag of messages in flight that the driver
delivers in any order, drops or duplicates. The control plane is `promote`, with a
generation counter that only grows (etcd's mod_revision). Time is `now`, moved by
`tick`. Every client write and read is recorded as a `felix_broker.chaos.history`
operation, so the same runs feed the history checker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from felix_broker.chaos.history import Kind, Operation, Outcome
from felix_broker.replication.core import (
    Acked,
    CompactLog,
    Config,
    DiskImage,
    Effect,
    Entry,
    Halted,
    Message,
    PersistBallot,
    Phase,
    PromotionRefused,
    Refused,
    Replica,
    Send,
    Ship,
    ShipStored,
    Truncate,
    WriteRecords,
)

KEY = "s"
MAX_IN_FLIGHT = 64  # the network's bound: a message sent past it is lost
MAX_DELIVERIES = 2000  # per settle round: a replica pair that never converges stops here


@dataclass
class Disk:
    ballot_generation: int = 0
    ballot_leader: str | None = None
    log: list[Entry] = field(default_factory=list)
    synced: int = 0
    floor: int = 0  # compacted below: the sim keeps the records (ground truth) but a
    # restart does not get them back and a stored ship may not read them

    def image(self) -> DiskImage:
        floor = min(self.floor, self.synced)
        before = self.log[floor - 1].generation if floor else 0
        return DiskImage(
            self.ballot_generation,
            self.ballot_leader,
            tuple(self.log[floor : self.synced]),
            floor,
            before,
        )

    def durable(self) -> list[Entry]:
        return self.log[: self.synced]


class InvariantViolated(AssertionError):
    pass


@dataclass
class _Request:
    payload: bytes
    node: str
    invoke: int


class Cluster:
    def __init__(
        self,
        size: int,
        replica: type[Replica] = Replica,
        config: Config | None = None,
        *,
        apply: bool = True,
    ) -> None:
        self.names = tuple(f"n{i}" for i in range(size))
        self.replica_type = replica
        self.config = config or Config(quorum_timeout_ms=1000, retransmit_ms=50)
        self.disks = {name: Disk() for name in self.names}
        self.nodes: dict[str, Replica | None] = {
            name: replica(name, self.names, self.config) for name in self.names
        }
        self.network: list[tuple[str, Message]] = []
        self.now = 0
        self.generation = 0
        self.majority = size // 2 + 1
        self.history: list[Operation] = []
        self.acked: dict[bytes, tuple[int, int]] = {}  # payload -> (offset, generation)
        self.requests: dict[int, _Request] = {}
        self.next_request = 1
        self.accepted_by: dict[int, set[str]] = {}  # generation -> nodes that took writes
        self.committed: list[Entry] = []  # the longest committed prefix any leader showed
        self.commits: dict[str, int] = {}  # per live node: its last known mark
        self.marks: dict[tuple[str, int], int] = {}  # (node, generation) -> last mark
        self.events: list[Effect] = []  # promotion refusals and halts, for tests to inspect
        self.applies = apply  # each sync also applies what is committed (compaction)
        self.stored_ships = 0  # ships read from a disk (below a leader's in-memory base)

    # -- driving

    def alive(self) -> list[str]:
        return [n for n, r in self.nodes.items() if r is not None]

    def apply(self, name: str, effects: list[Effect]) -> None:
        disk = self.disks[name]
        for effect in effects:
            if isinstance(effect, Send):
                if len(self.network) < MAX_IN_FLIGHT:
                    self.network.append((effect.to, effect.message))
            elif isinstance(effect, WriteRecords):
                assert effect.offset == len(disk.log), (effect, len(disk.log))
                disk.log.extend(effect.entries)
            elif isinstance(effect, Truncate):
                del disk.log[effect.length :]
                disk.synced = min(disk.synced, effect.length)
            elif isinstance(effect, PersistBallot):
                disk.ballot_generation = effect.generation
                disk.ballot_leader = effect.leader
            elif isinstance(effect, Acked):
                self._complete(
                    effect.request_id,
                    Outcome.OK,
                    offset=effect.first_offset,
                    generation=effect.generation,
                )
            elif isinstance(effect, Refused):
                self._complete(effect.request_id, Outcome.REFUSED, refusal=effect)
            elif isinstance(effect, PromotionRefused | Halted):
                self.events.append(effect)
            elif isinstance(effect, CompactLog):
                assert effect.length <= disk.synced, (effect, disk.synced)
                disk.floor = max(disk.floor, effect.length)
            elif isinstance(effect, ShipStored):
                assert disk.floor <= effect.offset, (effect, disk.floor)
                assert effect.offset + effect.count <= disk.synced, (effect, disk.synced)
                entries = tuple(disk.log[effect.offset : effect.offset + effect.count])
                before = disk.log[effect.offset - 1].generation if effect.offset else 0
                ship = Ship(
                    effect.generation,
                    effect.leader,
                    effect.offset,
                    before,
                    entries,
                    effect.commit,
                    effect.compacted,
                )
                if len(self.network) < MAX_IN_FLIGHT:
                    self.network.append((effect.to, ship))
                self.stored_ships += 1

    def _complete(
        self,
        request_id: int,
        outcome: Outcome,
        offset: int | None = None,
        generation: int = 0,
        refusal: Refused | None = None,
    ) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if outcome is Outcome.OK:
            assert offset is not None
            self.acked[request.payload] = (offset, generation)
        self.history.append(
            Operation(
                client=f"c{request_id}",
                kind=Kind.APPEND,
                key=KEY,
                value=request.payload.decode(),
                invoke=request.invoke,
                complete=self.now,
                outcome=outcome,
                # Not `offset`: the core's log offsets count generation-start entries,
                # a history's offsets are positions among delivered records (the
                # checker's acked_offset rule); `self.acked` keeps the log offset.
                retry=refusal.retry.wire if refusal else None,
                code=refusal.code.wire if refusal else None,
            )
        )

    def append(self, name: str, payload: bytes) -> None:
        replica = self.nodes[name]
        if replica is None:
            return
        request_id = self.next_request
        self.next_request += 1
        self.requests[request_id] = _Request(payload, name, self.now)
        generation = replica.generation
        effects = replica.append(request_id, [payload], self.now)
        if any(isinstance(e, WriteRecords) for e in effects):
            self.accepted_by.setdefault(generation, set()).add(name)
        self.apply(name, effects)

    def deliver(self, index: int, keep: bool = False) -> None:
        if not self.network:
            return
        index %= len(self.network)
        to, message = self.network[index] if keep else self.network.pop(index)
        replica = self.nodes[to]
        if replica is not None:
            self.apply(to, replica.receive(message, self.now))

    def flush(self, limit: int = MAX_DELIVERIES, apart: str | None = None) -> None:
        """Deliver what is in flight, and what that sends, oldest first (bounded);
        with `apart`, that node is partitioned away: what is sent to it is lost."""
        for _ in range(limit):
            if apart is not None:
                self.cut_off(apart)
            if not self.network:
                return
            self.deliver(0)

    def cut_off(self, name: str) -> None:
        """Lose every message in flight to `name`."""
        self.network = [(to, m) for to, m in self.network if to != name]

    def drop(self, index: int) -> None:
        if self.network:
            self.network.pop(index % len(self.network))

    def sync(self, name: str) -> None:
        replica = self.nodes[name]
        if replica is None:
            return
        disk = self.disks[name]
        disk.synced = len(disk.log)
        self.apply(name, replica.synced(disk.synced))
        if self.applies:  # applied at once: everything committed is in the stream log
            self.apply(name, replica.applied(replica.apply_to))

    def full_log(self, replica: Replica) -> list[Entry]:
        """`replica`'s whole log: what it compacted from memory (on its disk) and the rest."""
        return self.disks[replica.node_id].log[: replica.base] + replica.log

    def crash(self, name: str) -> None:
        if self.nodes[name] is None:
            return
        self.nodes[name] = None
        disk = self.disks[name]
        del disk.log[disk.synced :]
        self.commits.pop(name, None)
        for request_id, request in list(self.requests.items()):
            if request.node == name:  # its client never hears back
                del self.requests[request_id]
                self.history.append(
                    Operation(
                        client=f"c{request_id}",
                        kind=Kind.APPEND,
                        key=KEY,
                        value=request.payload.decode(),
                        invoke=request.invoke,
                        outcome=Outcome.UNKNOWN,
                    )
                )

    def restart(self, name: str) -> None:
        if self.nodes[name] is not None:
            return
        self.nodes[name] = self.replica_type.recover(
            name, self.names, self.disks[name].image(), self.config
        )

    def tick(self, elapsed: int) -> None:
        self.now += elapsed
        for name in self.alive():
            replica = self.nodes[name]
            assert replica is not None
            self.apply(name, replica.tick(self.now))

    def promote(self, name: str) -> None:
        """The control plane makes `name` leader at a new generation (it only picks a
        live member, i.e. one whose lease holds)."""
        replica = self.nodes[name]
        if replica is None or replica.lease_lapsed:
            return
        self.generation = (
            max(self.generation, *(d.ballot_generation for d in self.disks.values())) + 1
        )
        self.apply(name, replica.promote(self.generation, self.now))

    def expire_lease(self, name: str) -> None:
        replica = self.nodes[name]
        if replica is not None:
            self.apply(name, replica.lease_expired())

    def renew_lease(self, name: str) -> None:
        replica = self.nodes[name]
        if replica is not None:
            self.apply(name, replica.lease_renewed())

    def read(self, name: str) -> list[bytes] | None:
        """A reader at `name` from the start; recorded when served."""
        replica = self.nodes[name]
        if replica is None:
            return None
        result = replica.read(0, 10_000)
        if result.code is not None:
            return None
        values = self._compacted_values(replica) + [payload for _, payload in result.records]
        self.history.append(
            Operation(
                client=f"r-{name}",
                kind=Kind.READ,
                key=KEY,
                offset=0,
                values=[v.decode() for v in values],
                invoke=self.now,
                complete=self.now,
                outcome=Outcome.OK,
            )
        )
        return values

    def settle(self, rounds: int = 200) -> None:
        """Deliver everything, sync everyone, let time pass: the heal after a run."""
        for _ in range(rounds):
            for name in self.alive():
                self.sync(name)
            if not self.network:
                self.tick(self.config.retransmit_ms)
                if not self.network:
                    break
            self.flush()

    def leaders(self) -> list[Replica]:
        return [r for r in self.nodes.values() if r is not None and r.phase is Phase.LEADER]

    def final_history(self, leader: Replica) -> list[Operation]:
        """The history with the final log as `leader` serves it (after `settle`)."""
        result = leader.read(0, 100_000)
        held = self._compacted_values(leader) + [p for _, p in result.records]
        values = [p.decode() for p in held]
        final = Operation(
            client="final",
            kind=Kind.FINAL,
            key=KEY,
            values=values,
            invoke=self.now,
            complete=self.now,
            outcome=Outcome.OK,
        )
        pending = [
            Operation(
                client=f"c{request_id}",
                kind=Kind.APPEND,
                key=KEY,
                value=r.payload.decode(),
                invoke=r.invoke,
                outcome=Outcome.UNKNOWN,
            )
            for request_id, r in self.requests.items()
        ]
        return [*self.history, *pending, final]

    def _compacted_values(self, replica: Replica) -> list[bytes]:
        """What a reader gets below `replica.base` (the stream log, in a broker)."""
        below = self.disks[replica.node_id].log[: replica.base]
        return [e.payload for e in below if not e.start]

    # -- the invariants, checked after every step

    def check(self) -> None:
        # Leader consistency acknowledges at the leader's own disk: an acknowledged
        # write may be lost in a failover (the promise), so only the majority mark's
        # records must survive (`_followers_are_prefixes`, on `commit`).
        if not self.config.leader_acks:
            self._acked_survive()
        self._one_writer_per_generation()
        self._followers_are_prefixes()
        self._marks_only_advance()

    def _fail(self, text: str) -> None:
        raise InvariantViolated(text)

    def _acked_survive(self) -> None:
        for payload, (offset, _) in self.acked.items():
            holders = [
                name
                for name, disk in self.disks.items()
                if offset < disk.synced and disk.log[offset].payload == payload
            ]
            if len(holders) < self.majority:
                self._fail(f"acknowledged {payload!r}@{offset} durable only on {holders}")
        # Every leader of a generation at or after a write's acknowledgement holds it
        # (a deposed leader of an older generation that has not heard yet need not).
        for leader in self.leaders():
            log = self.full_log(leader)
            for payload, (offset, generation) in self.acked.items():
                if generation > leader.generation:
                    continue
                if offset >= len(log) or log[offset].payload != payload:
                    self._fail(
                        f"leader {leader.node_id} at generation {leader.generation} lacks "
                        f"{payload!r}@{offset}, acknowledged at generation {generation}"
                    )

    def _one_writer_per_generation(self) -> None:
        for generation, nodes in self.accepted_by.items():
            if len(nodes) > 1:
                self._fail(f"generation {generation} took writes at {sorted(nodes)}")
        generations = [r.generation for r in self.leaders()]
        if len(generations) != len(set(generations)):
            self._fail(f"two leaders share a generation: {generations}")

    def _followers_are_prefixes(self) -> None:
        for leader in self.leaders():
            for replica in self.nodes.values():
                if (
                    replica is None
                    or replica.phase is not Phase.FOLLOWER
                    or replica.generation != leader.generation
                    or replica.leader != leader.node_id
                ):
                    continue
                held = replica.verified_length
                if self.full_log(replica)[:held] != self.full_log(leader)[:held]:
                    self._fail(
                        f"{replica.node_id}'s first {held} records differ from leader "
                        f"{leader.node_id}'s at generation {leader.generation}"
                    )
        for leader in self.leaders():
            if leader.mark is None:
                continue
            shown = self.full_log(leader)[: self._committed_mark(leader)]
            common = min(len(shown), len(self.committed))
            if shown[:common] != self.committed[:common]:
                self._fail(
                    f"leader {leader.node_id}'s committed log diverges from what was committed"
                )
            if len(shown) > len(self.committed):
                self.committed = list(shown)

    def _committed_mark(self, leader: Replica) -> int:
        """What `leader` shows as committed: its mark (Quorum), its majority mark
        (Leader: its own mark counts its disk alone)."""
        assert leader.mark is not None
        return leader.commit if self.config.leader_acks else leader.mark

    def _marks_only_advance(self) -> None:
        for name, replica in self.nodes.items():
            if replica is None:
                continue
            before = self.commits.get(name, 0)
            if replica.commit < before:
                self._fail(f"{name}'s mark moved back from {before} to {replica.commit}")
            self.commits[name] = replica.commit
            if replica.phase is Phase.LEADER and replica.mark is not None:
                if replica.mark < replica.commit:  # applied before its ack: no offset
                    self._fail(f"{name}'s mark {replica.mark} trails its commit")
                key = (name, replica.generation)
                if replica.mark < self.marks.get(key, 0):
                    self._fail(f"{name}'s mark at generation {replica.generation} moved back")
                self.marks[key] = replica.mark
