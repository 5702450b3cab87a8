"""Idempotent publishes on a Quorum stream are replicated (decision
quorum-idempotent-producers): the leader answers them from the verdict every replica
reaches at apply time: accepted, a resend with the original offset, a gap refused
typed; never `internal` and never a traceback in its log. Three in-process fleet
members over real QUIC and real storage (the etcd fleet: test_idempotent_fleet_etcd.py)."""

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
    PublishIdempotent,
    PublishOk,
    PublishRefusal,
    PublishRefused,
    SequenceGap,
)

from ..fleet.harness import NODES, running_fleet
from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, WireClient

pytestmark = pytest.mark.timeout(90)

QUORUM = StreamSpec(
    TENANT, NS, "q", durable=True, replication_factor=3, consistency=Consistency.QUORUM
)
SHARD = ShardId(ShardKind.STREAM, TENANT, NS, "q", 0)
GUARDED = OFFICIAL_FEATURES | int(Feature.FEATURE_IDEMPOTENT_PRODUCER)


async def test_idempotent_publishes_on_a_quorum_stream_are_answered_from_the_log(
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

        def numbered(sequence: int, records: list[bytes], rid: int) -> PublishIdempotent:
            return PublishIdempotent(
                **scope,  # type: ignore[arg-type]
                payloads=records,
                producer_id=7,
                sequence=sequence,
                request_id=rid,
            )

        with caplog.at_level(logging.ERROR):
            first = await client.request(numbered(0, [b"a"], 3), features=GUARDED)
            assert first == PublishOk(request_id=3, offset=0), first
            again = await client.request(numbered(0, [b"a"], 4), features=GUARDED)
            assert again == PublishOk(request_id=4, offset=0), again
            gap = await client.request(numbered(3, [b"c"], 5), features=GUARDED)
            assert isinstance(gap, PublishRefused), gap
            assert gap.reason == PublishRefusal(sequence_gap=SequenceGap(expected=1))
            second = await client.request(numbered(1, [b"b"], 6), features=GUARDED)
            assert second == PublishOk(request_id=6, offset=1), second
        assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        client.close()
        for node in NODES:
            engine = fleet.brokers[node].engine
            assert engine is not None
            shard = engine.shard(QUORUM, 0)
            async with asyncio.timeout(20):
                while shard.next_offset != 2:  # every replica applies the committed batches
                    await asyncio.sleep(0.02)
            assert shard.marks.producers.next_sequence(7) == 2
