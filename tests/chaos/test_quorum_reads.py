"""Readers of a Quorum shard under steady writes, on a real 3-broker fleet: once a
read is served, the leader keeps serving reads and group polls of its generation
(it used to refuse about one in five `not_ready` whenever its stream log trailed
the moving quorum mark, though it had acknowledged nothing beyond its log)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from chaos.fleet import ChaosFleet, Layout
from chaos.workload import Recorder, Workers, Workload
from felix_client.errors import BrokerError

STREAM = "chaos-quorum"


@pytest.mark.timeout(120)
async def test_reads_of_a_quorum_shard_under_steady_writes_are_served(tmp_path: Path) -> None:
    fleet = await ChaosFleet.start(tmp_path, Layout(log_shards=1))
    try:
        workload = Workload(fleet, Recorder(), random.Random(1), Workers())
        writer, reader = await workload._client(1), await workload._client(2)
        stop = asyncio.Event()

        written = 0

        async def write() -> None:
            nonlocal written
            while not stop.is_set():
                await writer.publish(STREAM, b"w%d" % written)
                written += 1

        writing = asyncio.create_task(write())
        group = reader.group(STREAM, "g")
        outcomes: Counter[str] = Counter()
        served = False
        # At least 120 reads, and on until more than 50 writes raced them (however slow
        # the machine); bounded in count.
        for n in range(3000):
            if outcomes["served"] >= 120 and written > 50:
                break
            try:
                if n % 2:
                    await group.poll(0, max_records=5, timeout=5.0)
                else:
                    async for _ in reader.stream_read(STREAM, start=0, shard=0, max_records=5):
                        break
                outcomes["served"] += 1
                served = True
            except BrokerError as exc:
                if served:  # before the first: the fleet may still be settling
                    outcomes[f"{exc.code_name}/{exc.detail.get('reason')}"] += 1
            await asyncio.sleep(0.005)
        stop.set()
        await writing
        await writer.aclose()
        await reader.aclose()
        assert written > 50, written  # the reads raced real writes
        assert outcomes["served"] >= 120, outcomes
        assert outcomes == Counter(served=outcomes["served"]), outcomes  # none refused
    finally:
        await fleet.close()
