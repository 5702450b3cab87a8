"""kill -9 a real writer process at random points; every acknowledged record must survive."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from felix_broker.storage import Log
from tests.storage.crash_child import CONFIG, payload

pytestmark = pytest.mark.timeout(120)

CHILD = Path(__file__).with_name("crash_child.py")
RUNS = 4


async def read_line(stream: asyncio.StreamReader) -> str:
    async with asyncio.timeout(20):
        line = await stream.readline()
    assert line.endswith(b"\n"), f"child ended early: {line!r}"
    return line.decode()


async def run_and_kill(directory: Path, run: int, rng: random.Random) -> tuple[int, list[str]]:
    """Start a writer, kill -9 it after a random number of acks; its ready offset and acks."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(directory),
        str(run),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        ready = await read_line(process.stdout)
        acks = [await read_line(process.stdout) for _ in range(rng.randint(1, 400))]
        await asyncio.sleep(rng.random() * 0.02)  # land the kill anywhere in a round
        process.send_signal(signal.SIGKILL)
        async with asyncio.timeout(10):
            await process.wait()
        async with asyncio.timeout(10):
            rest = await process.stdout.read()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == -signal.SIGKILL
    # A line cut by the kill was not acknowledged to the test.
    acks += [line + "\n" for line in rest.decode().split("\n")[:-1]]
    return int(ready.split()[1]), acks


async def test_acknowledged_records_survive_kill_9(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    acknowledged: dict[int, tuple[str, bytes]] = {}
    next_offset = 0
    for run in range(RUNS):
        ready_at, acks = await run_and_kill(tmp_path, run, rng)
        assert ready_at == next_offset, f"seed {seed}: offsets moved across a restart"
        for line in acks:
            base, count, writer, seq = line.split()
            for i in range(int(count)):
                acknowledged[int(base) + i] = (writer, payload(writer, int(seq), i))

        log = Log.open(tmp_path, CONFIG)
        records = log.read(0, max_records=10**7, max_bytes=1 << 40)
        next_offset = log.next_offset
        log.close()
        assert [r.offset for r in records] == list(range(next_offset)), f"seed {seed}"
        copies = Counter(r.payload for r in records)
        for offset, (writer, expected) in acknowledged.items():
            assert offset < next_offset, f"seed {seed}: acknowledged offset {offset} lost"
            assert records[offset].payload == expected, f"seed {seed}: offset {offset} changed"
            assert records[offset].publisher == writer
            assert copies[expected] == 1, f"seed {seed}: offset {offset} duplicated"
    assert len(acknowledged) >= RUNS
