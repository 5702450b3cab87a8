"""An in-process broker for the broker tests (real QUIC, TLS and tokens); the raw client
that talks to it is tests/support/wire.py."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from felix_broker.app import Broker
from felix_broker.catalog import CacheSpec, Routing, StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_transport import default_impl
from felix_wire.messages import (
    EventStreamHello,
    Subscribe,
    Subscribed,
)

from ..support.wire import NS, TENANT, WireClient


def catalog() -> StaticCatalog:
    return StaticCatalog(
        streams=[
            StreamSpec(TENANT, NS, "orders", shards=1),
            StreamSpec(TENANT, NS, "wide", shards=4, routing=Routing.JUMP_HASH),
            StreamSpec(TENANT, NS, "mod", shards=3),
            StreamSpec("t2", NS, "other", shards=1),
            StreamSpec(TENANT, NS, "log", durable=True, shards=2),
        ],
        caches=[CacheSpec(TENANT, NS, "c", shards=2)],
    )


@asynccontextmanager
async def running_broker(
    tmp: Path, *, topology: str = "one", **overrides: Any
) -> AsyncIterator[Broker]:
    """A broker; with a fleet `topology` (tests/fleet/harness.py TOPOLOGIES) the broker a
    client reaches in a fleet of three: the owner of every shard, or a member that leads
    none, so requests are forwarded or redirected."""
    if topology != "one":
        from ..fleet.harness import reached_in_fleet

        async with reached_in_fleet(tmp, topology, catalog(), **overrides) as entry:
            yield entry  # type: ignore[misc]
        return
    settings: dict[str, Any] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(tmp),
        "durable_storage_dir": str(tmp / "durable"),
        # FELIX_QUIC_IMPL picks the stack for the broker and (via the transport's
        # default) for the test clients, so the suite runs on either backend.
        "quic_impl": default_impl(),
    }
    settings.update(overrides)
    config = dataclasses.replace(load_config(environ={}, overrides=settings), catalog=catalog())
    broker = Broker(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


__all__ = ["catalog", "running_broker"]


async def subscribe(
    client: WireClient, stream: str = "orders", **kw: object
) -> tuple[Subscribed, object]:
    control, _ = await client.authed(**kw.pop("auth", {}))  # type: ignore[arg-type]
    await control.send(Subscribe(tenant_id=TENANT, namespace=NS, stream=stream, **kw))
    answer = await control.recv()
    assert isinstance(answer, Subscribed), answer
    events = await client.event_stream()
    hello = await events.recv()
    assert hello == EventStreamHello(subscription_id=answer.subscription_id)
    return answer, events
