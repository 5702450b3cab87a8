"""Idempotent producers, conditional publishes, atomic commits and publish widths over
real QUIC: every row of the answer tables, restarts included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from felix_wire.binary import AckStatus, BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.messages import (
    Commit,
    CommitOk,
    Error,
    OffsetMismatch,
    ProducerInit,
    ProducerInitOk,
    PublishError,
    PublishIdempotent,
    PublishIf,
    PublishOk,
    PublishRefusal,
    PublishRefused,
    PublishWidth,
    SequenceGap,
    StateChangeDelete,
    StateChangePut,
    StateGet,
    StateValue,
    StreamRead,
    StreamRecords,
)

from ..fleet.harness import THROUGH_LEADER, TOPOLOGIES
from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, Feature, WireClient, WireStream
from .harness import running_broker, subscribe

pytestmark = pytest.mark.timeout(90)

PRODUCER = 0x1234_5678_9ABC_DEF0


def idem(
    sequence: int, *payloads: bytes, rid: int, stream: str = "log", **kw: Any
) -> PublishIdempotent:
    return PublishIdempotent(
        tenant_id=TENANT,
        namespace=NS,
        stream=stream,
        payloads=list(payloads),
        request_id=rid,
        producer_id=kw.pop("producer", PRODUCER),
        sequence=sequence,
        **kw,
    )


async def read_all(stream: WireStream, name: str = "log", shard: int = 0) -> list[bytes]:
    await stream.send(
        StreamRead(
            tenant_id=TENANT, namespace=NS, stream=name, shard=shard, from_=0, request_id=999
        )
    )
    page = await stream.recv()
    assert isinstance(page, StreamRecords), page
    return [r.payload for r in page.records]


async def opened(client: WireClient, **kw: Any) -> WireStream:
    stream, _answer = await client.authed(**kw)
    return stream


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_producer_init_grants_random_ids(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        assert broker.features & Feature.FEATURE_IDEMPOTENT_PRODUCER
        client = await WireClient.connect(broker)
        stream = await opened(client)
        ids = set()
        for rid in (1, 2):
            await stream.send(ProducerInit(request_id=rid))
            answer = await stream.recv()
            assert isinstance(answer, ProducerInitOk) and answer.request_id == rid
            ids.add(answer.producer_id)
        assert len(ids) == 2
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_every_row_of_the_idempotent_answer_table(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        # Next expected (an unknown producer starts at 0): appended.
        await stream.send(idem(0, b"a", b"b", rid=1))
        assert await stream.recv() == PublishOk(request_id=1, offset=0)
        await stream.send(idem(1, b"c", rid=2))
        assert await stream.recv() == PublishOk(request_id=2, offset=2)
        # Remembered, same payloads: the original offset, nothing appended.
        await stream.send(idem(0, b"a", b"b", rid=3))
        assert await stream.recv() == PublishOk(request_id=3, offset=0)
        # Remembered, other payloads: sequence_reused for a client that offered the bit.
        await stream.send(idem(1, b"other", rid=4))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused) and answer.reason == "sequence_reused"
        # ... and publish_ok with the original offset, nothing written, for one that did not.
        plain = await opened(
            client, features=OFFICIAL_FEATURES & ~int(Feature.FEATURE_SEQUENCE_REUSED)
        )
        await plain.send(idem(1, b"other", rid=5))
        assert await plain.recv() == PublishOk(request_id=5, offset=2)
        # Ahead of expected: sequence_gap with the expected sequence.
        await stream.send(idem(5, b"x", rid=6))
        answer = await stream.recv()
        assert answer == PublishRefused(
            request_id=6,
            reason=PublishRefusal(sequence_gap=SequenceGap(expected=2)),
            message=answer.message,  # type: ignore[union-attr]
        )
        # Unknown producer with a sequence other than 0.
        await stream.send(idem(3, b"x", rid=7, producer=77))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused) and answer.reason == "unknown_producer"
        # Older than the 64 remembered batches: sequence_expired.
        for sequence in range(2, 2 + 64):
            await stream.send(idem(sequence, b"n%d" % sequence, rid=100 + sequence))
            answer = await stream.recv()
            assert isinstance(answer, PublishOk), answer
        await stream.send(idem(1, b"c", rid=8))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused) and answer.reason == "sequence_expired"
        records = await read_all(stream)
        assert records[:3] == [b"a", b"b", b"c"] and len(records) == 3 + 64  # no duplicates
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_binary_idempotent_frames_are_answered_in_json(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        frame = PublishBatchFrame(
            request_id=1,
            ack_mode=BinaryAckMode.PER_BATCH,
            producer_id=9,
            sequence=0,
            key=b"k",
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            payloads=[b"bin"],
        )
        await stream.send(frame)
        first = await stream.recv()
        assert isinstance(first, PublishOk) and first.offset == 0
        await stream.send(frame)  # the resend: same answer, nothing appended
        assert await stream.recv() == PublishOk(request_id=1, offset=0)
        frame.sequence = 4
        await stream.send(frame)
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused)
        assert answer.reason == PublishRefusal(sequence_gap=SequenceGap(expected=1))
        client.close()


async def test_in_memory_streams_keep_producers_in_memory(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        for rid in (1, 2):
            await stream.send(idem(0, b"m", rid=rid, stream="orders"))
            assert await stream.recv() == PublishOk(request_id=rid)  # in memory: no offset
        client.close()
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        await stream.send(idem(1, b"m2", rid=3, stream="orders"))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused) and answer.reason == "unknown_producer"
        client.close()


async def test_a_restarted_broker_answers_resends_as_before(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        for sequence in range(3):
            await stream.send(idem(sequence, b"r%d" % sequence, rid=sequence + 1))
            assert await stream.recv() == PublishOk(request_id=sequence + 1, offset=sequence)
        client.close()
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        await stream.send(idem(1, b"r1", rid=10))
        assert await stream.recv() == PublishOk(request_id=10, offset=1)
        await stream.send(idem(1, b"changed", rid=11))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused) and answer.reason == "sequence_reused"
        await stream.send(idem(5, b"x", rid=12))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused)
        assert answer.reason == PublishRefusal(sequence_gap=SequenceGap(expected=3))
        await stream.send(idem(3, b"r3", rid=13))
        assert await stream.recv() == PublishOk(request_id=13, offset=3)
        assert await read_all(stream) == [b"r0", b"r1", b"r2", b"r3"]
        client.close()


def pif(expected: int, *payloads: bytes, rid: int, stream: str = "log") -> PublishIf:
    return PublishIf(
        tenant_id=TENANT,
        namespace=NS,
        stream=stream,
        payloads=list(payloads),
        expected_offset=expected,
        request_id=rid,
    )


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_publish_if_rows(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        assert broker.features & Feature.FEATURE_PUBLISH_CONDITIONAL
        client = await WireClient.connect(broker)
        stream = await opened(client)
        await stream.send(pif(0, b"first", b"second", rid=1))
        assert await stream.recv() == PublishOk(request_id=1, offset=0)
        await stream.send(pif(0, b"late", rid=2))
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused)
        assert answer.reason == PublishRefusal(offset_mismatch=OffsetMismatch(tail=2))
        await stream.send(pif(2, rid=3))
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        await stream.send(pif(0, b"x", rid=4, stream="orders"))
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        assert await read_all(stream) == [b"first", b"second"]  # nothing written by refusals
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_of_many_racers_exactly_one_wins_over_quic(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        streams = [await opened(client) for _ in range(20)]

        async def race(stream: WireStream, i: int) -> Any:
            await stream.send(pif(0, b"racer %d" % i, rid=i + 1))
            return await stream.recv(timeout=15)

        answers = await asyncio.gather(*(race(s, i) for i, s in enumerate(streams)))
        wins = [a for a in answers if isinstance(a, PublishOk)]
        losses = [a for a in answers if isinstance(a, PublishRefused)]
        assert len(wins) == 1 and wins[0].offset == 0
        assert len(losses) == 19
        mismatch = PublishRefusal(offset_mismatch=OffsetMismatch(tail=1))
        assert all(a.reason == mismatch for a in losses)  # type: ignore[attr-defined]
        assert len(await read_all(streams[0])) == 1
        client.close()


def commit(event: bytes, *changes: Any, rid: int, entity: bytes = b"e1", **kw: Any) -> Commit:
    return Commit(
        tenant_id=TENANT,
        namespace=NS,
        stream=kw.pop("stream", "log"),
        entity_key=entity,
        event=event,
        changes=list(changes),
        request_id=rid,
        **kw,
    )


def state_get(key: str, rid: int, entity: bytes = b"e1") -> StateGet:
    return StateGet(
        tenant_id=TENANT, namespace=NS, stream="log", entity_key=entity, key=key, request_id=rid
    )


async def test_commits_and_state(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        assert broker.features & Feature.FEATURE_ATOMIC_COMMIT
        client = await WireClient.connect(broker)
        stream = await opened(client)
        await stream.send(state_get("status", 1))
        assert await stream.recv() == StateValue(value=None, request_id=1)
        await stream.send(
            commit(
                b"created",
                StateChangePut(key="status", value=b"new"),
                StateChangePut(key="owner", value=b"ann"),
                rid=2,
            )
        )
        created = await stream.recv()
        assert isinstance(created, CommitOk) and created.request_id == 2
        await stream.send(
            commit(
                b"paid",
                StateChangePut(key="status", value=b"paid"),
                StateChangeDelete(key="owner"),
                rid=3,
            )
        )
        paid = await stream.recv()
        assert isinstance(paid, CommitOk) and paid.offset > created.offset
        await stream.send(state_get("status", 4))
        assert await stream.recv() == StateValue(
            value=b"paid", version=paid.offset, as_of=paid.offset, request_id=4
        )
        await stream.send(state_get("owner", 5))
        assert await stream.recv() == StateValue(value=None, as_of=paid.offset, request_id=5)
        # Conditional: refused with the tail, nothing written.
        await stream.send(
            commit(b"x", StateChangePut(key="status", value=b"x"), rid=6, expected_offset=0)
        )
        answer = await stream.recv()
        assert isinstance(answer, PublishRefused)
        assert answer.reason == PublishRefusal(offset_mismatch=OffsetMismatch(tail=paid.offset + 1))
        await stream.send(commit(b"shipped", rid=7, expected_offset=paid.offset + 1))
        shipped = await stream.recv()
        assert shipped == CommitOk(request_id=7, offset=paid.offset + 1)
        # The events are records like any other.
        assert await read_all(stream) == [b"created", b"paid", b"shipped"]
        # In-memory streams have no commits.
        await stream.send(commit(b"e", rid=8, stream="orders"))
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        client.close()
    async with running_broker(tmp_path) as broker:  # rebuilt from the log
        client = await WireClient.connect(broker)
        stream = await opened(client)
        await stream.send(state_get("status", 9))
        assert await stream.recv() == StateValue(
            value=b"paid", version=paid.offset, as_of=paid.offset + 1, request_id=9
        )
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_publish_width_and_stale_width(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        assert broker.features & Feature.FEATURE_PUBLISH_WIDTH
        client = await WireClient.connect(broker)
        stream = await opened(client)

        def keyed(rid: int, key: bytes | None = b"k") -> PublishBatchFrame:
            return PublishBatchFrame(
                request_id=rid,
                ack_mode=BinaryAckMode.PER_BATCH,
                key=key,
                tenant_id=TENANT,
                namespace=NS,
                stream="log",
                payloads=[b"w"],
            )

        await stream.send(PublishWidth(tenant_id=TENANT, namespace=NS, stream="log", shards=2))
        await stream.send(keyed(1))
        answer = await stream.recv()  # no answer to publish_width: this is the publish's
        assert isinstance(answer, PublishAckFrame) and answer.status is AckStatus.OK
        await stream.send(PublishWidth(tenant_id=TENANT, namespace=NS, stream="log", shards=3))
        await stream.send(keyed(2))
        answer = await stream.recv()
        assert isinstance(answer, PublishAckFrame) and answer.status is AckStatus.ERROR
        assert answer.code == 17 and "stale width" in answer.message
        await stream.send(keyed(3, key=None))  # unkeyed batches go to shard 0 whatever the width
        answer = await stream.recv()
        assert isinstance(answer, PublishAckFrame) and answer.status is AckStatus.OK
        other = await opened(client)  # the width belongs to the stream it was sent on
        await other.send(keyed(4))
        answer = await other.recv()
        assert isinstance(answer, PublishAckFrame) and answer.status is AckStatus.OK
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_idempotent_frames_on_a_publish_only_stream_land_once_unanswered(
    tmp_path: Path, topology: str
) -> None:
    from felix_wire.codec import encode_frame
    from felix_wire.gating import client_auth

    from ..support.wire import token

    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        uni = await client.connection.open_uni_stream()
        await uni.write(
            encode_frame(client_auth(TENANT, token(broker), client_flags=0x1FFF, client_features=0))
        )
        frame = PublishBatchFrame(
            request_id=1,
            ack_mode=BinaryAckMode.PER_BATCH,
            producer_id=5,
            sequence=0,
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            payloads=[b"once"],
        )
        for _ in range(3):
            await uni.write(encode_frame(frame))
        stream = await opened(client)
        # The resend on the control stream finds the uni stream's batch: a duplicate.
        await stream.send(idem(0, b"once", rid=2, producer=5))
        assert await stream.recv(timeout=10) == PublishOk(request_id=2, offset=0)
        assert await read_all(stream) == [b"once"]
        client.close()


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_subscribers_see_a_commits_event_at_its_offset(tmp_path: Path, topology: str) -> None:
    from felix_wire.binary import EventBatchSharedFrame
    from felix_wire.routing import shard_for_key

    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        shard = shard_for_key(b"e-sub", 2, "modulo")  # "log" has two shards, modulo routing
        _, events = await subscribe(client, "log", shard=shard)
        stream = await opened(client)
        await stream.send(
            commit(b"the event", StateChangePut(key="k", value=b"v"), rid=1, entity=b"e-sub")
        )
        done = await stream.recv()
        assert isinstance(done, CommitOk)
        frame = await events.recv(timeout=10)  # type: ignore[attr-defined]
        assert isinstance(frame, EventBatchSharedFrame)
        assert (frame.base_offset, frame.payloads) == (done.offset, [b"the event"])
        client.close()


async def test_metrics_count_duplicates_refusals_and_commits(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        registry = broker.metrics.registry
        client = await WireClient.connect(broker)
        stream = await opened(client)
        for rid, sequence in ((1, 0), (2, 0), (3, 5)):
            await stream.send(idem(sequence, b"m", rid=rid))
            await stream.recv()
        await stream.send(commit(b"e", rid=4))
        await stream.recv()
        await stream.send(commit(b"e", rid=5, expected_offset=0))
        await stream.recv()
        await stream.send(pif(0, b"x", rid=6))
        await stream.recv()
        client.close()
        assert registry.get_sample_value("felix_stream_producer_duplicates_total") == 1
        assert (
            registry.get_sample_value(
                "felix_stream_producer_refusals_total", {"reason": "sequence_gap"}
            )
            == 1
        )
        assert registry.get_sample_value("felix_stream_commits_total", {"outcome": "ok"}) == 1
        assert (
            registry.get_sample_value("felix_stream_commits_total", {"outcome": "offset_mismatch"})
            == 1
        )
        for kind in ("commit", "publish_if"):
            assert (
                registry.get_sample_value("felix_stream_conditional_refusals_total", {"type": kind})
                == 1
            )


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_a_malformed_idempotent_frame_is_answered_in_json(
    tmp_path: Path, topology: str
) -> None:
    import struct

    from felix_wire.frame import encode_header
    from felix_wire.messages import PublishError

    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        body = struct.pack(">QBQQ", 41, 2, 7, 0)  # the prefixes, then no body at all
        await stream.send(encode_header(0x0109, len(body)) + body)
        answer = await stream.recv()
        assert isinstance(answer, PublishError), answer
        assert (answer.request_id, answer.code) == (41, "invalid_request")
        client.close()


WITHOUT_PRODUCER = OFFICIAL_FEATURES & ~int(
    Feature.FEATURE_IDEMPOTENT_PRODUCER | Feature.FEATURE_SEQUENCE_REUSED
)


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_publish_refused_only_to_clients_that_offered_the_producer_feature(
    tmp_path: Path, topology: str
) -> None:
    """FEATURE_IDEMPOTENT_PRODUCER is how a client says it decodes publish_refused: a
    client that did not offer it gets each refusal as the error it decodes
    (publish_error for an idempotent batch, error for publish_if and commit), code
    invalid_request, the refusal's reason in detail.reason; nothing is written."""
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        offered = await opened(client)
        plain = await opened(client, features=WITHOUT_PRODUCER)
        await offered.send(pif(0, b"first", rid=1))
        assert await offered.recv() == PublishOk(request_id=1, offset=0)
        # A conditional publish at a stale tail.
        await offered.send(pif(0, b"x", rid=2))
        assert isinstance(await offered.recv(), PublishRefused)
        await plain.send(pif(0, b"x", rid=3))
        answer = await plain.recv()
        assert isinstance(answer, Error), answer
        assert (answer.code, answer.retry) == ("invalid_request", "fatal")
        assert answer.detail is not None and answer.detail.reason == "offset_mismatch"
        assert "next offset is 1" in answer.message
        # A conditional commit at a stale tail.
        commit = Commit(
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            entity_key=b"e",
            event=b"ev",
            changes=[],
            expected_offset=5,  # its shard is empty
            request_id=4,
        )
        await plain.send(commit)
        answer = await plain.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request", answer
        assert answer.detail is not None and answer.detail.reason == "offset_mismatch"
        # An idempotent batch from an unknown producer at sequence 5.
        await plain.send(idem(5, b"y", rid=5))
        answer = await plain.recv()
        assert isinstance(answer, PublishError), answer
        assert answer.request_id == 5 and answer.code == "invalid_request"
        assert answer.detail is not None and answer.detail.reason == "unknown_producer"
        await offered.send(idem(5, b"y", rid=6))
        refused = await offered.recv()
        assert isinstance(refused, PublishRefused) and refused.reason == "unknown_producer"
        assert await read_all(offered) == [b"first"]  # no refusal wrote anything
        client.close()


