"""A soak: mixed load with connection churn and a slow subscriber (issue 20).

`make test` runs it for FELIX_SOAK_SECONDS (30 s by default); `make soak` for 30
minutes, printing RSS and open fds every FELIX_SOAK_REPORT_SECONDS (30 s).
Afterwards, polled rather than slept, the broker's gauges return to 0 and its fds
to the baseline; the suite's asyncio guard checks nothing was left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from felix_transport import ConnectionClosedError, StreamClosedError
from felix_wire.binary import BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.messages import CacheGet, CachePut, CacheValue, Subscribe, Subscribed

from ..support.process import fd_count, rss_bytes
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

SOAK_SECONDS = float(os.environ.get("FELIX_SOAK_SECONDS", "30"))
REPORT_SECONDS = float(os.environ.get("FELIX_SOAK_REPORT_SECONDS", "30"))
CHURN_SECONDS = 2.0  # each load client reconnects this often

pytestmark = pytest.mark.timeout(SOAK_SECONDS + 180)

Gone = (StreamClosedError, ConnectionClosedError, EOFError, TimeoutError)


def rss_mib() -> float:
    return rss_bytes() / 2**20


def gauge(broker: Any, name: str) -> float:
    value = broker.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


async def churn(broker: Any, stop: asyncio.Event, work: Any, counts: dict[str, int]) -> None:
    """Run `work(client)` on a fresh connection every CHURN_SECONDS until `stop`."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        async with asyncio.timeout(10):
            client = await WireClient.connect(broker)
        # The work checks this between requests (its waits are bounded by timeouts).
        until = asyncio.Event()
        timer = loop.call_later(CHURN_SECONDS, until.set)
        stopper = asyncio.create_task(stop.wait())
        stopper.add_done_callback(lambda _t, until=until: until.set())
        try:
            await work(client, until, counts)
        except Gone:
            pass
        finally:
            timer.cancel()
            stopper.cancel()
            client.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await client.connection.wait_closed()
        counts["connections"] += 1


async def publisher(client: WireClient, stop: asyncio.Event, counts: dict[str, int]) -> None:
    pub, _ = await client.authed()
    rid = 0
    while not stop.is_set():
        rid += 1
        stream = "log" if rid % 2 else "orders"
        await pub.send(
            PublishBatchFrame(
                tenant_id=TENANT,
                namespace=NS,
                stream=stream,
                payloads=[b"p" * 512] * 8,
                request_id=rid,
                ack_mode=BinaryAckMode.PER_BATCH,
            )
        )
        assert isinstance(await pub.recv(), PublishAckFrame)
        counts["publishes"] += 1


async def subscriber(
    client: WireClient, stop: asyncio.Event, counts: dict[str, int], *, delay: float
) -> None:
    control, _ = await client.authed()
    await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
    assert isinstance(await control.recv(), Subscribed)
    events = await client.event_stream()
    while not stop.is_set():
        await events.recv(timeout=CHURN_SECONDS)
        counts["events"] += 1
        if delay:
            await asyncio.sleep(delay)  # the slow one: its queue fills, then drops


async def cache_user(client: WireClient, stop: asyncio.Event, counts: dict[str, int]) -> None:
    control, _ = await client.authed()
    rid = 0
    while not stop.is_set():
        rid += 1
        key = f"k{rid % 50}"
        await control.send(
            CachePut(tenant_id=TENANT, namespace=NS, cache="c", key=key, value=b"v", request_id=rid)
        )
        await control.recv()
        await control.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key=key, request_id=rid)
        )
        assert isinstance(await control.recv(), CacheValue)
        counts["cache"] += 1


async def test_soak_returns_to_baseline(tmp_path: Path) -> None:
    async with running_broker(tmp_path, subscriber_queue_capacity=16) as broker:
        stop = asyncio.Event()
        counts = dict.fromkeys(("connections", "publishes", "events", "cache"), 0)
        # Warm up first: the logs the load writes stay open (their files count).
        warm = WireClient.connect(broker)
        client = await warm
        for work in (publisher, cache_user):
            once = asyncio.Event()
            task = asyncio.create_task(work(client, once, counts))
            await asyncio.sleep(0.2)
            once.set()
            async with asyncio.timeout(10):
                await task
        client.close()
        async with asyncio.timeout(10):
            await client.connection.wait_closed()
        assert broker.session is not None
        for _ in range(100):
            if not broker.session.connections:
                break
            await asyncio.sleep(0.05)
        baseline_fds = fd_count()

        async def fast(c: WireClient, s: asyncio.Event, n: dict[str, int]) -> None:
            await subscriber(c, s, n, delay=0)

        async def slow(c: WireClient, s: asyncio.Event, n: dict[str, int]) -> None:
            await subscriber(c, s, n, delay=0.05)

        workers = [publisher, publisher, fast, slow, cache_user]
        tasks = [asyncio.create_task(churn(broker, stop, w, counts)) for w in workers]
        started = time.monotonic()
        next_report = started + REPORT_SECONDS
        while (now := time.monotonic()) - started < SOAK_SECONDS:
            await asyncio.sleep(min(1.0, SOAK_SECONDS - (now - started)))
            for task in tasks:
                if task.done():
                    task.result()  # a load client failed: show why
            if time.monotonic() >= next_report:
                next_report += REPORT_SECONDS
                print(
                    f"soak {time.monotonic() - started:6.0f} s: RSS {rss_mib():7.1f} MiB, "
                    f"fds {fd_count()}, {counts}",
                    flush=True,
                )
        stop.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
        assert counts["publishes"] > 0 and counts["events"] > 0 and counts["cache"] > 0

        # Polled: everything the load held goes back to zero.
        names = (
            "felix_connections_open",
            "felix_stream_subscriber_queue_batches",
            "felix_stream_subscriber_queued_bytes",
        )
        assert broker.session is not None
        for _ in range(1200):  # up to 60 s: draining and idle timeouts run slow under load
            settled = all(gauge(broker, n) == 0 for n in names)
            if settled and not broker.session.connections and fd_count() <= baseline_fds:
                break
            await asyncio.sleep(0.05)
        left = {n: gauge(broker, n) for n in names}
        open_ = [
            (c, c.closed, c.receive_paused, c.held_datagrams) for c in broker.session.connections
        ]
        assert all(v == 0 for v in left.values()), (left, open_)
        assert fd_count() <= baseline_fds, f"fds {baseline_fds} -> {fd_count()}"
        print(f"soak done: RSS {rss_mib():.1f} MiB, fds {fd_count()} (baseline {baseline_fds})")
