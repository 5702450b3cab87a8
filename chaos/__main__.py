"""``python -m chaos --out DIR [--seconds N] [--seed S] [--faults kill,pause,...]``.

Runs one chaos run against a real 3-broker fleet (see `chaos.run`), prints the
verdict's summary and exits 0 when every rule held and every shard came back
within the liveness bound, 1 otherwise, 2 when the fleet could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from .fleet import FleetError, Layout
from .nemesis import FaultKind
from .run import RunConfig, RunResult, run


def _faults(text: str) -> tuple[FaultKind, ...]:
    if text in ("", "none"):
        return ()
    try:
        return tuple(FaultKind(name.strip()) for name in text.split(","))
    except ValueError:
        names = ", ".join(k.value for k in FaultKind)
        raise argparse.ArgumentTypeError(f"faults are a comma-separated list of {names}") from None


async def _run(config: RunConfig) -> RunResult:
    """The run, cancelled by SIGTERM or SIGINT (its fleet is stopped on the way out)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await run(config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for history and verdict")
    parser.add_argument("--seconds", type=float, default=60.0, help="workload time (default 60)")
    parser.add_argument("--seed", type=int, default=1, help="the nemesis's and workload's seed")
    parser.add_argument(
        "--faults",
        type=_faults,
        default=tuple(FaultKind),
        help="comma-separated fault kinds (default all; 'none' for a calm run)",
    )
    parser.add_argument("--log-shards", type=int, default=2, help="shards of the checked log")
    parser.add_argument(
        "--lose-disk-on-restart",
        action="store_true",
        help="deliberately broken fleet: a restarted broker comes back with no durable data",
    )
    parser.add_argument(
        "--owners-only",
        action="store_true",
        help="broker faults hit only owners of the checked log's shards",
    )
    parser.add_argument(
        "--spare-quorum-leader",
        action="store_true",
        help="kills, pauses and failed fsyncs never hit the Quorum log's leader "
        "(no failover rounds: shorter, but failover goes unchecked)",
    )
    parser.add_argument(
        "--quorum-cache",
        action="store_true",
        help="the checked cache is Quorum with 3 replicas (default: Leader, RF 1)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.log_shards < 1:
        parser.error("--seconds must be positive and --log-shards at least 1")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    config = RunConfig(
        out=args.out,
        seconds=args.seconds,
        seed=args.seed,
        layout=Layout(
            log_shards=args.log_shards,
            lose_disk_on_restart=args.lose_disk_on_restart,
            cache_replicas=3 if args.quorum_cache else 1,
        ),
        faults=args.faults,
        roles=("owner",) if args.owners_only else ("owner", "other"),
        spare_quorum_leader=args.spare_quorum_leader,
    )
    try:
        result = asyncio.run(_run(config))
    except asyncio.CancelledError:
        print("chaos: interrupted; the fleet was stopped, no verdict", file=sys.stderr)
        return 130
    except FleetError as exc:
        print(f"chaos: the fleet did not start or come back: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.summary, indent=2))
    print(f"chaos: history and verdict in {args.out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
