"""kill -9 against idempotent producers and atomic commits: a broker process killed at
random points, restarted, and checked: every batch exactly once, every commit whole or absent."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from felix_transport import Connection
from felix_wire.codec import encode_frame
from felix_wire.features import Feature
from felix_wire.gating import client_auth
from felix_wire.messages import (
    Commit,
    CommitOk,
    PublishIdempotent,
    PublishOk,
    StateChangePut,
    StateGet,
    StateValue,
    StreamRead,
    StreamRecords,
)

from ..support.broker_process import broker_process, free_udp_port
from ..support.wire import NS, TENANT, BrokerProcess, WireClient, WireStream, token


async def _client(data: Path, port: int) -> tuple[Connection, str]:
    """A connection to the broker process on `port` (files in `data`) and a token for it."""
    broker = BrokerProcess(port, data)
    client = await WireClient.connect(broker)
    return client.connection, token(broker, subject="crash")


pytestmark = pytest.mark.timeout(240)

FEATURES = int(
    Feature.FEATURE_IDEMPOTENT_PRODUCER
    | Feature.FEATURE_SEQUENCE_REUSED
    | Feature.FEATURE_PUBLISH_PIPELINE
    | Feature.FEATURE_ATOMIC_COMMIT
    | Feature.FEATURE_ERROR_CODES
)
PRODUCER = 424242
WINDOW = 32  # idempotent batches in flight: at a kill, appended batches wait for answers


async def _stream(data: Path, port: int) -> tuple[Any, WireStream]:
    connection, token = await _client(data, port)
    stream = WireStream(await connection.open_bidi_stream())
    await stream.send(
        encode_frame(client_auth(TENANT, token, client_flags=0x1FFF, client_features=FEATURES))
    )
    await stream.recv()
    return connection, stream


def _batch(sequence: int) -> list[bytes]:
    return [b"s%d-a" % sequence, b"s%d-b" % sequence]


async def _produce(
    data: Path, port: int, start: int, answered: dict[int, int], kill: Any, stop_at: int
) -> tuple[int, int]:
    """Send batches ``start``..``stop_at`` (resends first), WINDOW in flight, until the
    broker dies; returns one past the highest sequence sent, and how many batches the
    log already held past ``start`` (appended before the kill, never answered)."""
    connection, stream = await _stream(data, port)
    await stream.send(
        StreamRead(
            tenant_id=TENANT, namespace=NS, stream="log", shard=0, from_=2 * start, request_id=1
        )
    )
    page = await stream.recv()
    held = len(page.records) // 2 if isinstance(page, StreamRecords) else 0
    kill()
    sent = start
    pending: list[int] = []
    try:
        while sent < stop_at or pending:
            while sent < stop_at and len(pending) < WINDOW:
                await stream.send(
                    PublishIdempotent(
                        tenant_id=TENANT,
                        namespace=NS,
                        stream="log",
                        payloads=_batch(sent),
                        request_id=sent + 1,
                        producer_id=PRODUCER,
                        sequence=sent,
                    )
                )
                pending.append(sent)
                sent += 1
            answer = await stream.recv(timeout=5)
            assert isinstance(answer, PublishOk), answer  # never a refusal: resends are exact
            sequence = answer.request_id - 1
            assert sequence == pending.pop(0)  # answers in order (pipelining)
            assert answer.offset is not None
            if sequence in answered:
                assert answered[sequence] == answer.offset
            answered[sequence] = answer.offset
    except (EOFError, TimeoutError, OSError, ConnectionError):
        pass
    except Exception as exc:  # the connection dying mid-frame surfaces as transport errors
        if not type(exc).__module__.startswith("felix_transport"):
            raise
    finally:
        connection.close()
    return sent, held


async def _read_log(stream: WireStream) -> list[tuple[int, bytes]]:
    records: list[tuple[int, bytes]] = []
    position = 0
    for rid in range(1, 10_000):
        await stream.send(
            StreamRead(
                tenant_id=TENANT,
                namespace=NS,
                stream="log",
                shard=0,
                from_=position,
                request_id=rid,
            )
        )
        page = await stream.recv()
        assert isinstance(page, StreamRecords)
        if not page.records:
            break
        records.extend((r.offset, r.payload) for r in page.records)
        position = page.next_offset
    return records


def test_idempotent_batches_land_exactly_once_across_kill_9(tmp_path: Path) -> None:
    port = free_udp_port()
    rng = random.Random(11)
    data = tmp_path / "data"
    answered: dict[int, int] = {}
    total = 0
    interrupted = 0
    for _round in range(4):
        with broker_process(tmp_path, port) as process:
            start = min((s for s in range(total) if s not in answered), default=total)
            delay = rng.uniform(0.2, 0.6)

            def kill(process: subprocess.Popen[bytes] = process, delay: float = delay) -> None:
                asyncio.get_running_loop().call_later(
                    delay, lambda: os.kill(process.pid, signal.SIGKILL)
                )

            # Bounded, but far more than can be sent before the kill.
            sent, held = asyncio.run(_produce(data, port, start, answered, kill, start + 20_000))
            total = max(total, sent)
            interrupted += held
    # A last run without a kill resends whatever is still unanswered, then checks the log.
    with broker_process(tmp_path, port):
        start = min((s for s in range(total) if s not in answered), default=total)
        _sent, held = asyncio.run(_produce(data, port, start, answered, lambda: None, total))
        interrupted += held
        # Some kill landed between append and answer: those resends were duplicates.
        assert interrupted > 0, "no kill landed between an append and its answer"

        async def check() -> list[tuple[int, bytes]]:
            connection, stream = await _stream(data, port)
            try:
                return await _read_log(stream)
            finally:
                connection.close()

        records = asyncio.run(check())
    assert len(answered) == total
    expected = [payload for sequence in range(total) for payload in _batch(sequence)]
    assert [payload for _, payload in records] == expected  # each batch once, in order
    for sequence, offset in answered.items():
        assert records[offset] == (offset, _batch(sequence)[0])


ENTITIES = 6


async def _commit_until_killed(
    data: Path, port: int, kill: Any, acked: dict[int, tuple[bytes, int]], budget: int
) -> None:
    connection, token = await _client(data, port)
    kill()

    async def worker(entity: int) -> None:
        stream = WireStream(await connection.open_bidi_stream())
        await stream.send(
            encode_frame(client_auth(TENANT, token, client_flags=0x1FFF, client_features=FEATURES))
        )
        await stream.recv()
        for i in range(budget):
            tag = b"%d-%d-%d" % (entity, i, random.getrandbits(32))
            await stream.send(
                Commit(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="log",
                    entity_key=b"entity-%d" % entity,
                    event=b"event " + tag,
                    changes=[
                        StateChangePut(key="a", value=tag),
                        StateChangePut(key="b", value=tag),
                    ],
                    request_id=i + 1,
                )
            )
            answer = await stream.recv(timeout=5)
            assert isinstance(answer, CommitOk), answer
            acked[answer.offset] = (tag, entity)

    results = await asyncio.gather(*(worker(e) for e in range(ENTITIES)), return_exceptions=True)
    for result in results:
        if isinstance(result, AssertionError):
            raise result
    connection.close()


def test_commits_are_whole_or_absent_across_kill_9(tmp_path: Path) -> None:
    port = free_udp_port()
    rng = random.Random(5)
    data = tmp_path / "data"
    acked: dict[int, tuple[bytes, int]] = {}
    for _round in range(4):
        with broker_process(tmp_path, port) as process:
            delay = rng.uniform(0.1, 0.6)

            def kill(process: subprocess.Popen[bytes] = process, delay: float = delay) -> None:
                asyncio.get_running_loop().call_later(
                    delay, lambda: os.kill(process.pid, signal.SIGKILL)
                )

            asyncio.run(_commit_until_killed(data, port, kill, acked, budget=80))
    assert len(acked) >= 300, "too few commits were acknowledged to say anything"

    async def check() -> None:
        connection, stream = await _stream(data, port)
        try:
            records = await _read_log(stream)
            assert [o for o, _ in records] == list(range(len(records)))
            events = {offset: payload for offset, payload in records}
            for offset, (tag, _entity) in acked.items():
                assert events[offset] == b"event " + tag  # every acknowledged commit is there
            # The state of each entity is that of its last commit in the log: both keys
            # written by one commit, never a mix, with that commit's offset as version.
            last: dict[int, tuple[int, bytes]] = {}
            for offset, payload in records:
                tag = payload.removeprefix(b"event ")
                last[int(tag.split(b"-")[0])] = (offset, tag)
            newest = max(events)
            for entity, (offset, tag) in last.items():
                for rid, key in ((1, "a"), (2, "b")):
                    await stream.send(
                        StateGet(
                            tenant_id=TENANT,
                            namespace=NS,
                            stream="log",
                            entity_key=b"entity-%d" % entity,
                            key=key,
                            request_id=rid,
                        )
                    )
                    value = await stream.recv()
                    assert value == StateValue(
                        value=tag, version=offset, as_of=newest, request_id=rid
                    ), (entity, key)
        finally:
            connection.close()

    with broker_process(tmp_path, port):
        asyncio.run(check())