async def test_a_shard_whose_log_cannot_be_opened_answers_storage(tmp_path: Path) -> None:
    """The shard of a guarded write is picked (and its log opened) before anything
    else: a log that cannot be created (a file where the tenant's folder belongs, as
    on a full disk) answers `storage`, never `internal`, and the broker goes on."""
    (tmp_path / "durable").mkdir()
    (tmp_path / "durable" / TENANT).write_bytes(b"")
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        stream = await opened(client)
        requests: list[Any] = [
            pif(0, b"x", rid=1),
            Commit(
                tenant_id=TENANT,
                namespace=NS,
                stream="log",
                entity_key=b"e",
                event=b"ev",
                changes=[],
                request_id=2,
            ),
            StateGet(
                tenant_id=TENANT, namespace=NS, stream="log", entity_key=b"e", key="k", request_id=3
            ),
        ]
        for request in requests:
            await stream.send(request)
            answer = await stream.recv()
            assert isinstance(answer, Error), answer
            assert answer.code == "storage", answer
        await stream.send(idem(0, b"x", rid=4))
        answer = await stream.recv()
        assert isinstance(answer, PublishError) and answer.request_id == 4, answer
        assert answer.code == "storage"
        await stream.send(ProducerInit(request_id=5))  # the stream goes on
        assert isinstance(await stream.recv(), ProducerInitOk)
        client.close()
