"""Hostile input over real QUIC for a bounded time (issue 20, "keep it true").

Random frames, names, nesting, lengths, flag bits and abrupt closes, before and
after authentication, from many connections. Afterwards the broker must still
serve a healthy client, its fds and RSS must come back within a bound of the
baseline, no request may have hit an unexpected exception, and (the suite's
asyncio guard in tests/conftest.py) asyncio must have reported nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from felix_transport import Connection, ConnectionClosedError, Stream, StreamClosedError
from felix_wire.codec import encode_frame
from felix_wire.frame import MAGIC
from felix_wire.gating import client_auth
from felix_wire.messages import CLIENT_TO_BROKER, AuthOk, CacheGet, CachePut, CacheValue, PublishOk

from ..support.process import fd_count, rss_bytes
from ..support.wire import NS, OFFICIAL_FEATURES, OFFICIAL_FLAGS, TENANT, WireClient, token
from .harness import running_broker

pytestmark = pytest.mark.timeout(120)

FUZZ_SECONDS = float(os.environ.get("FELIX_FUZZ_SECONDS", "8"))
MAX_ROUNDS = 2000
HOSTILE_NAMES = [".", "..", "../..", "a/b", "\x00", "x" * 300, "\u2025", "", "*", "t1/../t2"]
NAMES = [TENANT, NS, "orders", "log", "c", "wide", "t2", *HOSTILE_NAMES]


def header(flags: int, length: int, *, magic: int = MAGIC, version: int = 1) -> bytes:
    return struct.pack(">IHHI", magic, version, flags, length)


def json_frame(body: Any) -> bytes:
    payload = json.dumps(body).encode() if not isinstance(body, bytes) else body
    return header(0, len(payload)) + payload


def random_json_request(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice([*sorted(CLIENT_TO_BROKER), "no_such_type"])
    body: dict[str, Any] = {"type": kind}
    for field in ("tenant_id", "namespace", "stream", "cache", "group", "key", "prefix"):
        if rng.random() < 0.6:
            body[field] = rng.choice(NAMES)
    for field in ("request_id", "shard", "max_records", "wait_ms", "offset", "queue_capacity"):
        if rng.random() < 0.5:
            body[field] = rng.choice([0, 1, 7, 2**32, 2**64 - 1, 2**64, -1, "x", None])
    if rng.random() < 0.3:
        body["value"] = rng.choice(["aGVsbG8=", "!!!", 5, None])
    if rng.random() < 0.1:
        depth = rng.choice([10, 70, 1000])
        body["x"] = json.loads("[" * depth + "]" * depth) if depth < 900 else None
    return body


def hostile_bytes(rng: random.Random, authed: bool) -> bytes:
    """One write's worth of hostile input."""
    choice = rng.randrange(10)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 3000))
    if choice == 1:  # a header with random magic/version/flags/length, then some bytes
        return header(
            rng.randrange(1 << 16),
            rng.choice([0, 1, 12, 65536, 65537, 1 << 24, (1 << 32) - 1]),
            magic=rng.choice([MAGIC, MAGIC ^ 1, 0]),
            version=rng.choice([1, 1, 0, 2]),
        ) + rng.randbytes(rng.randrange(0, 200))
    if choice == 2:  # JSON nested far too deep in a small frame
        depth = rng.choice([100, 1000, 5000])
        return json_frame(b'{"type":"auth","x":' + b"[" * depth + b"]" * depth + b"}")
    if choice == 3:  # an auth with a garbage or foreign token
        return json_frame(
            {"type": "auth", "tenant_id": rng.choice(NAMES), "token": rng.choice(["", "x.y.z"])}
        )
    if choice == 4:  # binary publish layouts with hostile names and broken lengths
        flags = rng.choice([0x0001, 0x0041, 0x0009, 0x0049, 0x0109, 0x7FFF, 0x0003])
        names = b"".join(
            struct.pack(">H", len(n.encode()[:60])) + n.encode()[:60]
            for n in (rng.choice(NAMES) for _ in range(3))
        )
        body = rng.randbytes(rng.randrange(0, 17)) + names + struct.pack(">I", rng.randrange(5))
        return header(flags, len(body) + rng.choice([0, 0, 5, -3 if len(body) > 3 else 0])) + body
    if choice == 5:  # a truncated frame: the header promises more than comes
        return header(0, 5000) + b'{"type":"auth"'
    # Valid-looking JSON requests with random fields, names and numbers.
    return json_frame(random_json_request(rng))


