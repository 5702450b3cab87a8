"""The broker's wall clock: the one place its data path reads the time of day.

Append times (S13: the leader's clock at append), cache TTL deadlines and expiry,
and the stamps of cache and group log records all come from `wall_ns` (and its
`wall_us` / `wall_ms` shorthands). Timers and timeouts use `time.monotonic` and
never come here; leases live in etcd.

In test mode only (FELIX_TEST_FAULTS, `felix_broker.chaos.faults`), the broker
installs the fault file's ``clock_offset_ms`` with `install_offset`, so a chaos
run can jump one broker's clock forward or back without touching the host's.
The offset is process-wide (one broker per process, as the chaos runner and the
fixture start them); without it `wall_ns` is `time.time_ns` plus one test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["install_offset", "wall_ms", "wall_ns", "wall_us"]

_offset_ns: Callable[[], int] | None = None


def install_offset(offset_ns: Callable[[], int] | None) -> None:
    """Test mode: every wall-clock read adds ``offset_ns()`` (None: the plain clock)."""
    global _offset_ns
    _offset_ns = offset_ns


def wall_ns() -> int:
    """Nanoseconds since the epoch on this broker's clock."""
    if _offset_ns is None:
        return time.time_ns()
    return time.time_ns() + _offset_ns()


def wall_us() -> int:
    return wall_ns() // 1000


def wall_ms() -> int:
    return wall_ns() // 1_000_000
