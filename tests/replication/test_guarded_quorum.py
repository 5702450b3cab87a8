"""Idempotent publishes on a Quorum stream are not replicated yet (their producer
table is not): the leader refuses them before anything is queued, with a typed
`invalid_request` naming why, never `internal` and never a traceback in its log.
(Conditional publishes and commits are replicated: test_guarded_fleet_etcd.py.)
Three in-process fleet members over real QUIC and real storage."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.fleet.routing import AssignmentState, Route, ShardId, ShardKind
from felix_common.catalog import Consistency
from felix_wire.features import Feature
from felix_wire.messages import (
    Error,
    PublishError,
    PublishIdempotent,
    PublishRefused,
)

from ..fleet.harness import NODES, running_fleet
from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, WireClient

pytestmark = pytest.mark.timeout(90)

QUORUM = StreamSpec(
    TENANT, NS, "q", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, "q", 0)
GUARDED = OFFICIAL_FEATURES | int(Feature.FEATURE_IDEMPOTENT_PRODUCER)


async def test_idempotent_publishes_on_a_quorum_stream_are_refused_typed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = StaticCatalog(streams=[QUORUM], caches=[])
    async with running_fleet(tmp_path, with_catalog=catalog) as fleet:
        fleet.routes[SHARD] = Route(1, AssignmentState.ACTIVE, leader="node-a", replicas=NODES)
        fleet.publish()
        replication = fleet.brokers["node-a"].replication
        assert replication is not None

        def serving() -> bool:
            driver = replication.driver(SHARD)
            return driver is not None and driver.refusal() is None

        async with asyncio.timeout(20):
            while not serving():
                await asyncio.sleep(0.02)
        client = await WireClient.connect(fleet.entry("node-a"))
        scope = {"tenant_id": TENANT, "namespace": NS, "stream": "q"}
        requests = [
            PublishIdempotent(
                **scope,  # type: ignore[arg-type]
                payloads=[b"a"],
                producer_id=7,
                sequence=0,
                request_id=3,
            ),
        ]
        with caplog.at_level(logging.ERROR):
            for request in requests:
                answer = await client.request(request, features=GUARDED)  # type: ignore[arg-type]
                assert isinstance(answer, Error | PublishError | PublishRefused), answer
                text = str(answer)
                assert "invalid_request" in text, answer
                assert "not replicated" in text, answer
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        client.close()
