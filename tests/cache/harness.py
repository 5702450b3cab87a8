"""An in-process broker with a cache service for the cache tests; the raw client that
talks to it is tests/support/wire.py."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.cache.service import CacheLimits
from felix_broker.catalog import CacheSpec, StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_wire.features import Feature

from ..support.wire import NS, OFFICIAL_FEATURES, TENANT

CACHE = "c"
MULTI = "multi"
WITHOUT_CONDITIONAL = OFFICIAL_FEATURES & ~int(Feature.FEATURE_CACHE_CONDITIONAL)


def catalog() -> StaticCatalog:
    return StaticCatalog(
        streams=[StreamSpec(TENANT, NS, "orders", shards=1)],
        caches=[CacheSpec(TENANT, NS, CACHE, shards=1), CacheSpec(TENANT, NS, MULTI, shards=4)],
    )


def broker_config(tmp: Path, *, durable: bool, **overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(tmp / "data"),
    }
    # Durable storage is on by default; an empty value turns it off.
    settings["durable_storage_dir"] = str(tmp / "durable") if durable else ""
    settings.update(overrides)
    return dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog())


@asynccontextmanager
async def cache_broker(
    tmp: Path,
    *,
    durable: bool = True,
    limits: CacheLimits | None = None,
    topology: str = "one",
    **overrides: Any,
) -> AsyncIterator[Broker]:
    """A broker with caches; with a fleet `topology` (tests/fleet/harness.py TOPOLOGIES)
    the broker a client reaches in a fleet of three: the owner of every shard, or one
    that leads none, so cache ops are forwarded and watches redirected."""
    if topology != "one":
        from ..fleet.harness import reached_in_fleet

        if not durable:
            overrides["durable_storage_dir"] = ""
        async with reached_in_fleet(
            tmp, topology, catalog(), cache_limits=limits, **overrides
        ) as entry:
            yield entry  # type: ignore[misc]
        return
    broker = Broker(broker_config(tmp, durable=durable, **overrides), cache_limits=limits)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()
