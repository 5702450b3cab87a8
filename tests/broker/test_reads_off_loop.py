"""stream_read and a subscription's history replay read the log on a worker thread:
a read of megabytes does not hold the event loop (and so other streams' publishes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from felix_broker.storage.format import Record
from felix_broker.storage.segment import Segment
from felix_wire.messages import (
    AckMode,
    AuthOk,
    Publish,
    PublishOk,
    StreamRead,
    StreamRecords,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker


@pytest.fixture
def reader_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads segment records are read on."""
    threads: set[int] = set()
    records_from = Segment.records_from

    def traced(self: Segment, fd: int, offset: int, end: int | None = None) -> Iterator[Record]:
        threads.add(threading.get_ident())
        return records_from(self, fd, offset, end)

    monkeypatch.setattr(Segment, "records_from", traced)
    return threads


async def test_stream_read_and_replay_read_off_the_loop(
    tmp_path: Path, reader_threads: set[int]
) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        scope = {"tenant_id": TENANT, "namespace": NS, "stream": "log"}
        for i in range(8):
            publish = Publish(
                **scope, payload=b"x" * 1000, key=b"k", ack=AckMode.PER_MESSAGE, request_id=i
            )
            await stream.send(publish)
            assert isinstance(await stream.recv(), PublishOk)
        assert broker.engine is not None
        spec = broker.engine.stream(TENANT, NS, "log")
        assert spec is not None
        shard = broker.engine.shard_for(spec, b"k").index

        await stream.send(StreamRead(**scope, shard=shard, from_=0, request_id=100))
        page = await stream.recv()
        assert isinstance(page, StreamRecords) and len(page.records) == 8
        read_threads = set(reader_threads)
        assert read_threads and threading.get_ident() not in read_threads

        reader_threads.clear()
        await stream.send(Subscribe(**scope, shard=shard, start="earliest"))
        assert isinstance(await stream.recv(), Subscribed)
        events = await client.event_stream()
        await events.recv()  # event_stream_hello
        await events.recv()  # the history, replayed
        assert reader_threads and threading.get_ident() not in reader_threads
        client.close()
