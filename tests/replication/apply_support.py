"""Replicas of one guarded stream shard, each a stream applier over real files without a
network: the harness of the guarded and idempotent apply tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.groups.service import GroupService
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.apply import (
    StreamApplier,
    encode_batch,
    replicated_commit,
)
from felix_broker.replication.core import Entry
from felix_broker.replication.groups import GroupStreamApplier
from felix_broker.storage import LogConfig, LogStore
from felix_broker.storage.format import CommitMark
from felix_broker.streams.engine import Engine
from felix_common.catalog import Consistency
from felix_wire.fleet import ReplicatedBatch

SPEC = StreamSpec(
    "t1", "ns", "quorum", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)


def batch(*payloads: bytes, expected: int | None = None, commit: CommitMark | None = None) -> Entry:
    replicated = ReplicatedBatch(
        timestamp_us=1,
        payloads=list(payloads),
        expected_offset=expected,
        commit=replicated_commit(commit) if commit is not None else None,
    )
    return Entry(1, encode_batch(replicated))


class Replica:
    def __init__(self, engine: Engine, groups: GroupService) -> None:
        self.engine = engine
        self.stream_applier = StreamApplier(engine.shard(SPEC, 0))
        self.applier = GroupStreamApplier(self.stream_applier, groups)

    def stream(self) -> list[bytes]:
        log = self.engine.shard(SPEC, 0).log
        assert log is not None
        return [r.payload for r in log.read(0, max_records=100, max_bytes=1 << 20)]


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[list[Replica]]:
    """Two replicas' real stream logs and group services (a leader and a follower)."""
    made: list[tuple[LogStore, Engine, GroupService]] = []
    out: list[Replica] = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            config = load_config(environ={}, overrides={"data_dir": str(folder)}, cwd=folder)
            assert config.durable_storage_dir is not None
            catalog = StaticCatalog(streams=[SPEC], caches=[])
            store = LogStore(config.durable_storage_dir, config=LogConfig())
            await store.recover_all()
            store.start()
            engine = Engine(catalog, config, BrokerMetrics(), store)
            groups = GroupService(config=config, catalog=catalog, engine=engine)
            await groups.start()
            made.append((store, engine, groups))
            out.append(Replica(engine, groups))
        yield out
    finally:
        for store, engine, groups in made:
            await groups.close()
            engine.close()
            await store.aclose()
