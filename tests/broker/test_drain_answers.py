"""drain() writes the answer of every publish it let finish before it closes the
connections: an explicit wait for each stream's answer queue, not a yield."""

from __future__ import annotations

from pathlib import Path

from felix_transport import ConnectionClosedError, StreamClosedError
from felix_wire.codec import encode_frame
from felix_wire.messages import AckMode, AuthOk, Publish, PublishOk

from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker


async def test_every_appended_publish_is_answered_before_the_close(tmp_path: Path) -> None:
    async with running_broker(tmp_path, ack_on_commit=True) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        burst = b"".join(
            encode_frame(
                Publish(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    payload=b"p",
                    ack=AckMode.PER_MESSAGE,
                    request_id=i,
                )
            )
            for i in range(200)
        )
        await stream.send(burst)
        first = await stream.recv()
        assert isinstance(first, PublishOk)
        await broker.drain()
        answered = 1
        for _ in range(1000):
            try:
                answer = await stream.recv(timeout=2)
            except (EOFError, TimeoutError, StreamClosedError, ConnectionClosedError):
                break  # the broker closed the connection after the answers
            assert isinstance(answer, PublishOk), answer
            answered += 1
        appended = broker.metrics.registry.get_sample_value("felix_stream_published_records_total")
        assert appended is not None and appended > 1
        assert answered == appended
        client.close()
