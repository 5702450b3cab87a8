"""Guarded publishes through the engine's real publish worker and real logs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.metrics import BrokerMetrics
from felix_broker.storage import LogStore
from felix_broker.storage.format import CommitMark, StoredChange
from felix_broker.streams.engine import Engine, PublishRequest
from felix_broker.streams.guards import (
    AppendRefusedError,
    CommitGuard,
    ConditionalGuard,
    ProducerGuard,
    TailMismatch,
)
from felix_broker.streams.producers import Refusal, RefusalReason, payload_digest

pytestmark = pytest.mark.timeout(60)

SPEC = StreamSpec("t1", "default", "log", durable=True)
MEMORY = StreamSpec("t1", "default", "mem")


async def _engine(root: Path) -> tuple[Engine, LogStore]:
    config = load_config(environ={}, overrides={"data_dir": str(root)})
    store = LogStore(root / "durable")
    await store.recover_all()
    return Engine(StaticCatalog([SPEC, MEMORY], []), config, BrokerMetrics(), store), store


async def _publish(engine: Engine, spec: StreamSpec, payloads: list[bytes], guard: object) -> int:
    shard = engine.shard(spec, 0)
    request = PublishRequest(shard, payloads, None, guard=guard)  # type: ignore[arg-type]
    return await (await engine.publish(request, acked=True))


def _producer(
    engine: Engine, spec: StreamSpec, sequence: int, payloads: list[bytes]
) -> ProducerGuard:
    return ProducerGuard(
        engine.shard(spec, 0).marks,
        producer_id=42,
        sequence=sequence,
        digest=payload_digest(payloads),
        reused_refusal=True,
    )


async def test_of_many_racers_expecting_one_offset_exactly_one_wins(tmp_path: Path) -> None:
    engine, store = await _engine(tmp_path)
    results = await asyncio.gather(
        *(_publish(engine, SPEC, [b"racer %d" % i], ConditionalGuard(0)) for i in range(50)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, int)]
    losses = [r for r in results if isinstance(r, AppendRefusedError)]
    assert wins == [0]
    assert len(losses) == 49
    assert {loss.admission for loss in losses} == {TailMismatch(1)}
    assert engine.shard(SPEC, 0).next_offset == 1
    engine.close()
    await store.aclose()


async def test_resends_are_answered_with_the_original_offset_also_after_a_restart(
    tmp_path: Path,
) -> None:
    engine, store = await _engine(tmp_path)
    await _publish(engine, SPEC, [b"plain"], None)
    batch = [b"a", b"b"]
    first = await _publish(engine, SPEC, batch, _producer(engine, SPEC, 0, batch))
    again = await _publish(engine, SPEC, batch, _producer(engine, SPEC, 0, batch))
    assert first == again == 1
    with pytest.raises(AppendRefusedError) as info:
        await _publish(engine, SPEC, [b"x"], _producer(engine, SPEC, 3, [b"x"]))
    assert info.value.admission == Refusal(RefusalReason.SEQUENCE_GAP, 1)
    commit = CommitMark(b"e", (StoredChange("k", b"v"),))
    offset = await _publish(
        engine, SPEC, [b"event"], CommitGuard(engine.shard(SPEC, 0).marks, commit)
    )
    assert offset == 3
    engine.close()
    await store.aclose()

    engine, store = await _engine(tmp_path)
    shard = engine.shard(SPEC, 0)
    assert shard.next_offset == 4
    assert await _publish(engine, SPEC, batch, _producer(engine, SPEC, 0, batch)) == 1
    assert shard.next_offset == 4  # nothing appended twice
    assert await _publish(engine, SPEC, [b"c"], _producer(engine, SPEC, 1, [b"c"])) == 4
    read = shard.marks.state.get(b"e", "k")
    assert (read.value, read.version, read.as_of) == (b"v", 3, 3)
    engine.close()
    await store.aclose()


async def test_in_memory_producers_are_forgotten_on_restart(tmp_path: Path) -> None:
    engine, store = await _engine(tmp_path)
    assert await _publish(engine, MEMORY, [b"m"], _producer(engine, MEMORY, 0, [b"m"])) == 0
    assert await _publish(engine, MEMORY, [b"m"], _producer(engine, MEMORY, 0, [b"m"])) == 0
    engine.close()
    await store.aclose()
    engine, store = await _engine(tmp_path)
    with pytest.raises(AppendRefusedError) as info:
        await _publish(engine, MEMORY, [b"n"], _producer(engine, MEMORY, 1, [b"n"]))
    assert info.value.admission == Refusal(RefusalReason.UNKNOWN_PRODUCER)
    engine.close()
    await store.aclose()


async def test_recover_builds_recovered_shards_with_their_marks_before_serving(
    tmp_path: Path,
) -> None:
    engine, store = await _engine(tmp_path)
    await _publish(engine, SPEC, [b"a"], _producer(engine, SPEC, 0, [b"a"]))
    engine.close()
    await store.aclose()
    engine, store = await _engine(tmp_path)
    assert await engine.recover() == 1
    assert await engine.recover() == 0  # already built
    shard = engine.shard(SPEC, 0)
    assert shard.marks.producers.next_sequence(42) == 1
    engine.close()
    await store.aclose()
