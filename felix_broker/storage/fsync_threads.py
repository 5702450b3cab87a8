"""A few threads that run the logs' fsync calls for the event loop, and nothing else.

Why not ``asyncio.to_thread`` or ``loop.run_in_executor``: an ``on_commit``
publish waits for one fsync round, and on the 2-core bench VM the executor's
round trip (a concurrent future with its condition variable, then
``wrap_future`` back into the loop, then future callbacks a loop iteration
each) added about 100 µs to a round whose fsync takes 500 µs. Here a job is a
plain queue entry, and its completion one ``call_soon_threadsafe`` of a
callback (``bench/durable.py``, on_commit rows).

Bounds: :data:`FSYNC_THREADS` threads, so at most that many fsyncs run at
once across every log of the process; further rounds wait in the queue in
submission order. A log has at most one round in flight (group commit), so
the queue never holds more jobs than there are open logs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["FSYNC_THREADS", "run_fsync"]

_log = logging.getLogger(__name__)

FSYNC_THREADS = 4

_Done = Callable[[BaseException | None], None]
_Job = tuple[asyncio.AbstractEventLoop, Callable[[], None], _Done]

_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_start_lock = threading.Lock()


def _forget_threads_after_fork() -> None:
    # A forked child has none of the parent's threads (and may have copied
    # the lock held): it starts its own on first use.
    global _jobs, _start_lock
    _jobs = queue.SimpleQueue()
    _start_lock = threading.Lock()
    _threads.clear()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


def run_fsync(work: Callable[[], None], done: _Done) -> None:
    """Run ``work`` (blocking file syncs) on an fsync thread, then ``done`` on this loop.

    ``done`` gets the exception ``work`` raised, or None. It is a plain
    callback, not a future, so the loop wakes once and runs it directly; it
    is dropped if the loop has closed by then.
    """
    loop = asyncio.get_running_loop()
    if len(_threads) < FSYNC_THREADS:
        _start_threads()
    _jobs.put((loop, work, done))


def _start_threads() -> None:
    with _start_lock:
        while len(_threads) < FSYNC_THREADS:
            thread = threading.Thread(
                target=_serve, name=f"felix-fsync-{len(_threads)}", daemon=True
            )
            thread.start()
            _threads.append(thread)


def _serve() -> None:
    # Daemon threads: a job cut short by interpreter exit is harmless, because
    # Log.close() makes its own final fsync on the closing thread.
    while True:
        loop, work, done = _jobs.get()
        error: BaseException | None = None
        try:
            work()
        except BaseException as exc:  # handed to the loop, which decides
            error = exc
        try:
            loop.call_soon_threadsafe(done, error)
        except RuntimeError:
            _log.debug("fsync finished after its event loop closed")
