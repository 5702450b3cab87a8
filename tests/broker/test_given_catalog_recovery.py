"""Start recovers every shard of the catalog the services were given (the control
plane's live catalog), not the config file's: the shards are open, and listed in
/backup/offsets, before the broker says it is ready."""

from __future__ import annotations

from pathlib import Path

from felix_broker.cache.service import CacheService
from felix_broker.cache.shard import now_ms
from felix_broker.catalog import CacheSpec, StaticCatalog, StreamSpec
from felix_broker.config import BrokerConfig, load_config
from felix_broker.groups.service import GroupService
from felix_broker.metrics import BrokerMetrics
from felix_broker.storage import LogConfig, LogStore
from felix_broker.streams.engine import Engine

CACHE = CacheSpec("t9", "live", "kv", shards=2)
STREAM = StreamSpec("t9", "live", "jobs", durable=True, shards=2)
# A catalog the config file knows nothing of, as a control plane would send it.
LIVE = StaticCatalog(streams=[STREAM], caches=[CACHE])


def _config(tmp: Path) -> BrokerConfig:
    config = load_config(environ={}, overrides={"data_dir": str(tmp)}, cwd=tmp)
    assert config.catalog.cache("t9", "live", "kv") is None
    return config


async def test_cache_start_recovers_the_given_catalogs_shards(tmp_path: Path) -> None:
    config = _config(tmp_path)
    first = CacheService(config=config, catalog=LIVE, metrics=BrokerMetrics())
    await first.start()
    shard = first.shard(CACHE, 1)
    entry = shard.put("k", b"v", None, now_ms())
    await shard.wait_durable(entry.offset)
    await first.close()

    again = CacheService(config=config, catalog=LIVE, metrics=BrokerMetrics())
    await again.start()
    try:
        offsets = again.committed_offsets()
        assert set(offsets) == {("t9", "live", "kv", 0), ("t9", "live", "kv", 1)}
        assert offsets[("t9", "live", "kv", 1)] == entry.offset + 1
    finally:
        await again.close()


async def test_group_start_replays_the_given_catalogs_group_logs(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert config.durable_storage_dir is not None
    for run in range(2):
        store = LogStore(config.durable_storage_dir, config=LogConfig())
        await store.recover_all()
        store.start()
        engine = Engine(LIVE, config, BrokerMetrics(), store)
        groups = GroupService(config=config, catalog=LIVE, engine=engine)
        await groups.start()
        try:
            if run == 0:
                assert groups.committed_offsets() == {}
                groups._shard_groups(STREAM, 1)  # a first group request opens the log
            else:
                assert set(groups.committed_offsets()) == {("t9", "live", "jobs", 1)}
        finally:
            await groups.close()
            engine.close()
            await store.aclose()
