"""The fsync threads: work runs off the loop, completion comes back on it, the bound holds."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from felix_broker.storage.fsync_threads import FSYNC_THREADS, run_fsync

pytestmark = pytest.mark.timeout(30)


async def test_work_runs_off_the_loop_and_done_runs_on_it() -> None:
    loop_thread = threading.get_ident()
    seen: dict[str, int] = {}
    finished: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def work() -> None:
        seen["work"] = threading.get_ident()

    def done(error: BaseException | None) -> None:
        seen["done"] = threading.get_ident()
        finished.set_result(error)

    run_fsync(work, done)
    assert await finished is None
    assert seen["work"] != loop_thread
    assert seen["done"] == loop_thread


async def test_the_error_of_the_work_reaches_done() -> None:
    finished: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def work() -> None:
        raise OSError(5, "Input/output error")

    run_fsync(work, finished.set_result)
    error = await finished
    assert isinstance(error, OSError) and error.errno == 5


async def test_at_most_the_bound_runs_at_once_and_the_rest_wait() -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    lock = threading.Lock()
    running = 0
    peak = 0
    started: list[int] = []
    jobs = FSYNC_THREADS * 3
    results = [loop.create_future() for _ in range(jobs)]

    def work(i: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            started.append(i)
        release.wait(10)
        with lock:
            running -= 1

    for i in range(jobs):
        run_fsync(lambda i=i: work(i), results[i].set_result)
    await asyncio.sleep(0.2)
    assert sorted(started) == list(range(FSYNC_THREADS))  # the first taken, the rest queued
    release.set()
    assert await asyncio.gather(*results) == [None] * jobs
    assert peak == FSYNC_THREADS
    assert sorted(started) == list(range(jobs))


async def test_a_forked_child_starts_its_own_threads() -> None:
    # Make sure the parent has its threads, then fork: the child must not wait
    # on a queue that none of its threads serve.
    finished: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    run_fsync(lambda: None, finished.set_result)
    assert await finished is None

    async def in_child() -> None:
        done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        run_fsync(lambda: None, done.set_result)
        async with asyncio.timeout(5):
            await done

    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        try:
            asyncio.run(in_child())
        except BaseException:
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done_pid, status = os.waitpid(pid, os.WNOHANG)
        if done_pid:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        await asyncio.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's fsync never completed")
