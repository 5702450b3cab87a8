"""What an unauthenticated peer can make the broker hold (issue 20, findings 4 and 9),
over real QUIC on the stack FELIX_QUIC_IMPL picks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from pathlib import Path

import pytest

from felix_transport import Connection, Stream, StreamClosedError
from felix_wire.codec import encode_frame
from felix_wire.frame import HEADER_SIZE, MAGIC
from felix_wire.messages import AckMode, AuthOk, CacheGet, CacheValue, Error, Publish

from ..fleet.harness import TOPOLOGIES
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)

# A header announcing a 60 KB auth frame that never comes: the stream holds a
# pre-auth slot (or waits for one) without ever authenticating.
STALLED = struct.pack(">IHHI", MAGIC, 1, 0, 60_000)
BUDGET = 128 * 1024
GLOBAL = 256 * 1024
SLACK = 64 * 1024  # qh3 pauses input a datagram after a bound; frames buffered meanwhile


async def stalled_streams(connection: Connection, count: int) -> list[Stream]:
    streams = []
    for _ in range(count):
        stream = await connection.open_bidi_stream()
        await stream.write(STALLED)
        streams.append(stream)
    return streams


def broker_buffered(broker: object) -> int:
    server = broker._server  # type: ignore[attr-defined]
    return sum(c.buffered_bytes for c in server.connections)


# Standalone: the pre-auth receive budgets are the listener's, spent before any request
# is routed, so a fleet member holds exactly what a standalone broker does.
async def test_unauthenticated_streams_cannot_fill_memory(tmp_path: Path) -> None:
    async with running_broker(
        tmp_path, preauth_conn_recv_budget=BUDGET, preauth_recv_budget=GLOBAL
    ) as broker:
        clients = [await WireClient.connect(broker) for _ in range(3)]
        writers: list[asyncio.Task[None]] = []
        for client in clients:
            # 16 take the pre-auth slots; the rest wait, and their data is not read.
            await stalled_streams(client.connection, 16)
            for _ in range(8):
                stream = await client.connection.open_bidi_stream()
                writers.append(asyncio.create_task(stream.write(os.urandom(1024 * 1024))))
        peak = 0
        for _ in range(30):
            await asyncio.sleep(0.05)
            peak = max(peak, broker_buffered(broker))
        # Before the fix each waiting stream could park up to its 16 MiB window.
        assert peak <= GLOBAL + len(clients) * SLACK

        # A healthy client is still served.
        healthy = await WireClient.connect(broker)
        answer = await healthy.request(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=1)
        )
        assert isinstance(answer, CacheValue | Error), answer
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        for client in [*clients, healthy]:
            client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_every_unauthenticated_stream_times_out_whatever_its_siblings_did(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology, auth_timeout_ms=400) as broker:
        client = await WireClient.connect(broker)
        control, ok = await client.authed()
        assert isinstance(ok, AuthOk)
        stalled = await stalled_streams(client.connection, 30)

        async def ended(stream: Stream) -> bool:
            try:
                while await stream.read():
                    pass
            except StreamClosedError:
                return True
            return True

        # Well inside the 6 s idle timeout, which would end them all anyway.
        async with asyncio.timeout(3):
            results = await asyncio.gather(*(ended(s) for s in stalled))
        assert all(results)
        assert broker.metrics.registry.get_sample_value("felix_auth_timeouts_total") == 30
        # The authenticated stream and connection live on.
        await control.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=2)
        )
        assert isinstance(await control.recv(), CacheValue | Error)
        client.close()


# Standalone: pre-auth slots are the listener's, taken before any request is routed.
async def test_streams_waiting_for_a_preauth_slot_leave_no_task_behind(tmp_path: Path) -> None:
    # The asyncio guard of tests/conftest.py fails this test on "Task was destroyed
    # but it is pending" (their answer writers, before the fix).
    async with running_broker(tmp_path) as broker:
        for _ in range(3):
            client = await WireClient.connect(broker)
            await stalled_streams(client.connection, 40)
            await asyncio.sleep(0.2)
            client.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await client.connection.wait_closed()
        for _ in range(100):
            if broker.session is not None and not broker.session.connections:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        # Nothing of those connections is left running (pytest-asyncio would cancel
        # leftovers at loop close and hide them, so look now).
        left = [
            t for t in asyncio.all_tasks() if "answer_writer" in repr(t.get_coro()) and not t.done()
        ]
        assert left == []
    assert len(STALLED) == HEADER_SIZE


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_client_gone_before_its_answers_leaves_no_failed_writer(
    tmp_path: Path, topology: str
) -> None:
    # The asyncio guard of tests/conftest.py fails this test on "Task exception was
    # never retrieved" (the answer writer dying on the closed stream, before the fix).
    # Through a non-owner the answers are the owner's, arriving after the client left.
    async with running_broker(tmp_path, topology=topology) as broker:
        for _ in range(3):
            client = await WireClient.connect(broker)
            stream = await client.session()
            flood = b"".join(
                encode_frame(
                    Publish(
                        tenant_id=TENANT,
                        namespace=NS,
                        stream="orders",
                        payload=b"x",
                        request_id=i,
                        ack=AckMode.PER_MESSAGE,
                    )
                )
                for i in range(200)
            )
            await stream.send(flood)
            client.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await client.connection.wait_closed()
        for _ in range(100):
            if broker.session is not None and not broker.session.connections:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        failed = [
            t
            for t in asyncio.all_tasks()
            if "answer_writer" in repr(t.get_coro()) and t.done() and t.exception() is not None
        ]
        assert failed == []
