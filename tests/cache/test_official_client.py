"""Interop with the official client (felix-client 0.6.2, import name `felix`).

The official client is synchronous, so each test drives it in a worker thread
while the broker runs in-process on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from felix_broker.app import Broker
from felix_broker.cache.service import CacheLimits

from .harness import CACHE, NS, TENANT, cache_broker, token

felix = pytest.importorskip("felix")

pytestmark = pytest.mark.timeout(90)

T = TypeVar("T")


async def with_client(broker: Broker, body: Callable[[Any], T]) -> T:
    assert broker.ca_path is not None
    ca_file = str(broker.ca_path)
    tok = token(broker)
    addrs = [f"127.0.0.1:{broker.quic_port}"]

    def run() -> T:
        with felix.Client(addrs, tenant_id=TENANT, token=tok, ca_file=ca_file) as client:
            return body(client)

    return await asyncio.to_thread(run)


@pytest.mark.parametrize("durable", [False, True])
async def test_put_get_delete_and_ttl(tmp_path: Path, durable: bool) -> None:
    async with cache_broker(tmp_path, durable=durable) as broker:

        def body(client: Any) -> None:
            assert client.cache_get(TENANT, NS, CACHE, "missing") is None
            client.cache_put(TENANT, NS, CACHE, "k", b"v1")
            assert client.cache_get(TENANT, NS, CACHE, "k") == b"v1"
            client.cache_put(TENANT, NS, CACHE, "k", b"")
            assert client.cache_get(TENANT, NS, CACHE, "k") == b""
            assert client.cache_delete(TENANT, NS, CACHE, "k") == b""
            assert client.cache_delete(TENANT, NS, CACHE, "k") is None
            assert client.cache_get(TENANT, NS, CACHE, "k") is None
            client.cache_put(TENANT, NS, CACHE, "ttl", b"soon", ttl=0.3)
            assert client.cache_get(TENANT, NS, CACHE, "ttl") == b"soon"
            time.sleep(0.45)
            assert client.cache_get(TENANT, NS, CACHE, "ttl") is None
            big = bytes(range(256)) * 64
            client.cache_put(TENANT, NS, CACHE, "big", big)
            assert client.cache_get(TENANT, NS, CACHE, "big") == big

        await with_client(broker, body)


async def test_counters(tmp_path: Path) -> None:
    async with cache_broker(tmp_path) as broker:

        def body(client: Any) -> None:
            assert client.counter_get(TENANT, NS, CACHE, "n") is None
            assert client.counter_add(TENANT, NS, CACHE, "n", 5) == 5
            assert client.counter_add(TENANT, NS, CACHE, "n", -7) == -2
            assert client.counter_get(TENANT, NS, CACHE, "n") == -2
            client.cache_put(TENANT, NS, CACHE, "n", b"separate")
            assert client.counter_get(TENANT, NS, CACHE, "n") == -2
            assert client.cache_get(TENANT, NS, CACHE, "n") == b"separate"

        await with_client(broker, body)


async def test_key_watch_live_and_delete(tmp_path: Path) -> None:
    async with cache_broker(tmp_path) as broker:

        def body(client: Any) -> None:
            handle = client.watch_cache(TENANT, NS, CACHE, felix.CacheWatchFilter.key("k"))
            assert not handle.resnapshot
            client.cache_put(TENANT, NS, CACHE, "other", b"x")
            client.cache_put(TENANT, NS, CACHE, "k", b"v1")
            client.cache_delete(TENANT, NS, CACHE, "k")
            first = handle.recv(timeout=5)
            assert (first.key, first.value) == ("k", b"v1")
            second = handle.recv(timeout=5)
            assert (second.key, second.value) == ("k", None)
            assert second.offset > first.offset >= handle.resume_offset
            handle.close()

        await with_client(broker, body)


async def test_prefix_watch_retained_and_resume(tmp_path: Path) -> None:
    async with cache_broker(tmp_path) as broker:

        def body(client: Any) -> None:
            client.cache_put(TENANT, NS, CACHE, "room/a", b"A")
            client.cache_put(TENANT, NS, CACHE, "room/b", b"B")
            client.cache_put(TENANT, NS, CACHE, "hall/x", b"X")
            handle = client.watch_cache(
                TENANT, NS, CACHE, felix.CacheWatchFilter.prefix("room/"), retained=True
            )
            assert handle.retained_count == 2
            retained = {(c.key, c.value) for c in (handle.recv(timeout=5), handle.recv(timeout=5))}
            assert retained == {("room/a", b"A"), ("room/b", b"B")}
            client.cache_put(TENANT, NS, CACHE, "room/c", b"C")
            live = handle.recv(timeout=5)
            assert (live.key, live.value) == ("room/c", b"C")
            handle.close()
            # Resume from the live change's offset: replayed, then live.
            resumed = client.watch_cache(
                TENANT, NS, CACHE, felix.CacheWatchFilter.prefix("room/"), start=live.offset
            )
            again = resumed.recv(timeout=5)
            assert (again.key, again.value, again.offset) == ("room/c", b"C", live.offset)
            client.cache_put(TENANT, NS, CACHE, "room/a", b"A2")
            later = resumed.recv(timeout=5)
            assert (later.key, later.value) == ("room/a", b"A2")
            resumed.close()

        await with_client(broker, body)


async def test_watch_sees_ttl_expiry(tmp_path: Path) -> None:
    async with cache_broker(tmp_path, limits=CacheLimits(ttl_pass_interval=0.1)) as broker:

        def body(client: Any) -> None:
            handle = client.watch_cache(TENANT, NS, CACHE, felix.CacheWatchFilter.key("s"))
            client.cache_put(TENANT, NS, CACHE, "s", b"tok", ttl=0.2)
            stored = handle.recv(timeout=5)
            assert stored.value == b"tok" and stored.expires_at_millis > 0
            expired = handle.recv(timeout=5)
            assert (expired.key, expired.value) == ("s", None)
            handle.close()

        await with_client(broker, body)
