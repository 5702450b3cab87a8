"""Regression tests for what a new user hit in the first ten minutes (issue 16):
idle connections, multi-shard subscriptions, reads and watches, per-key order,
oversized payloads and a broker that is not running. Real QUIC, real broker."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import felix_client
from felix_client import (
    BrokerUnreachableError,
    ClientConfig,
    PayloadTooLargeError,
    ShardLostError,
)
from tests.conftest import start_fixture_broker, stop_fixture_broker

from .conftest import connect_client

pytestmark = pytest.mark.timeout(90)

IDLE = 1.5  # seconds: the short idle timeout of the keepalive broker and client


@pytest.fixture(scope="module")
def short_idle_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A broker that closes connections idle for IDLE seconds."""
    process, document = start_fixture_broker(
        tmp_path_factory.mktemp("idle-broker"),
        ("FELIX_MAX_IDLE_TIMEOUT_MS", str(int(IDLE * 1000))),
    )
    try:
        yield document
    finally:
        stop_fixture_broker(process)


async def test_idle_subscription_and_cache_client_survive(
    short_idle_broker: dict[str, Any],
) -> None:
    doc = short_idle_broker
    config = ClientConfig(idle_timeout=IDLE)
    assert config.ping_interval == pytest.approx(IDLE / 3)
    async with await connect_client(doc, config=config) as client:
        cache = client.cache(doc["cache"])
        await cache.put("idle-key", b"v")
        before = [link.connection for link in client._requests._links if link is not None]
        async with client.subscribe(doc["memory_stream"]) as sub:
            await asyncio.sleep(3 * IDLE)  # no traffic at all
            await client.publish(doc["memory_stream"], b"after the wait")
            event = await sub.next(timeout=5)
            assert event.payload == b"after the wait"
        assert await cache.get("idle-key") == b"v"
        after = [link.connection for link in client._requests._links if link is not None]
        # The very same connections: nothing died and was quietly replaced.
        assert after[: len(before)] == before and not any(c.closed for c in before)


async def test_keepalive_follows_a_broker_with_a_shorter_idle_timeout(
    short_idle_broker: dict[str, Any],
) -> None:
    """The client's own settings (6 s idle, PINGs every 2 s) would let a broker
    that idles out after 1.5 s close the connection; the PINGs follow the idle
    timeout both ends agreed on instead."""
    doc = short_idle_broker
    async with await connect_client(doc) as client:
        link = client._requests._links[0]
        assert link is not None
        assert link.connection._keepalive_interval == pytest.approx(IDLE / 3)
        async with client.subscribe(doc["memory_stream"]) as sub:
            await asyncio.sleep(3 * IDLE)
            await client.publish(doc["memory_stream"], b"still here")
            assert (await sub.next(timeout=5)).payload == b"still here"
        assert not link.connection.closed


def _keys_per_shard(shards: int, per_shard: int) -> dict[int, list[bytes]]:
    from felix_wire.routing import shard_for_key

    out: dict[int, list[bytes]] = {s: [] for s in range(shards)}
    i = 0
    while any(len(v) < per_shard for v in out.values()):
        key = b"key-%d" % i
        shard = shard_for_key(key, shards, "modulo")
        if len(out[shard]) < per_shard:
            out[shard].append(key)
        i += 1
    return out


