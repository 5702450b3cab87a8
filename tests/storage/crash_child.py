"""Child process of test_crash: appends under on_commit, prints each acknowledged batch.

    python crash_child.py <log folder> <run id>

Prints ``ready <next offset>`` once open, then one line ``<base> <count> <writer> <seq>``
per batch as soon as ``wait_durable`` returned for it, until killed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from felix_broker.storage import FsyncMode, Log, LogConfig

CONFIG = LogConfig(
    segment_bytes=16 * 1024, index_interval_bytes=512, fsync_mode=FsyncMode.ON_COMMIT
)


def payload(writer: str, seq: int, index: int) -> bytes:
    """A payload unique per (writer, seq, index), of varying length."""
    return f"{writer}/{seq}/{index};".encode() * (1 + (seq + index) % 9)


def batch_size(seq: int) -> int:
    return 1 + seq % 4


async def write(log: Log, writer: str) -> None:
    seq = 0
    while True:
        count = batch_size(seq)
        base = log.append(
            [payload(writer, seq, i) for i in range(count)],
            timestamp_us=time.time_ns() // 1000,
            publisher=writer,
        )
        await log.wait_durable(base + count - 1)
        sys.stdout.write(f"{base} {count} {writer} {seq}\n")
        sys.stdout.flush()
        seq += 1


async def main(directory: Path, run: str) -> None:
    log = Log.open(directory, CONFIG)
    print("ready", log.next_offset, flush=True)
    await asyncio.gather(*(write(log, f"{run}-{w}") for w in range(4)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
