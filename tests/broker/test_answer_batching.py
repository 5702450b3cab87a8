"""Answers to publishes in flight on one stream: in order, and those settled together
written together (one stream write for a worker pass, not one per publish)."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_broker.session.context import StreamIO
from felix_wire.codec import encode_frame
from felix_wire.messages import AckMode, AuthOk, Publish, PublishOk

from ..fleet.harness import TOPOLOGIES
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_settled_answers_go_out_in_order_and_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topology: str
) -> None:
    writes: list[int] = []
    real_write = StreamIO.write

    async def counted(self: StreamIO, data: bytes) -> None:
        writes.append(len(data))
        await real_write(self, data)

    async with running_broker(tmp_path, topology=topology, ack_on_commit=True) as broker:
        client = await WireClient.connect(broker)
        stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        monkeypatch.setattr(StreamIO, "write", counted)
        burst = b"".join(
            encode_frame(
                Publish(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="log",
                    payload=b"p%d" % i,
                    ack=AckMode.PER_MESSAGE,
                    request_id=i,
                )
            )
            for i in range(1, 65)
        )
        await stream.send(burst)  # 64 acked publishes in flight at once
        answers: list[PublishOk] = []
        for _ in range(64):
            answer = await stream.recv()
            assert isinstance(answer, PublishOk), answer
            answers.append(answer)
        assert [a.request_id for a in answers] == list(range(1, 65))  # in order (PL2)
        offsets = [a.offset for a in answers]  # a durable stream: after the write
        assert None not in offsets and len(set(offsets)) == 64
        # Settled by a few worker passes: far fewer writes than answers.
        assert len(writes) < 16, writes
        client.close()
