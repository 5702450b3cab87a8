"""One chaos run: fleet up, workload and nemesis for a while, heal, final logs, verdict.

`run(RunConfig)` writes into ``out``:

- ``history.jsonl``: the checked history (the log stream's shards and the cache),
  one `felix_broker.chaos.history.Operation` a line;
- ``memory-history.jsonl``: the in-memory stream's history;
- ``faults.jsonl``: every fault injected (`nemesis.FaultEvent`), on the same clock;
- ``verdict.json``: the checker's verdict, operation and fault counts, runtime,
  liveness (heal to every shard serving, per fault).

The checked history is judged by every rule of `felix_broker.chaos.checker`. The
in-memory stream keeps, through broker loss, only the rules in `MEMORY_RULES`:
its shard is re-placed empty when its broker dies, so lost writes, prefix reads,
real-time order and delivery gaps are not promised there; its other violations
are reported as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from felix_broker.chaos.checker import Rule, Verdict, check
from felix_broker.chaos.history import Kind, Operation, dump

from .fleet import ChaosFleet, Layout
from .nemesis import FaultKind, Nemesis
from .workload import Recorder, Workers, Workload, final_logs

__all__ = ["MEMORY_RULES", "RunConfig", "RunResult", "run"]

_log = logging.getLogger(__name__)

MEMORY_RULES = frozenset({Rule.PHANTOM, Rule.DUPLICATE, Rule.REFUSED_APPEARS})
_SETTLE_S = 2.0  # after the last fault's heal, before the final reads
_WORKLOAD_END_S = 30.0  # bound on the workers' last operations after the stop
_LISTED = 100  # violations listed in verdict.json per history (all are counted)


@dataclass(frozen=True)
class RunConfig:
    out: Path
    seconds: float = 60.0
    seed: int = 1
    layout: Layout = field(default_factory=Layout)
    faults: tuple[FaultKind, ...] = tuple(FaultKind)
    workers: Workers | None = None  # None: the default mix, cache keys scaled to the run
    liveness_bound: float = 45.0
    # Whom broker faults hit: the owner of a checked log shard, or another broker.
    roles: tuple[str, ...] = ("owner", "other")
    # Broker faults never hit the Quorum log's leader (no failover rounds, see
    # `Nemesis._failover`).
    spare_quorum_leader: bool = False


@dataclass
class RunResult:
    verdict: Verdict
    memory_verdict: Verdict
    liveness_failures: list[str]
    state_failures: list[str]
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        return (
            self.verdict.ok
            and self.memory_verdict.ok
            and not self.liveness_failures
            and not self.state_failures
        )


def _violations(verdict: Verdict) -> dict[str, Any]:
    return {
        "counts": dict(sorted(Counter(v.rule.value for v in verdict.violations).items())),
        "first": [
            {"rule": v.rule.value, "detail": v.detail, "operations": list(v.operations)}
            for v in verdict.violations[:_LISTED]
        ],
    }


def _counts(operations: Sequence[Operation]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for op in operations:
        counts[f"{op.kind.value}.{op.outcome.value}"] += 1
    return dict(sorted(counts.items()))


def _write_faults(out: Path, nemesis: Nemesis) -> None:
    (out / "faults.jsonl").write_bytes(
        b"".join(msgspec.json.encode(e) + b"\n" for e in nemesis.events)
    )


def commit_states(history: Sequence[Operation], states: dict[str, str | None]) -> list[str]:
    """The other half of commit atomicity: each shard's committed state must be what
    the last commit present in its final log wrote (nothing, when none is), never a
    commit whose event is missing nor one older than the log's last."""
    commits = {w.value for op in history if op.kind is Kind.COMMIT for w in op.writes}
    finals = {op.key: op.values for op in history if op.kind is Kind.FINAL}
    failures = []
    for key, state in sorted(states.items()):
        present = [v for v in finals.get(key, []) if v in commits]
        expected = present[-1] if present else None
        if state != expected:
            failures.append(f"{key}: state holds {state!r}, the log's last commit is {expected!r}")
    return failures


