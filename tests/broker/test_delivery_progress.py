"""A subscription writer's history loops end when the log gives nothing more: past
the readable tail, or where retention removed the records, they stop instead of
spinning."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.metrics import BrokerMetrics
from felix_broker.storage import FsyncMode, LogConfig, LogStore, Retention
from felix_broker.streams.delivery import SubscriptionWriter
from felix_broker.streams.engine import Engine
from felix_wire.features import Capabilities

SPEC = StreamSpec("t1", "default", "log", durable=True, shards=1)


async def test_history_fill_stops_when_the_log_gives_no_more(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path)}, cwd=tmp_path)
    assert config.durable_storage_dir is not None
    small = LogConfig(segment_bytes=256, index_interval_bytes=64, fsync_mode=FsyncMode.NONE)
    store = LogStore(config.durable_storage_dir, config=small)
    engine = Engine(StaticCatalog(streams=[SPEC], caches=[]), config, BrokerMetrics(), store)
    shard = engine.shard(SPEC, 0)
    for i in range(40):
        shard.append([f"record-{i:03}".encode() * 3], None, 1_000 + i)
    sub = engine.subscribe(shard, Capabilities())
    uni: Any = None  # the history reads never write
    writer = SubscriptionWriter(sub, uni, max_records=4, max_bytes=1 << 20)
    try:
        out: list[bytes] = []
        # Asked for more than the log holds: it stops at the tail.
        async with asyncio.timeout(5):
            reached = await writer._fill(out, 30, 50)
        assert reached == 40 and out
        # Retention removed the start: nothing to read there, no spin.
        log = shard.log
        assert log is not None
        assert log.apply_retention(Retention(max_age_us=0), now_us=10**9) > 0
        assert log.start_offset > 0
        out = []
        async with asyncio.timeout(5):
            filled = await writer._fill(out, 0, 10)
        assert filled == 0 and out == []
    finally:
        engine.close()
        await store.aclose()
