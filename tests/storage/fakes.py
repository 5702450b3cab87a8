"""Real fsync replacements for tests: they call os.fsync, count calls, and can fail."""

from __future__ import annotations

import errno
import os
import threading
import time


class CountingFsync:
    """An fsync that really syncs, counts its calls, and raises EIO once ``fail`` is set."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls = 0
        self.fail = False
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        if self.fail:
            raise OSError(errno.EIO, "injected fsync failure")
        if self.delay:
            # Widens the window in which other appends queue up behind a round.
            time.sleep(self.delay)
        os.fsync(fd)
        with self._lock:
            self.calls += 1
