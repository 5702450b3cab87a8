"""Profile the broker under one bench/peers.py workload with py-spy; print where it goes.

Run: ``.venv/bin/python bench/profile.py WORK [--n N] [--op put|get] [--seconds S]``,
e.g. ``bench/profile.py workqueue --n 32`` or ``bench/profile.py kv --op get --n 1``.

A broker is started as bench/peers.py starts it (durable storage, fsync
``periodic``), the work queue's stream is pre-filled when the workload needs
it, then ``py-spy record`` samples the broker process (or with ``--side
client`` the client's; 100 Hz, idle time left out) while a fresh client
process runs the workload. The summary lists
the functions with the most samples on top of the stack (self) and anywhere
on it (inclusive), as shares of the non-idle samples; ``--out`` keeps the
collapsed stacks for a flame graph. py-spy comes with the bench extra.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peers


def _frame(text: str) -> str:
    """'func (path/file.py:12)' as 'func file.py'."""
    function, _, where = text.partition(" (")
    return f"{function} {where.rsplit('/', 1)[-1].split(':')[0]}"


# What the innermost frame of a sample belongs to (first match wins): the split of
# the process's busy time between the kernel calls, the QUIC stack, the event loop
# and our own code.
_SYSCALLS = (
    "sendto",
    "sendmsg",
    "recvfrom",
    "recvmsg",
    "recv_into",
    "select",
    "poll",
    "pwrite",
    "pwritev",
    "pread",
    "fsync",
)
_LAYERS = (
    ("QUIC stack (qh3/aioquic, felix_transport)", ("qh3/", "aioquic/", "felix_transport/")),
    ("event loop (asyncio)", ("asyncio/", "selectors.py", "uvloop/")),
    ("our code (felix_broker/_client/_wire/_common)", ("felix_",)),
    ("libraries (msgspec, prometheus_client, ...)", ("site-packages", "prometheus_client/")),
)


def layer(innermost: str) -> str:
    """The layer of a raw py-spy frame 'function (path:line)': a function that is a
    thin wrapper of one system call (its self time is the call) counts as that."""
    function, _, where = innermost.partition(" (")
    if function.rsplit(".", 1)[-1].lstrip("_") in _SYSCALLS:
        return "system calls (sendto/recvfrom/epoll/pwrite/fsync)"
    for name, marks in _LAYERS:
        if any(mark in where for mark in marks):
            return name
    return "other (stdlib, interpreter)"


def summarise(collapsed: Path, top: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    layers: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        raw = stack.split(";")
        frames = [_frame(f) for f in raw]
        total += count
        own[frames[-1]] += count
        layers[layer(raw[-1])] += count
        for frame in set(frames):
            anywhere[frame] += count
    print(f"{total} samples")
    print(f"{'self %':>7}  layer (by the innermost frame)")
    for name, count in layers.most_common():
        print(f"{100 * count / total:7.1f}  {name}")
    print(f"{'self %':>7}  function")
    for frame, count in own.most_common(top):
        print(f"{100 * count / total:7.1f}  {frame}")
    print(f"{'incl %':>7}  function")
    for frame, count in anywhere.most_common(top):
        print(f"{100 * count / total:7.1f}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("work", choices=["pubsub", "latency", "durable", "workqueue", "kv"])
    parser.add_argument("--n", type=int, default=1, help="fanout, in-flight count or batch")
    parser.add_argument("--op", default="get", help="kv: put or get")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--side", choices=["broker", "client"], default="broker", help="which process to sample"
    )
    parser.add_argument("--out", type=Path, help="keep the collapsed stacks here")
    parser.add_argument(
        "--system",
        choices=["felix", "felix-raw"],
        default="felix",
        help="drive the broker through felix_client or raw frames (kv, workqueue)",
    )
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory(prefix="felix-profile-") as tmpdir:
        tmp = Path(tmpdir)
        server = peers.start_felix(tmp, "periodic")
        try:
            if args.work == "workqueue":
                asyncio.run(peers.felix_setup(server.target, 200_000))
            collapsed = args.out or tmp / "stacks.txt"
            cell = {
                "system": args.system,
                "work": args.work,
                "target": server.target,
                "seconds": args.seconds,
                "group": "profile",
                "n": args.n,
                "op": args.op,
                "records": int(40_000 * args.seconds),
                "samples": 5_000,
            }
            client = subprocess.Popen(
                [sys.executable, peers.__file__, "--cell", json.dumps(cell)],
                stdout=subprocess.PIPE,
            )
            pid = server.process.pid if args.side == "broker" else client.pid
            record = subprocess.Popen(
                [
                    *(spy, "record", "--pid", str(pid), "--rate", "100"),
                    *("--format", "raw", "--output", str(collapsed), "--nonblocking"),
                    *("--duration", str(int(args.seconds) + 1)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            out, _ = client.communicate(timeout=300)
            print(out.decode().strip())
            record.wait(timeout=60)
            summarise(collapsed, args.top)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
