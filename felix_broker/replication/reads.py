"""Majority-confirmed reads of Quorum shards: a read round to the replica set.

By default a read of a replicated Quorum cache (get, counter_get) is served by the
open leader under its etcd lease (`CacheReplication.read_refusal`). With
FELIX_QUORUM_READS=majority, and once the fleet finalized ``lease_free_reads``, a
get or counter_get is also confirmed by a **read round** before it is answered:

1. the leader takes the value from its applied shard (applied means committed:
   never past the mark, and every acknowledged write is applied on the leader
   before its acknowledgement, so the value includes every write acknowledged
   before the read began);
2. it asks every follower (`replica_read_round`, spec/fleet.yaml) whether it still
   holds the leader's generation;
3. it answers once a majority of the replica set, itself included, confirmed.

Why this is enough: a newer leader opens only after a majority persisted its
newer generation (the promotion fence), and a replica's ballot never goes back.
A majority that answered "at most your generation" after the value was taken
overlaps that fenced majority in at least one replica, so no newer leader had
opened (and so none had acknowledged a write) when the value was taken.

The round fails, and the read answers ``leadership_lost`` with the catalogue's
retry class for it (outcome_unknown), when one answer names a newer generation,
when every follower answered or dropped out without a majority, or when no majority
confirmed within FELIX_PUBLISH_QUORUM_TIMEOUT_MS. A follower that cannot be reached
(or a link cut by the test-mode ``peer_blocked`` fault) simply gives no vote.

Rounds of one shard are shared, but only forward in time: at most one round runs
and one is queued per shard. A read joins the queued round (which starts once the
running one ended), never the running one, since that round may have asked a
replica before the read's value was taken. The replica's side is read-only: it
compares the generation with its ballot and persists nothing.

Scope: gets and counter_gets of replicated Quorum caches. Watches and stream
readers stay on the lease, and a lapsed lease still refuses reads
(`read_refusal` runs first): the round is a check on top of the lease, not yet a
replacement for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from felix_broker.fleet.peer import PeerDialer, PeerOrigin, PeerProtocolError, PeerUnavailableError
from felix_common.fleet import ShardId, ShardKind
from felix_wire.errors import ErrorCode
from felix_wire.fleet import PeerMessage, ReplicaReadAnswer, ReplicaReadRound

from .core import Phase
from .driver import ReplicaDriver, ReplicationRefusedError
from .service import Blocked, ReplicationService
from .wire import wire_shard

__all__ = ["ReadRounds", "leadership_lost"]

_log = logging.getLogger(__name__)


def leadership_lost(text: str) -> ReplicationRefusedError:
    """A failed read round, as the client sees it (the catalogue's retry class)."""
    code = ErrorCode.LEADERSHIP_LOST
    return ReplicationRefusedError(code, code.default_retry, message=f"{code.wire}: {text}")


@dataclass(slots=True)
class _Shard:
    driver: ReplicaDriver
    running: asyncio.Task[None] | None = None
    queued: asyncio.Future[None] | None = None


class ReadRounds:
    """This broker's read rounds (leader side, `confirm`) and its answers to other
    leaders' rounds (replica side, `handle`, a peer handler)."""

    def __init__(
        self,
        dialer: PeerDialer,
        address_of: Callable[[str], str | None],
        service: ReplicationService,
        *,
        timeout_ms: int,
        active: Callable[[], bool],
        blocked: Blocked | None = None,
    ) -> None:
        if timeout_ms <= 0:
            raise ValueError("a read round's timeout must be positive")
        self._dialer = dialer
        self._address_of = address_of
        self._service = service
        self._timeout = timeout_ms / 1000
        self._active = active
        self._blocked = blocked
        self._shards: dict[ShardId, _Shard] = {}
        self.rounds = 0  # rounds run (shared by every read that joined one)
        self.failed = 0

    @property
    def active(self) -> bool:
        """Whether reads are confirmed by rounds now (FELIX_QUORUM_READS=majority and
        lease_free_reads enabled); otherwise the lease alone confirms them."""
        return self._active()

    # -- the leader's side

    async def confirm(self, driver: ReplicaDriver) -> None:
        """Returns once a round that started after this call confirmed `driver`'s
        leadership; raises ReplicationRefusedError (leadership_lost) when it failed."""
        state = self._shards.get(driver.shard)
        if state is None:
            state = self._shards[driver.shard] = _Shard(driver)
        state.driver = driver
        future = state.queued
        if future is None:
            future = state.queued = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            if state.running is None:
                self._start(state)
        # Shielded: one reader going away does not cancel the round others share.
        await asyncio.shield(future)

    def _start(self, state: _Shard) -> None:
        future, state.queued = state.queued, None
        assert future is not None
        state.running = asyncio.get_running_loop().create_task(self._run(state, future))

    async def _run(self, state: _Shard, future: asyncio.Future[None]) -> None:
        try:
            await self._round(state.driver)
        except ReplicationRefusedError as exc:
            self.failed += 1
            if not future.done():
                future.set_exception(exc)
        except Exception as exc:  # never leave a reader unanswered
            _log.exception("%s: read round failed", state.driver.shard)
            self.failed += 1
            if not future.done():
                future.set_exception(leadership_lost(f"the read round failed: {exc}"))
        else:
            if not future.done():
                future.set_result(None)
        finally:
            state.running = None
            if state.queued is not None:
                self._start(state)
            else:
                self._shards.pop(state.driver.shard, None)

    async def _round(self, driver: ReplicaDriver) -> None:
        replica = driver.replica
        generation = replica.generation
        if replica.phase is not Phase.LEADER:
            raise leadership_lost(f"this broker no longer leads {driver.shard}")
        self.rounds += 1
        needed = replica.majority - 1  # the leader's own vote counts
        ask = ReplicaReadRound(
            shard=wire_shard(driver.shard), generation=generation, leader=replica.node_id
        )
        asks = [asyncio.create_task(self._ask(peer, ask)) for peer in replica.followers]
        confirmed = 0
        pending: set[asyncio.Task[ReplicaReadAnswer | None]] = set(asks)
        try:
            async with asyncio.timeout(self._timeout):
                while confirmed < needed and pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        answer = task.result()
                        if answer is None or not answer.held:
                            continue
                        if answer.generation > generation:
                            raise leadership_lost(
                                f"a replica of {driver.shard} holds generation "
                                f"{answer.generation}, newer than this leader's {generation}"
                            )
                        if answer.confirmed:
                            confirmed += 1
        except TimeoutError:
            raise leadership_lost(
                f"no majority of {driver.shard}'s replicas confirmed this leader within "
                f"{self._timeout:g}s"
            ) from None
        finally:
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        if confirmed < needed:
            raise leadership_lost(
                f"no majority of {driver.shard}'s replicas confirmed this leader "
                f"({confirmed + 1} of {len(replica.replicas)})"
            )
        if replica.phase is not Phase.LEADER or replica.generation != generation:
            raise leadership_lost(f"this broker stopped leading {driver.shard} during the read")

    async def _ask(self, peer: str, ask: ReplicaReadRound) -> ReplicaReadAnswer | None:
        """One follower's answer, or None (no vote: unreachable, cut off, odd answer)."""
        if self._blocked is not None and self._blocked(peer):
            return None
        address = self._address_of(peer)
        if address is None:
            return None
        try:
            answer = await self._dialer.request(peer, address, ask)
        except (PeerUnavailableError, PeerProtocolError) as exc:
            _log.debug("read round: %s gave no answer: %s", peer, exc)
            return None
        return answer if type(answer) is ReplicaReadAnswer else None

    # -- the replica's side

    async def handle(self, message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        """A leader's round (the peer table's handler for `replica_read_round`): this
        replica's ballot, and whether it confirms the leader."""
        assert isinstance(message, ReplicaReadRound)
        if message.leader != origin.node_id:
            _log.warning("read round from %s names %s: no vote", origin.node_id, message.leader)
            return ReplicaReadAnswer(held=False)
        if self._blocked is not None and self._blocked(origin.node_id):
            return ReplicaReadAnswer(held=False)  # lost on a partitioned link (test fault)
        s = message.shard
        shard = ShardId(ShardKind(s.kind.value), s.tenant, s.namespace, s.name, s.shard)
        driver = self._service.drivers.get(shard)
        if driver is None:
            return ReplicaReadAnswer(held=False)
        replica = driver.replica
        confirmed = replica.generation < message.generation or (
            replica.generation == message.generation and replica.leader in (None, message.leader)
        )
        return ReplicaReadAnswer(held=True, generation=replica.generation, confirmed=confirmed)


def _retrieve(future: asyncio.Future[None]) -> None:
    """Marks a shared round's failure as seen when every reader of it went away."""
    if not future.cancelled():
        future.exception()
