"""A fleet member's replicas: which shards it replicates, and their publishes.

`ReplicationManager` follows the broker's routing view. For every stream shard
whose stream is durable with `consistency: Quorum` and a replication factor
above 1, and whose assignment lists this broker among its replicas, it keeps a
`ReplicaDriver` (replication log under ``{data_dir}/replication/...``, committed
batches applied to the engine's shard). When the assignment names this broker
leader, active, at a generation newer than the replica's ballot, it promotes the
replica at that generation (the core fences a majority and opens only if no
replica is ahead: `PromotionRefused` keeps the shard unavailable). The view's
fence (the broker's lease lapsed) is the core's `lease_expired`.

`publish` is the engine's hook: a batch for a replicated shard becomes one
`ReplicatedBatch` (the leader's append time, stored publisher) appended through
the core, answered with its stream offset once a majority holds it and it is
applied, or failed with `ReplicationRefusedError` (quorum_timeout past
FELIX_PUBLISH_QUORUM_TIMEOUT_MS, not_leader, fenced, leadership_lost).

A refused promotion is reported (`report`, normally the broker's etcd node: a
`PromotionRefusal` under ``P/progress/{node_id}/refused/...`` on its own lease)
so the placer promotes a replica it names as ahead; the report is withdrawn
once this replica holds a newer generation (a leader promoted it or it opened).
Reports run one at a time in the background; a failed one is logged and made
again a second later (and the standing one is checked as often, to withdraw it).

Guarded writes (`publish_if`, `commit` with or without `expected_offset`; decision
`quorum-guarded-writes`) ride the same path: the batch carries its condition and
commit mark, every replica checks the condition where the batch falls in the log
(apply.py), and the answer is the batch's offset once a majority holds it and it
is applied here, or `AppendRefusedError` (offset_mismatch with the tail checked:
nothing written on any replica). Idempotent batches (decision
`quorum-idempotent-producers`) carry their producer mark; every replica judges them
against its producer table where they fall in the log (apply.py), so the table is
replicated with the log and a promoted leader answers a resend of a batch its
predecessor acknowledged as a duplicate (the original offset). The answer is the
verdict once a majority holds the entry and it is applied here: the offset
(appended or duplicate), or `AppendRefusedError` with the producer table's refusal
(sequence_gap, unknown_producer, ...: nothing written on any replica).

Group changes of these shards ride the same log (replication/groups.py, through
`wrap_applier`). Not yet here (reported as unfinished): Leader-consistency
replica sets (async shipping).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from felix_broker.catalog import Catalog, StreamSpec
from felix_broker.fleet.peer import PeerDialer
from felix_broker.fleet.routing import AssignmentState, Route, RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_broker.streams.engine import Engine, PublishRequest, now_micros
from felix_broker.streams.guards import (
    AppendRefusedError,
    CommitGuard,
    ConditionalGuard,
    ProducerGuard,
    TailMismatch,
)
from felix_broker.streams.producers import Duplicate, Refusal
from felix_common.catalog import Consistency
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.fleet import PromotionRefusal, ReplicatedBatch

from .apply import (
    StreamApplier,
    decode_verdict,
    encode_batch,
    encode_retention,
    replicated_commit,
)
from .core import Config, Effect, PromotionRefused
from .disk import ReplicaDisk
from .driver import Applier, ReplicaDriver, ReplicationRefusedError
from .inspect import halts
from .service import Blocked, ReplicationService, peer_sender

__all__ = ["ReplicationManager"]

_log = logging.getLogger(__name__)
# Where a replica keeps the last retention cut it applied (beside ballot.json).
_CUT_FILE = "retention-cut"

# A replica the routing view names leader that is not open (fencing, or its promotion
# was refused): nobody serves the shard, and a redirect would point back here.
_SETTLING: tuple[ErrorCode, str | None] = (ErrorCode.SHARD_UNAVAILABLE, "not_ready")


def _conditions_off() -> ReplicationRefusedError:
    """A guarded or idempotent write to a Quorum stream before the fleet finalized
    replicated_conditions (fleet/features.py; decision quorum-conditions-feature)."""
    return ReplicationRefusedError(
        ErrorCode.INVALID_REQUEST,
        RetryClass.FATAL,
        message="guarded and idempotent writes to Quorum streams are not enabled in this "
        "fleet: the control plane has not finalized replicated_conditions",
    )


_REPORT_RETRY_S = 1.0  # while a refusal report stands or failed: look again this often


async def follow_route(driver: ReplicaDriver, route: Route, me: str) -> None:
    """Bring a shard's replica in line with its route: a fenced leader's lease has
    lapsed (it stops serving), an unfenced route renews it, and an active route
    naming this broker leader at a newer generation promotes it. Shared by the
    stream shards here and the cache shards (replication/cache.py)."""
    fenced = route.state is AssignmentState.UNAVAILABLE and route.reason == "fenced"
    if fenced and route.leader == me and not driver.replica.lease_lapsed:
        await driver.lease_expired()
    elif not fenced and driver.replica.lease_lapsed:
        await driver.lease_renewed()
    if (
        route.leader == me
        and route.state is AssignmentState.ACTIVE
        and route.generation > driver.replica.generation
    ):
        await driver.promote(route.generation)


class ReplicationManager:
    def __init__(
        self,
        view: FleetView,
        catalog: Callable[[], Catalog],
        engine: Callable[[], Engine],
        dialer: PeerDialer,
        root: Path,
        config: Config,
        blocked: Blocked | None = None,
        report: Callable[[ShardId, PromotionRefusal | None], Awaitable[None]] | None = None,
    ) -> None:
        """`blocked`: a test-mode partition of replication (see `service`)."""
        self._view = view
        self._catalog = catalog
        self._engine = engine
        self._dialer = dialer
        self._root = root
        self._config = config
        self._blocked = blocked
        self.service = ReplicationService(blocked)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._writes: set[asyncio.Task[None]] = set()
        self._report = report
        self._reported: dict[ShardId, int] = {}  # refusals standing in etcd (generation)
        self._unreported: dict[ShardId, PromotionRefused] = {}
        # The applier of a shard around its StreamApplier (replication/groups.py: group
        # changes riding the stream's log); None: the StreamApplier alone.
        self.wrap_applier: Callable[[StreamApplier], Applier] | None = None
        # Whether the fleet enabled replicated_conditions (set by the broker); until
        # then guarded and idempotent writes are refused (`publish`).
        self.conditions_enabled: Callable[[], bool] = lambda: False
        # Each stream shard's StreamApplier, for the leader's retention cuts.
        self._streams: dict[ShardId, StreamApplier] = {}
        self._cuts: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self._view.snapshot.node_id

    def start(self) -> None:
        self._view.add_listener(lambda _old, _new: self._wake.set())
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._follow(), name="replication")
        self._cuts = loop.create_task(self._propose_cuts(), name="replication-cuts")
        self._wake.set()

    async def close(self) -> None:
        for task in (self._task, self._cuts):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._cuts = None
        for shard in list(self.service.drivers):
            driver = self.service.remove(shard)
            if driver is not None:
                await driver.close()

    def driver(self, shard: ShardId) -> ReplicaDriver | None:
        return self.service.drivers.get(shard)

    def stream_applier(self, shard: ShardId) -> StreamApplier | None:
        """The StreamApplier of a stream shard replicated here (its retention cut)."""
        return self._streams.get(shard)

    def halted(self) -> list[Any]:
        """`/replication/halted`: this broker's halted replicas (`[]` when healthy)."""
        return halts(self.node_id, list(self.service.drivers.values()))

    def read_refusal(self, spec: StreamSpec, index: int) -> tuple[ErrorCode, str | None] | None:
        """The engine's read gate: readers of a replicated shard are served only by its
        open leader (a just-promoted one is settling: not_ready until its mark)."""
        shard = ShardId(ShardKind.STREAM, spec.tenant_id, spec.namespace, spec.name, index)
        driver = self.driver(shard)
        refused = (ErrorCode.NOT_LEADER, None) if driver is None else driver.refusal()
        if refused is not None and refused[0] is ErrorCode.NOT_LEADER and self._named_leader(shard):
            return _SETTLING  # the view says we lead: still fencing, or promotion refused
        return refused

    def _named_leader(self, shard: ShardId) -> bool:
        snapshot = self._view.snapshot
        route = snapshot.route(shard)
        return route is not None and route.leader == snapshot.node_id

    def publish(self, request: PublishRequest) -> asyncio.Future[int] | None:
        """The engine's hook: None when the shard is not replicated (the engine
        publishes as usual); otherwise the future of the batch's stream offset."""
        spec = request.shard.spec
        if not spec.replicated:
            return None
        shard = ShardId(
            ShardKind.STREAM, spec.tenant_id, spec.namespace, spec.name, request.shard.index
        )
        done: asyncio.Future[int] = request.done
        driver = self.driver(shard)
        if driver is None:  # not a replica here: the routing view says who is
            done.set_exception(ReplicationRefusedError(ErrorCode.NOT_LEADER, RetryClass.REDIRECT))
            return done
        guard = request.guard
        guarded: ConditionalGuard | CommitGuard | None = None
        producer: ProducerGuard | None = None
        if isinstance(guard, ConditionalGuard | CommitGuard):
            guarded = guard
        elif isinstance(guard, ProducerGuard):
            producer = guard
        elif guard is not None:
            raise TypeError(f"no replicated form for guard {type(guard).__name__}")
        if guard is not None and not self.conditions_enabled():
            done.set_exception(_conditions_off())
            return done
        expected = guarded.expected_offset if guarded is not None else None
        batch = ReplicatedBatch(
            timestamp_us=now_micros(),
            publisher=request.publisher if self._engine().record_publishers else None,
            payloads=list(request.payloads),
            producer_id=producer.producer_id if producer is not None else None,
            sequence=producer.sequence if producer is not None else None,
            digest=producer.digest if producer is not None else None,
            expected_offset=expected,
            commit=replicated_commit(guarded.commit) if isinstance(guarded, CommitGuard) else None,
        )

        async def write() -> None:
            try:
                written = await driver.append([encode_batch(batch)])
            except ReplicationRefusedError as exc:
                if exc.code is ErrorCode.NOT_LEADER and self._named_leader(shard):
                    # Named leader but not open yet: nothing written, retry here soon.
                    exc = ReplicationRefusedError(
                        ErrorCode.SHARD_UNAVAILABLE, RetryClass.RETRY, _SETTLING[1]
                    )
                if not done.done():
                    done.set_exception(exc)
                return
            if done.done():
                return
            assert written.stream_offset is not None
            if producer is not None:
                verdict = decode_verdict(
                    written.stream_offset, reused_refusal=producer.reused_refusal
                )
                producer.admission = verdict  # what the metrics count (duplicates)
                if isinstance(verdict, Refusal):  # judged so on every replica: nothing written
                    done.set_exception(AppendRefusedError(verdict))
                elif isinstance(verdict, Duplicate):  # the original's offset
                    done.set_result(verdict.offset)
                else:
                    done.set_result(written.stream_offset)
                return
            if expected is not None and written.stream_offset != expected:
                # Refused at its place in the log, on every replica: nothing written.
                done.set_exception(AppendRefusedError(TailMismatch(written.stream_offset)))
                return
            done.set_result(written.stream_offset)

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return done

    # -- retention cuts (replication/apply.py; decision quorum-retention-cut)

    async def _propose_cuts(self) -> None:
        """Every retention interval of the store, the leaders' retention cuts."""
        while True:
            store = self._engine().store
            await asyncio.sleep(store.retention_interval if store is not None else 30.0)
            try:
                await self.propose_cuts(now_micros())
            except Exception:
                _log.exception("replication: proposing retention cuts failed")

    async def propose_cuts(self, now_us: int) -> int:
        """Append a retention cut to each shard led and served here whose retention
        would move its stream log's start past the last cut; returns how many were
        acknowledged (a refused one is proposed again next time)."""
        done = 0
        for shard, stream in list(self._streams.items()):
            driver = self.driver(shard)
            if driver is None or driver.refusal() is not None or not self._named_leader(shard):
                continue
            cut = stream.proposed_cut(now_us)
            if cut is None:
                continue
            try:
                await driver.append([encode_retention(cut)])
            except ReplicationRefusedError as exc:
                _log.debug("replication: %s: retention cut %d not written: %s", shard, cut, exc)
                continue
            done += 1
        return done

    # -- following the view

    async def _follow(self) -> None:
        while True:
            if self._reported or self._unreported:  # look again soon: retry, withdraw
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_REPORT_RETRY_S):
                        await self._wake.wait()
            else:
                await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile(self._view.snapshot)
            except Exception:
                _log.exception("replication: reconciling with the routing view failed")

    async def _reconcile(self, snapshot: RoutingSnapshot) -> None:
        me = snapshot.node_id
        catalog = self._catalog()
        wanted: set[ShardId] = set()
        for shard, route in snapshot.routes.items():
            if shard.kind is not ShardKind.STREAM or me not in route.replicas:
                continue
            spec = catalog.stream(shard.tenant, shard.namespace, shard.name)
            if spec is None or not spec.replicated:
                continue
            wanted.add(shard)
            driver = self.driver(shard) or self._open(shard, spec, route.replicas)
            await follow_route(driver, route, me)
        await self._report_refusals()
        streams = {shard for shard in self.service.drivers if shard.kind is ShardKind.STREAM}
        for shard in streams - wanted:  # cache shards' drivers are replication/cache.py's
            gone = self.service.remove(shard)
            self._streams.pop(shard, None)
            if gone is not None:
                await gone.close()

    def on_event(self, shard: ShardId, effect: Effect) -> None:
        """A driver's event for the fleet (a refused promotion is reported to etcd);
        also the cache shards' drivers' (replication/cache.py)."""
        self._on_event(shard, effect)

    def _on_event(self, shard: ShardId, effect: Effect) -> None:
        if isinstance(effect, PromotionRefused) and self._report is not None:
            self._unreported[shard] = effect
            self._wake.set()  # reported by the follow task, one at a time

    async def _report_refusals(self) -> None:
        """Report refusals not yet in etcd; withdraw those the replica moved past."""
        if self._report is None:
            return
        for shard, effect in list(self._unreported.items()):
            try:
                record = PromotionRefusal(generation=effect.generation, ahead=list(effect.ahead))
                await self._report(shard, record)
            except Exception as exc:
                _log.warning("replication: %s: refusal not reported: %s", shard, exc)
                continue
            self._unreported.pop(shard, None)
            self._reported[shard] = effect.generation
        for shard, generation in list(self._reported.items()):
            driver = self.driver(shard)
            if driver is not None and driver.replica.generation <= generation:
                continue
            try:
                await self._report(shard, None)
            except Exception as exc:
                _log.warning("replication: %s: refusal not withdrawn: %s", shard, exc)
                continue
            del self._reported[shard]

    def _open(self, shard: ShardId, spec: StreamSpec, replicas: tuple[str, ...]) -> ReplicaDriver:
        folder = self._root / shard.tenant / shard.namespace / shard.name / str(shard.shard)
        members = self._view.snapshot.members

        def address_of(node: str) -> str | None:
            member = self._view.snapshot.members.get(node) or members.get(node)
            return member.peer_addr if member is not None else None

        engine = self._engine()
        stream = StreamApplier(
            engine.shard(spec, shard.shard),
            cut_file=folder / _CUT_FILE,
            retention=engine.retention_for(spec),
        )
        self._streams[shard] = stream
        applier = stream if self.wrap_applier is None else self.wrap_applier(stream)
        driver = ReplicaDriver.open(
            shard,
            self.node_id,
            replicas,
            ReplicaDisk(folder),
            peer_sender(self._dialer, address_of, self._blocked),
            config=dataclasses.replace(
                self._config, leader_acks=spec.consistency is Consistency.LEADER
            ),
            applier=applier,
            on_event=self._on_event,
        )
        self.service.add(driver)
        driver.start()
        return driver