async def run(config: RunConfig) -> RunResult:
    began = time.monotonic()
    config.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    fleet = await ChaosFleet.start(config.out / "fleet", config.layout)
    recorder = Recorder()
    workers = config.workers or Workers(cache_keys=max(4, int(config.seconds // 10)))
    workload = Workload(fleet, recorder, random.Random(rng.getrandbits(64)), workers)
    nemesis = Nemesis(
        fleet,
        random.Random(rng.getrandbits(64)),
        kinds=config.faults,
        liveness_bound=config.liveness_bound,
        roles=config.roles,
        spare_quorum_leader=config.spare_quorum_leader,
    )
    try:
        owners = await workload._client(0)
        nemesis.owners = owners
        stop = asyncio.Event()
        clients = asyncio.create_task(workload.run(stop))
        tasks = {clients}
        if config.faults:
            tasks.add(asyncio.create_task(nemesis.run(stop)))
        done, _ = await asyncio.wait(tasks, timeout=config.seconds)
        stop.set()
        for task in tasks - {clients}:
            await task  # the round under way ends healed
        for task in done:
            task.result()  # a worker or the nemesis failed: the run is void
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_WORKLOAD_END_S):
                await asyncio.shield(clients)
        if not clients.done():
            clients.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await clients
        await fleet.heal()
        final_ready = await fleet.wait_ready(config.liveness_bound)
        await asyncio.sleep(_SETTLE_S)
        states = await final_logs(fleet, recorder)
        with contextlib.suppress(Exception):
            await owners.aclose()
    except BaseException as exc:
        # A run that cannot finish keeps what it recorded, unjudged.
        dump(recorder.operations, config.out / "history.jsonl")
        dump(recorder.memory, config.out / "memory-history.jsonl")
        _write_faults(config.out, nemesis)
        aborted = {"ok": False, "aborted": repr(exc), "operations": len(recorder.operations)}
        (config.out / "verdict.json").write_text(json.dumps(aborted, indent=2) + "\n")
        raise
    finally:
        await fleet.close()
    verdict = check(recorder.operations)
    state_failures = commit_states(recorder.operations, states)
    memory = check(recorder.memory)
    memory.violations = [v for v in memory.violations if v.rule in MEMORY_RULES]
    dump(recorder.operations, config.out / "history.jsonl")
    dump(recorder.memory, config.out / "memory-history.jsonl")
    _write_faults(config.out, nemesis)
    fault_counts = Counter(e.kind for e in nemesis.events)
    recovered = [e.recovered_s for e in nemesis.events if e.recovered_s is not None]
    summary: dict[str, Any] = {
        "ok": verdict.ok and memory.ok and not nemesis.liveness_failures and not state_failures,
        "seed": config.seed,
        "seconds": config.seconds,
        "runtime_s": round(time.monotonic() - began, 1),
        "layout": asdict(config.layout),
        "operations": len(recorder.operations),
        "operation_counts": _counts(recorder.operations),
        "memory_operations": len(recorder.memory),
        "memory_operation_counts": _counts(recorder.memory),
        "delivered": workload.counts["delivered"],
        "workload_counts": dict(sorted(workload.counts.items())),
        "faults": len(nemesis.events),
        "fault_counts": dict(sorted(fault_counts.items())),
        "recovery_s_max": round(max(recovered), 2) if recovered else None,
        "final_ready_s": round(final_ready, 2),
        "liveness_failures": nemesis.liveness_failures,
        "commit_state_failures": state_failures,
        "violations": _violations(verdict),
        "memory_violations": _violations(memory),
    }
    (config.out / "verdict.json").write_text(json.dumps(summary, indent=2) + "\n")
    return RunResult(verdict, memory, nemesis.liveness_failures, state_failures, summary)
