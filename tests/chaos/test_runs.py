"""Short chaos runs against a real 3-broker fleet (separate processes, real etcd):
the checker's verdict on the recorded history must be clean, every shard must come
back after every fault, and a deliberately broken fleet must be caught.

Each run's folder (history, faults, verdict) is kept under pytest's tmp_path; the
long run is `make chaos`. FELIX_CHAOS_TEST_SECONDS changes a short run's length.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chaos.fleet import Layout
from chaos.nemesis import FaultKind
from chaos.run import RunConfig, run
from felix_broker.chaos.checker import Rule, check
from felix_broker.chaos.history import Kind, Outcome, load

SECONDS = float(os.environ.get("FELIX_CHAOS_TEST_SECONDS", "30"))


# The third run draws only broker-to-broker partitions (one way and both ways) and
# clock jumps, so every run of the suite shows them; the first two draw every kind.
NETWORK_AND_CLOCK = (FaultKind.PARTITION, FaultKind.CLOCK)


@pytest.mark.timeout(SECONDS + 150)
@pytest.mark.parametrize(
    ("seed", "faults"), [(11, tuple(FaultKind)), (12, tuple(FaultKind)), (20, NETWORK_AND_CLOCK)]
)
async def test_a_short_chaos_run_keeps_every_rule(
    tmp_path: Path, seed: int, faults: tuple[FaultKind, ...]
) -> None:
    # The first run spares the Quorum log's leader kills, pauses and failed fsyncs (no
    # failover round: a short bounded run); the second may fail it over
    # (`chaos.nemesis.Nemesis._failover`); test_broken_quorum.py kills it on purpose.
    config = RunConfig(
        out=tmp_path, seconds=SECONDS, seed=seed, faults=faults, spare_quorum_leader=seed == 11
    )
    result = await run(config)
    summary = json.loads((tmp_path / "verdict.json").read_text())
    assert result.ok, json.dumps(summary, indent=2)
    assert summary["faults"] >= 3, summary["fault_counts"]
    history = load(tmp_path / "history.jsonl")
    acked = [op for op in history if op.kind is Kind.APPEND and op.outcome is Outcome.OK]
    assert len(acked) >= 100 and summary["delivered"] > 0
    # Every kind of client of the Quorum log got acknowledgements: idempotent
    # batches, conditional writes, the consumer group's polls and acks.
    counts = summary["workload_counts"]
    assert counts.get("idempotent chaos-quorum acknowledged", 0) > 0, counts
    assert counts.get("conditional acknowledged", 0) > 0, counts
    assert counts.get("group_delivered", 0) > 0, counts
    assert summary["operation_counts"].get("group_ack.ok", 0) > 0, summary["operation_counts"]
    [cursor] = [op for op in history if op.kind is Kind.GROUP_CURSOR]
    assert cursor.offset is not None and cursor.offset > 0, cursor
    assert check(history).ok  # the folder alone is enough to judge the run again
    assert len((tmp_path / "faults.jsonl").read_text().splitlines()) == summary["faults"]
    finals = [op for op in history if op.kind is Kind.FINAL and op.values]
    assert finals and all(len(op.times) == len(op.values) for op in finals)
    if faults == NETWORK_AND_CLOCK:
        events = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
        assert {e["kind"] for e in events} == {"partition", "clock"}, events


@pytest.mark.timeout(180)
async def test_a_fleet_that_loses_its_disk_on_restart_is_caught(tmp_path: Path) -> None:
    """A broker that comes back from kill -9 with an empty durable folder, yet serves
    its shards, loses acknowledged writes: the verdict names them."""
    config = RunConfig(
        out=tmp_path,
        seconds=25,
        seed=3,
        layout=Layout(lose_disk_on_restart=True),
        faults=(FaultKind.KILL,),
        roles=("owner",),
    )
    result = await run(config)
    assert not result.ok
    assert Rule.LOST_WRITE in result.verdict.rules(), result.verdict.summary()[:2000]
    summary = json.loads((tmp_path / "verdict.json").read_text())
    assert summary["violations"]["counts"]["lost_write"] > 0
