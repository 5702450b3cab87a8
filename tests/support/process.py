"""What this test process holds, read from /proc: open file descriptors and resident
memory (the leak checks of the fuzz, soak and fd-leak tests)."""

from __future__ import annotations

import os


def fd_count() -> int:
    """File descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    """This process's resident set size, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