async def fuzz_connection(broker: Any, rng: random.Random, tok: str) -> None:
    client = await WireClient.connect(broker)
    conn: Connection = client.connection
    try:
        streams: list[Stream] = []
        for _ in range(rng.randrange(1, 6)):
            stream = await conn.open_bidi_stream()
            streams.append(stream)
            authed = rng.random() < 0.5
            if authed:
                await stream.write(
                    encode_frame(
                        client_auth(
                            TENANT,
                            tok,
                            client_flags=OFFICIAL_FLAGS,
                            client_features=OFFICIAL_FEATURES,
                        )
                    )
                )
            for _ in range(rng.randrange(1, 5)):
                data = hostile_bytes(rng, authed)
                cut = rng.random() < 0.15
                await stream.write(data[: rng.randrange(len(data) + 1)] if cut else data)
            ending = rng.randrange(4)
            if ending == 0:
                await stream.finish()
            elif ending == 1:
                stream.reset(rng.randrange(8))
            with contextlib.suppress(TimeoutError, StreamClosedError):
                async with asyncio.timeout(0.02):
                    await stream.read()
        if rng.random() < 0.3:
            uni = await conn.open_uni_stream()
            await uni.write(hostile_bytes(rng, False))
        if rng.random() < 0.5:
            await asyncio.sleep(rng.random() * 0.05)
    except (StreamClosedError, ConnectionClosedError):
        pass
    finally:
        # Abrupt: close with a random application code, or just drop it.
        conn.close(rng.randrange(4), "fuzz")


async def healthy_round_trip(broker: Any) -> None:
    client = await WireClient.connect(broker)
    control, ok = await client.authed()
    assert isinstance(ok, AuthOk), ok
    await control.send(
        CachePut(tenant_id=TENANT, namespace=NS, cache="c", key="k", value=b"v", request_id=1)
    )
    await control.recv()
    await control.send(CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=2))
    answer = await control.recv()
    assert isinstance(answer, CacheValue) and answer.value == b"v", answer
    from felix_wire.messages import AckMode, Publish

    await control.send(
        Publish(
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            payload=b"ok",
            request_id=3,
            ack=AckMode.PER_MESSAGE,
        )
    )
    answer = await control.recv()
    assert isinstance(answer, PublishOk), answer
    client.close()


async def test_fuzzing_over_quic_leaves_the_broker_healthy(tmp_path: Path) -> None:
    seed = int(os.environ.get("FELIX_FUZZ_SEED", "0")) or random.randrange(1 << 30)
    rng = random.Random(seed)
    async with running_broker(tmp_path, auth_timeout_ms=300) as broker:
        tok = token(broker)
        await healthy_round_trip(broker)
        baseline_fds, baseline_rss = fd_count(), rss_bytes()
        deadline = time.monotonic() + FUZZ_SECONDS
        rounds = 0
        while time.monotonic() < deadline and rounds < MAX_ROUNDS:
            batch = [fuzz_connection(broker, rng, tok) for _ in range(rng.randrange(1, 4))]
            results = await asyncio.gather(*batch, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, (ConnectionClosedError, StreamClosedError, TimeoutError)
                ):
                    raise AssertionError(f"seed {seed}: the fuzz client failed") from result
            rounds += len(batch)
        assert rounds > 20, f"seed {seed}: only {rounds} rounds ran"
        print(f"fuzz seed {seed}: {rounds} connections in {FUZZ_SECONDS} s")

        # Still serving, while and after everything winds down.
        await healthy_round_trip(broker)
        assert broker.session is not None
        for _ in range(300):
            if not broker.session.connections and fd_count() <= baseline_fds + 4:
                break
            await asyncio.sleep(0.05)
        assert not broker.session.connections, f"seed {seed}: connections left"
        assert fd_count() <= baseline_fds + 4, f"seed {seed}: fds {baseline_fds} -> {fd_count()}"
        grown = rss_bytes() - baseline_rss
        assert grown < 96 * 1024 * 1024, f"seed {seed}: RSS grew by {grown >> 20} MiB"
        registry = broker.metrics.registry
        for metric in ("felix_request_internal_errors_total", "felix_task_failures_total"):
            values = [
                s.value for family in registry.collect() for s in family.samples if s.name == metric
            ]
            assert sum(values) == 0, f"seed {seed}: {metric} = {values}"
        await healthy_round_trip(broker)
