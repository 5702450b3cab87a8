"""A deliberately broken Quorum broker on a real 3-broker fleet, caught by the checker.

The scenario is the same for both fleets: acknowledged writes to the Quorum
stream's leader, both followers SIGSTOPped, more writes sent to the leader, the
leader killed (-9) while the followers are still stopped, the followers continued;
once a follower is promoted and serves, the old leader restarts, and a fresh client
reads the whole log. A correct fleet acknowledges nothing the followers lack (those
writes end unknown), so every rule holds; a fleet running with
``FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY`` (test mode only) acknowledged writes only
its leader's disk held, and the verdict names them lost.
"""

from __future__ import annotations

import asyncio
import random
import signal
from functools import partial
from pathlib import Path

import pytest

from chaos.fleet import ChaosFleet, Layout
from chaos.workload import Recorder, Workers, Workload, final_logs, log_key
from felix_broker.chaos.checker import Rule, Verdict, check
from felix_broker.chaos.history import Kind, Operation, Outcome
from felix_broker.replication.core import Config
from felix_client import Client
from felix_client.errors import BrokerError, ClientError

STREAM = "chaos-quorum"
_OUTCOMES = (BrokerError, ClientError, TimeoutError, OSError)


async def _publish(rec: Recorder, client: Client, value: str) -> None:
    def make(
        outcome: Outcome,
        invoke: float,
        complete: float | None,
        offset: int | None,
        exc: BaseException | None,
    ) -> Operation:
        return Operation(
            client="w",
            kind=Kind.APPEND,
            key=log_key(STREAM, 0),
            value=value,
            offset=offset,
            invoke=invoke,
            complete=complete,
            outcome=outcome,
            retry=exc.retry.wire if isinstance(exc, BrokerError) else None,
        )

    await rec.call(partial(client.publish, STREAM, value.encode()), make)


async def _leader(client: Client) -> str | None:
    try:
        async with asyncio.timeout(5.0):
            owners = await client.shard_owners(STREAM)
    except _OUTCOMES:
        return None
    return next((o.addr for o in owners if o.shard == 0 and o.addr), None)


async def _scenario(folder: Path, *, broken: bool) -> Verdict:
    layout = Layout(log_shards=1, quorum_ack_before_majority=broken)
    fleet = await ChaosFleet.start(folder, layout)
    try:
        rec = Recorder()
        workload = Workload(fleet, rec, random.Random(1), Workers())
        client = await workload._client(1)
        addr = await _leader(client)
        await client.aclose()
        assert addr is not None
        leader = fleet.by_addr(addr)
        assert leader is not None
        direct = await workload._connect([addr])
        assert direct is not None
        for n in range(5):
            await _publish(rec, direct, f"before-{n}")
        followers = [b for b in fleet.brokers if b is not leader]
        for follower in followers:
            follower.signal(signal.SIGSTOP)
        # A stopped process's socket still buffers what reaches it, and the leader ships
        # a window of ships and resends up to `ship_max_records` from the oldest
        # unanswered one: more writes than that, so some never leave the leader.
        alone = 2 * Config().ship_max_records
        sent = [asyncio.create_task(_publish(rec, direct, f"alone-{n}")) for n in range(alone)]
        await asyncio.sleep(1.0)
        await leader.kill()
        for follower in followers:
            follower.signal(signal.SIGCONT)
        await asyncio.gather(*sent)
        assert await fleet.wait_successor(STREAM, addr, 60.0), "no follower promoted"
        await leader.start()
        await fleet.wait_ready(60.0)
        await final_logs(fleet, rec)
        acked = [op for op in rec.operations if op.kind is Kind.APPEND and op.outcome is Outcome.OK]
        assert len(acked) >= 5, [op.value for op in acked]
        return check(rec.operations)
    finally:
        await fleet.close()


@pytest.mark.timeout(150)
async def test_a_correct_quorum_fleet_loses_nothing_when_its_leader_dies_alone(
    tmp_path: Path,
) -> None:
    verdict = await _scenario(tmp_path, broken=False)
    assert verdict.ok, verdict.summary()[:2000]


@pytest.mark.timeout(150)
async def test_a_fleet_acking_quorum_writes_before_the_majority_is_caught(
    tmp_path: Path,
) -> None:
    verdict = await _scenario(tmp_path, broken=True)
    assert Rule.LOST_WRITE in verdict.rules(), verdict.summary()[:2000]
