"""Durable storage benchmark: the shard log against raw os.write/os.fsync, in one run.

Run: ``.venv/bin/python bench/durable.py [--quick] [--seconds S] [--rounds N] [--dir PATH]``.

For each fsync mode (none, periodic, on_commit), payload size (100 B, 4 KiB)
and batch size (1, 16, 64 records), one writer appends for ``--seconds`` and
the script prints records/s and payload MB/s beside a raw baseline on the
same disk: sequential ``os.write`` of the same payload bytes with the same
batching, and

- ``none``: no fsync;
- ``periodic``: one fsync every 100 ms (the log's default interval);
- ``on_commit``: one fsync per batch, which the log answers with
  ``await wait_durable`` per batch (one writer, so no group commit to share).

Each row alternates log and raw ``--rounds`` times, each slice starting
after an ``os.sync()`` so that neither side pays for the other's dirty pages,
and prints the medians (the ratio is the median of the per-round ratios):
on a shared VM one pair of runs can differ by 2x on the disk's mood alone.

After the table it prints every mode's MB/s against that one durable
baseline, sequential write + fsync per batch: what each mode's weaker
promise buys.

For ``on_commit`` it also prints p50/p99 append-to-durable latency against the
raw write+fsync latency, and one extra line with 16 concurrent writers of
single records, where group commit lets one fsync cover many appends (the
raw baseline stays one write+fsync per record). Ratios, not absolute figures,
are what to compare across machines. A full run takes about 70 s,
``--quick`` about 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felix_broker.storage import FsyncMode, Log, LogConfig

SIZES = (100, 4096)
BATCHES = (1, 16, 64)
PERIOD = 0.1
CONCURRENT_WRITERS = 16


@dataclass
class Result:
    """What one timed loop achieved."""

    records: int
    payload_bytes: int
    seconds: float
    latencies: list[float]

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    def percentile(self, q: int) -> float:
        """Latency percentile in microseconds."""
        return statistics.quantiles(self.latencies, n=100)[q - 1] * 1e6


# --- the log --------------------------------------------------------------------------


async def bench_log(folder: Path, mode: FsyncMode, size: int, batch: int, seconds: float) -> Result:
    payloads = [bytes([i % 256]) * size for i in range(batch)]
    log = Log.open(folder, LogConfig(fsync_mode=mode, fsync_interval=PERIOD))
    syncer = asyncio.ensure_future(periodic_sync(log)) if mode is FsyncMode.PERIODIC else None
    latencies: list[float] = []
    records = 0
    start = last_yield = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        before = now
        base = log.append(payloads, timestamp_us=time.time_ns() // 1000)
        if mode is FsyncMode.ON_COMMIT:
            await log.wait_durable(base + batch - 1)
        records += batch
        now = time.perf_counter()
        latencies.append(now - before)
        if now - last_yield > 0.001:
            await asyncio.sleep(0)  # let the periodic sync task run, as in the broker
            last_yield = now
    elapsed = time.perf_counter() - start
    if syncer is not None:
        syncer.cancel()
    await log.aclose()
    return Result(records, records * size, elapsed, latencies)


async def periodic_sync(log: Log) -> None:
    """What LogStore's fsync task does for one log."""
    while True:
        await asyncio.sleep(PERIOD)
        if log.needs_sync:
            await log.sync()


async def bench_log_concurrent(folder: Path, size: int, seconds: float) -> Result:
    log = Log.open(folder, LogConfig(fsync_mode=FsyncMode.ON_COMMIT))
    payload = [b"c" * size]
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def writer() -> None:
        while time.perf_counter() < deadline:
            before = time.perf_counter()
            await log.wait_durable(log.append(payload, timestamp_us=time.time_ns() // 1000))
            latencies.append(time.perf_counter() - before)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(CONCURRENT_WRITERS)))
    elapsed = time.perf_counter() - start
    await log.aclose()
    return Result(len(latencies), len(latencies) * size, elapsed, latencies)


# --- the raw baseline -----------------------------------------------------------------


def bench_raw(path: Path, mode: FsyncMode, size: int, batch: int, seconds: float) -> Result:
    data = b"".join(bytes([i % 256]) * size for i in range(batch))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    latencies: list[float] = []
    records = 0
    start = last_sync = time.perf_counter()
    deadline = start + seconds
    now = start
    try:
        while now < deadline:
            before = now
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is FsyncMode.ON_COMMIT:
                os.fsync(fd)
            records += batch
            now = time.perf_counter()
            latencies.append(now - before)
            if mode is FsyncMode.PERIODIC and now - last_sync >= PERIOD:
                os.fsync(fd)
                last_sync = now
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return Result(records, records * size, elapsed, latencies)


def bench_raw_concurrent(path: Path, size: int, seconds: float) -> Result:
    # One writer doing what each of the log's writers asks for: write + fsync per record.
    return bench_raw(path, FsyncMode.ON_COMMIT, size, 1, seconds)


# --- driver ---------------------------------------------------------------------------


