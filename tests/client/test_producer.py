"""The idempotent producer over real QUIC: order, exactly once across a dropped
connection and a broker killed and restarted, and every refusal as a typed error."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import felix_client
from felix_client import ClientConfig

from ..support.broker_process import free_udp_port
from ..support.wire import NS, TENANT, BrokerProcess, token
from .conftest import connect_client

pytestmark = pytest.mark.timeout(180)

CONFIG = """
catalog:
  tenants:
    t1:
      namespaces:
        default:
          streams:
            log: {durable: true, shards: 2}
            mem: {durable: false, shards: 1}
"""


async def _read_all(client: felix_client.Client, stream: str) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    async for page in client.stream_read(stream, start=0):
        out.extend((r.shard, r.offset, r.payload) for r in page.records)
    return out


# -- against the session's fixture broker ----------------------------------------------


async def test_answers_in_order_and_each_batch_once(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    async with await connect_client(felix_fixture) as client:
        tag = os.urandom(4).hex().encode()
        async with client.producer(stream) as producer:
            assert producer.producer_id > 0
            futures = [
                await producer.send(b"%s-%d" % (tag, i), key=b"k%d" % (i % 7)) for i in range(300)
            ]
            offsets = [await f for f in futures]
            batch = await producer.publish_batch([tag + b"-b0", tag + b"-b1"], key=b"k0")
        # Sequences are per shard: every shard written to counted its own batches.
        assert sum(producer.next_sequences.values()) == 301
        assert producer.resent == 0
        records = [r for r in await _read_all(client, stream) if r[2].startswith(tag)]
        assert sorted(r[2] for r in records) == sorted(
            [b"%s-%d" % (tag, i) for i in range(300)] + [tag + b"-b0", tag + b"-b1"]
        )
        by_payload = {payload: offset for _shard, offset, payload in records}
        assert [by_payload[b"%s-%d" % (tag, i)] for i in range(300)] == offsets
        assert by_payload[tag + b"-b0"] == batch and by_payload[tag + b"-b1"] == batch + 1


async def test_resent_after_a_dropped_connection_lands_once(
    felix_fixture: dict[str, Any],
) -> None:
    stream = felix_fixture["durable_stream"]
    async with await connect_client(felix_fixture) as client:
        tag = os.urandom(4).hex().encode()
        async with client.producer(stream) as producer:
            futures = [await producer.send(b"%s-%d" % (tag, i), key=b"x") for i in range(40)]
            # The producer's own connection goes away with batches in flight.
            link = producer._link
            assert link is not None
            link.connection.close()
            futures += [await producer.send(b"%s-%d" % (tag, i), key=b"x") for i in range(40, 80)]
            offsets = [await f for f in futures]
        assert producer.resent > 0
        assert offsets == sorted(offsets) and len(set(offsets)) == 80
        records = [r for r in await _read_all(client, stream) if r[2].startswith(tag)]
        assert [r[2] for r in sorted(records)] == [b"%s-%d" % (tag, i) for i in range(80)]


async def test_sequence_refusals_are_typed(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    async with await connect_client(felix_fixture) as client:
        async with client.producer(stream) as first:
            one = await first.publish(b"one")  # no key: shard 0, sequence 0
        pid = first.producer_id
        assert first.next_sequences == {0: 1}

        # Ahead of what the broker expects: a gap, naming the expected sequence.
        gap = client.producer(stream, producer_id=pid, next_sequences={0: 5})
        with pytest.raises(felix_client.SequenceGapError) as caught:
            async with gap:
                await gap.publish(b"two")
        assert (caught.value.expected, caught.value.sequence, caught.value.shard) == (1, 5, 0)
        with pytest.raises(felix_client.ProducerClosedError):
            await gap.publish(b"three")  # the producer ended loudly

        # The same sequence with other payloads.
        reused = client.producer(stream, producer_id=pid, next_sequences={0: 0})
        with pytest.raises(felix_client.SequenceReusedError):
            async with reused:
                await reused.publish(b"not one")

        # The same sequence and payload: the original offset, nothing appended.
        again = client.producer(stream, producer_id=pid, next_sequences={0: 0})
        async with again:
            first_offset = await again.publish(b"one")
        assert first_offset == one is not None
        tail = await client.publish_if(stream, b"probe", expected_offset=first_offset + 1)
        assert tail == first_offset + 1  # nothing was appended by the resend

        # Older than the 64 batches a shard remembers.
        async with client.producer(stream) as many:
            for i in range(70):
                await many.publish(b"m%d" % i)
        expired = client.producer(stream, producer_id=many.producer_id, next_sequences={0: 0})
        with pytest.raises(felix_client.SequenceExpiredError):
            async with expired:
                await expired.publish(b"m0")

        # An id the broker never gave, past sequence 0.
        stranger = client.producer(stream, producer_id=12345, next_sequences={0: 3})
        with pytest.raises(felix_client.UnknownProducerError):
            async with stranger:
                await stranger.publish(b"who")


async def test_misuse_is_refused_before_sending(felix_fixture: dict[str, Any]) -> None:
    async with await connect_client(felix_fixture) as client:
        with pytest.raises(ValueError):
            client.producer("durable", max_in_flight=65)
        with pytest.raises(ValueError):
            client.producer("durable", next_sequences={0: 1})
        producer = client.producer(felix_fixture["durable_stream"])
        with pytest.raises(felix_client.ProducerClosedError):
            await producer.publish(b"before start")
        async with producer:
            with pytest.raises(ValueError):
                await producer.send([])
            with pytest.raises(felix_client.PayloadTooLargeError):
                await producer.publish(b"x" * (17 * 1024 * 1024))
            assert await producer.publish(b"still fine") >= 0


# -- against a broker process of our own, killed and restarted ---------------------------


class _Broker:
    def __init__(self, tmp: Path) -> None:
        self.port = free_udp_port()
        self.data = tmp / "data"
        self.config = tmp / "broker.yaml"
        self.config.write_text(CONFIG)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(
            os.environ,
            FELIX_DURABLE_FSYNC_MODE="on_commit",
            FELIX_DURABLE_STORAGE_DIR=str(self.data / "durable"),
        )
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "felix_broker.cli",
                "--config",
                str(self.config),
                "--data-dir",
                str(self.data),
                "--quic-bind",
                f"127.0.0.1:{self.port}",
                "--metrics-bind",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert self.process.stdout is not None
        self.process.stdout.readline()  # started

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    async def client(self) -> felix_client.Client:
        broker = BrokerProcess(self.port, self.data)
        return await felix_client.connect(
            f"127.0.0.1:{self.port}",
            tenant_id=TENANT,
            namespace=NS,
            token=token(broker, subject="producer"),
            ca_file=broker.ca_path,
            config=ClientConfig(request_timeout=2.0, connect_timeout=1.0, idle_timeout=3.0),
        )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[_Broker]:
    b = _Broker(tmp_path)
    b.start()
    try:
        yield b
    finally:
        if b.process is not None and b.process.poll() is None:
            b.process.kill()
            b.process.wait(timeout=10)


@contextlib.asynccontextmanager
async def _client(broker: _Broker) -> AsyncIterator[felix_client.Client]:
    client = await broker.client()
    try:
        yield client
    finally:
        await client.aclose()


async def test_exactly_once_across_a_broker_killed_and_restarted(broker: _Broker) -> None:
    total = 400
    async with _client(broker) as client:
        async with client.producer("log", resend_timeout=60.0) as producer:
            futures = []
            for i in range(total):
                futures.append(await producer.send(b"r%d" % i, key=b"k%d" % (i % 5)))
                if i == total // 2:
                    # kill -9 with batches in flight, then a new broker on the same files.
                    await asyncio.to_thread(broker.kill)
                    await asyncio.to_thread(broker.start)
            offsets = [await f for f in futures]
        assert producer.resent > 0
    async with _client(broker) as reader:
        records = await _read_all(reader, "log")
    payloads = sorted(p for _s, _o, p in records)
    assert payloads == sorted(b"r%d" % i for i in range(total))  # every one, exactly once
    where = {p: (s, o) for s, o, p in records}
    assert [where[b"r%d" % i][1] for i in range(total)] == offsets


async def test_unknown_producer_after_an_in_memory_broker_restart(broker: _Broker) -> None:
    async with _client(broker) as client:
        producer = client.producer("mem", resend_timeout=30.0)
        with pytest.raises(felix_client.ProducerClosedError):  # leaving says so too
            await _unknown_after_restart(broker, producer)
        assert producer.next_sequences == {0: 4}  # m4 was refused before it was numbered


async def _unknown_after_restart(broker: _Broker, producer: felix_client.Producer) -> None:
    async with producer:
        for i in range(3):
            await producer.publish(b"m%d" % i)
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.start)
        # The new broker knows nothing of the producer: sequence 3 is refused, and
        # the producer ends rather than start over under a new id.
        with pytest.raises(felix_client.UnknownProducerError):
            await producer.publish(b"m3")
        with pytest.raises(felix_client.ProducerClosedError):
            await producer.publish(b"m4")


async def test_resending_gives_up_after_resend_timeout(broker: _Broker) -> None:
    async with _client(broker) as client:
        producer = client.producer("log", resend_timeout=3.0)
        with pytest.raises(felix_client.ProducerClosedError):  # leaving says so too
            async with producer:
                assert await producer.publish(b"before") is not None
                await asyncio.to_thread(broker.kill)  # and never back
                started = asyncio.get_running_loop().time()
                with pytest.raises(
                    (felix_client.ConnectionLostError, felix_client.ClientTimeoutError)
                ):
                    await producer.publish(b"after")
                # The answer timeout (2 s), then resends for resend_timeout (3 s).
                assert asyncio.get_running_loop().time() - started < 15
                with pytest.raises(felix_client.ProducerClosedError):
                    await producer.publish(b"later")