async def test_subscribe_reads_every_shard_and_resumes_from_a_vector(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    assert await client.stream_shards(stream) == 4
    keys = _keys_per_shard(4, 2)
    async with client.subscribe(stream) as sub:
        assert sub.shards == [0, 1, 2, 3]
        start = sub.positions
        assert all(isinstance(p, int) for p in start.values())
        for shard, shard_keys in keys.items():
            for n, key in enumerate(shard_keys):
                await client.publish(stream, b"every-%d-%d" % (shard, n), key=key)
        got = [await sub.next(timeout=10) for _ in range(8)]
        positions = sub.positions
    assert sorted(e.payload for e in got) == sorted(
        b"every-%d-%d" % (s, n) for s in range(4) for n in range(2)
    )
    for shard in range(4):
        mine = [e for e in got if e.shard == shard]
        assert [e.payload for e in mine] == [b"every-%d-0" % shard, b"every-%d-1" % shard]
        assert [e.offset for e in mine] == [start[shard], start[shard] + 1]  # type: ignore[operator]
        assert positions[shard] == start[shard] + 2  # type: ignore[operator]

    # Resume from the vector: only what was published after it, on every shard.
    for shard, shard_keys in keys.items():
        await client.publish(stream, b"resumed-%d" % shard, key=shard_keys[0])
    async with client.subscribe(stream, start=positions) as again:
        resumed = [await again.next(timeout=10) for _ in range(4)]
    assert sorted(e.payload for e in resumed) == [b"resumed-%d" % s for s in range(4)]

    # Reading every shard: the same records, each page naming its shard.
    pages = client.stream_read(stream, start={s: p or 0 for s, p in start.items()})
    read = [(r.shard, r.payload) async for page in pages for r in page.records]
    for shard in range(4):
        assert [p for s, p in read if s == shard] == [
            b"every-%d-0" % shard,
            b"every-%d-1" % shard,
            b"resumed-%d" % shard,
        ]


async def test_a_lost_shard_is_reported_and_the_others_keep_delivering(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    keys = _keys_per_shard(4, 1)
    async with client.subscribe(stream) as sub:
        # Shard 2's event stream fails underneath (as when its broker goes away).
        handoff = sub.parts[2]._handoff  # type: ignore[attr-defined]
        handoff.stream.stop_sending(0)
        for shard in range(4):
            await client.publish(stream, b"lost-%d" % shard, key=keys[shard][0])
        got: list[bytes] = []
        lost: list[ShardLostError] = []
        while len(got) < 3:
            try:
                got.append((await sub.next(timeout=10)).payload)
            except ShardLostError as exc:
                lost.append(exc)
        assert sorted(got) == [b"lost-0", b"lost-1", b"lost-3"]
        assert [e.shard for e in lost] == [2] and list(sub.lost) == [2]
        assert sub.shards == [0, 1, 2, 3] and 2 not in sub.parts
        assert isinstance(sub.positions[2], int)
        # Recovered from its position: what shard 2 got meanwhile comes now.
        await sub.recover(2)
        assert not sub.lost and (await sub.next(timeout=10)).payload == b"lost-2"


async def test_prefix_watch_reads_every_shard_of_a_cache(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    name = felix_fixture["cache"]
    assert await client.cache_shards(name) == 4
    cache = client.cache(name)
    keys = [f"pw-{i}" for i in range(12)]
    async with cache.watch(prefix="pw-") as feed:
        assert feed.shards == [0, 1, 2, 3]
        for key in keys:
            await cache.put(key, key.encode())
        changes = [await feed.next(timeout=10) for _ in keys]
        positions = feed.positions
    assert sorted(c.key for c in changes) == sorted(keys)
    assert all(isinstance(p, int) for p in positions.values())
    # A vector resumes each shard exactly after what it delivered.
    await cache.put("pw-late", b"late")
    async with cache.watch(prefix="pw-", from_offset=positions) as again:
        late = await again.next(timeout=10)
    assert (late.key, late.value) == ("pw-late", b"late")


async def test_concurrent_same_key_publishes_keep_their_order(
    client: felix_client.Client, felix_fixture: dict[str, Any]
) -> None:
    stream = felix_fixture["durable_stream"]
    shard = await client.shard_for_key(stream, b"k")
    total = 1000
    async with client.subscribe(stream, shard=shard) as sub:
        await asyncio.gather(
            *(client.publish(stream, b"order-%04d" % i, key=b"k") for i in range(total))
        )
        got = [(await sub.next(timeout=20)).payload for _ in range(total)]
    assert got == [b"order-%04d" % i for i in range(total)]
    assert len(client._lanes) == 0  # lanes go away once nobody is in them


async def test_an_oversized_payload_is_refused_before_sending(
    client: felix_client.Client,
    felix_fixture: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = felix_fixture["memory_stream"]
    caplog.set_level(logging.WARNING)
    with pytest.raises(PayloadTooLargeError) as info:
        await client.publish(stream, b"x" * 20_000_000)
    assert "16 MiB" in str(info.value) and "20,000,000 bytes" in str(info.value)
    with pytest.raises(PayloadTooLargeError):
        await client.cache(felix_fixture["cache"]).put("big", b"x" * 20_000_000)
    # The client goes on working, and nothing was left for asyncio to complain about.
    assert await client.publish(stream, b"small") is None
    gc.collect()
    await asyncio.sleep(0.1)
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback UDP port where nothing answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def test_a_broker_that_is_not_running_is_named(
    felix_fixture: dict[str, Any], silent_port: int
) -> None:
    assert ClientConfig().connect_timeout == 2.0
    with pytest.raises(BrokerUnreachableError) as info:
        await felix_client.connect(
            f"127.0.0.1:{silent_port}",
            tenant_id="t1",
            token="t",
            ca_file=felix_fixture["ca_file"],
            config=ClientConfig(connect_timeout=0.5),
        )
    assert str(info.value) == (
        f"no broker answered at 127.0.0.1:{silent_port} within 0.5 s (is it running?)"
    )


def test_parse_addr_names_the_bad_address() -> None:
    from felix_client.client import parse_addr

    assert parse_addr("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert parse_addr("[::1]:5000") == ("::1", 5000)
    for bad in ("localhost", "localhost:", ":5000", "host:99999"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_addr(bad)


def test_fixture_removes_its_data_folder(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process, _doc = start_fixture_broker(tmp_path, ("TMPDIR", str(scratch)))
    assert [p.name for p in scratch.iterdir() if p.name.startswith("felix-fixture-")]
    stop_fixture_broker(process)
    assert process.returncode == 0
    assert not [p for p in scratch.iterdir() if p.name.startswith("felix-fixture-")]