async def in_fresh_folder(root: Path, run: Callable[[Path], Awaitable[Result]]) -> Result:
    folder = Path(tempfile.mkdtemp(dir=root))
    try:
        return await run(folder)
    finally:
        shutil.rmtree(folder)


def raw_in_fresh_folder(root: Path, run: Callable[[Path], Result]) -> Result:
    folder = Path(tempfile.mkdtemp(dir=root))
    try:
        return run(folder / "raw.bin")
    finally:
        shutil.rmtree(folder)


@dataclass
class Row:
    """The rounds of one row: each a log result and the raw result measured next to it."""

    ours: list[Result]
    raw: list[Result]

    def ratio(self) -> float:
        pairs = zip(self.ours, self.raw, strict=True)
        return statistics.median(o.mb_per_s / r.mb_per_s for o, r in pairs)


def median_result(results: list[Result]) -> Result:
    """The round with the median throughput, carrying every round's latencies."""
    middle = sorted(results, key=lambda r: r.mb_per_s)[len(results) // 2]
    latencies = [latency for result in results for latency in result.latencies]
    return Result(middle.records, middle.payload_bytes, middle.seconds, latencies)


async def measure(
    root: Path,
    rounds: int,
    ours: Callable[[Path], Awaitable[Result]],
    raw: Callable[[Path], Result],
) -> Row:
    row = Row([], [])
    for _ in range(rounds):
        os.sync()
        row.ours.append(await in_fresh_folder(root, ours))
        os.sync()
        row.raw.append(raw_in_fresh_folder(root, raw))
    return row


def line(label: str, row: Row, latency: bool) -> str:
    ours, raw = median_result(row.ours), median_result(row.raw)
    text = (
        f"{label:<28} {ours.records_per_s:>11,.0f} {ours.mb_per_s:>8.1f}"
        f" {raw.records_per_s:>11,.0f} {raw.mb_per_s:>8.1f} {row.ratio():>6.0%}"
    )
    if latency:
        text += (
            f"   {ours.percentile(50):>7.0f} {ours.percentile(99):>7.0f}"
            f" {raw.percentile(50):>7.0f} {raw.percentile(99):>7.0f}"
        )
    return text


def durability_table(rows: dict[tuple[FsyncMode, int, int], Row]) -> str:
    """Every mode against one baseline, raw write + fsync per batch: what weaker promises buy."""
    lines = [
        "",
        "log MB/s against raw write + fsync per batch (the on_commit rows' baseline):",
        f"{'size x batch':<28} " + " ".join(f"{mode.value:>10}" for mode in FsyncMode),
    ]
    for size in SIZES:
        for batch in BATCHES:
            durable_raw = median_result(rows[FsyncMode.ON_COMMIT, size, batch].raw).mb_per_s
            ratios = (
                median_result(rows[mode, size, batch].ours).mb_per_s / durable_raw
                for mode in FsyncMode
            )
            lines.append(f"{f'{size} B x {batch}':<28} " + " ".join(f"{r:>9.2f}x" for r in ratios))
    lines.append("")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    seconds = args.seconds if args.seconds else (0.1 if args.quick else 0.3)
    rounds = args.rounds if args.rounds else (3 if args.quick else 5)
    root = Path(tempfile.mkdtemp(prefix="felix-durable-bench-", dir=args.dir))
    print(f"folder {root}, {rounds} rounds of {seconds:.2f} s per side and row")
    print(
        f"{'mode size x batch':<28} {'log rec/s':>11} {'MB/s':>8} {'raw rec/s':>11} {'MB/s':>8}"
        f" {'ratio':>6}   {'p50 µs':>7} {'p99 µs':>7} {'raw p50':>7} {'raw p99':>7}"
    )
    rows: dict[tuple[FsyncMode, int, int], Row] = {}
    try:
        for mode in FsyncMode:
            for size in SIZES:
                for batch in BATCHES:

                    async def ours(folder: Path) -> Result:
                        return await bench_log(folder, mode, size, batch, seconds)  # noqa: B023

                    def raw(path: Path) -> Result:
                        return bench_raw(path, mode, size, batch, seconds)  # noqa: B023

                    row = await measure(root, rounds, ours, raw)
                    rows[mode, size, batch] = row
                    label = f"{mode.value} {size} B x {batch}"
                    print(line(label, row, mode is FsyncMode.ON_COMMIT), flush=True)
        print(durability_table(rows))
        for size in SIZES:

            async def concurrent(folder: Path) -> Result:
                return await bench_log_concurrent(folder, size, seconds)  # noqa: B023

            def raw_single(path: Path) -> Result:
                return bench_raw_concurrent(path, size, seconds)  # noqa: B023

            row = await measure(root, rounds, concurrent, raw_single)
            label = f"on_commit {size} B, {CONCURRENT_WRITERS} writers"
            print(line(label, row, True), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short measurements (~15 s in all)")
    parser.add_argument("--seconds", type=float, help="seconds per side and round")
    parser.add_argument("--rounds", type=int, help="log/raw pairs per row (default 5)")
    parser.add_argument("--dir", type=Path, help="where to write (default: the temp folder)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
