"""A Quorum stream (RF 3) on three in-process fleet members: real brokers, real QUIC
for clients and peers (mutual TLS), real storage; the routing snapshot is set by the
test (tests/fleet/harness.py: no etcd, the assignment watcher is what feeds real ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from felix_wire.messages import Error, PublishError, PublishOk, StreamRead

from ..fleet.harness import Fleet, running_fleet
from ..support.waits import until
from ..support.wire import NS, TENANT, WireClient
from .in_process import CATALOG, QUORUM, SHARD, driver, lead, opened, publish

pytestmark = pytest.mark.timeout(90)


def stream_records(fleet: Fleet, node: str) -> list[tuple[int, int, bytes]]:
    engine = fleet.brokers[node].engine
    assert engine is not None
    log = engine.shard(QUORUM, 0).log
    assert log is not None
    return [
        (r.offset, r.timestamp_us, r.payload)
        for r in log.read(0, max_records=1000, max_bytes=1 << 24)
    ]


async def test_a_quorum_publish_is_acked_once_a_follower_holds_it_and_logs_match(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        pub = await client.session()
        for i in range(5):
            await pub.send(publish(b"m%d" % i, i + 1))
            answer = await pub.recv()
            assert isinstance(answer, PublishOk) and answer.request_id == i + 1
            # Acked: the leader and at least one follower hold it on disk.
            holders = [
                n
                for n in ("node-b", "node-c")
                # its first i + 2 records (a generation start, then publishes) fsynced
                if driver(fleet, n).replica.synced_length >= i + 2
            ]
            assert holders, f"publish {i} acked before any follower held it"
        want = stream_records(fleet, "node-a")
        assert [p for _, _, p in want] == [b"m%d" % i for i in range(5)]
        await until(lambda: all(stream_records(fleet, n) == want for n in ("node-b", "node-c")))
        client.close()


async def test_no_reachable_follower_answers_quorum_timeout_outcome_unknown(
    tmp_path: Path,
) -> None:
    async with running_fleet(
        tmp_path, with_catalog=CATALOG, publish_quorum_timeout_ms=800
    ) as fleet:
        await opened(fleet, "node-a", 1)
        for node in ("node-b", "node-c"):
            listener = fleet.brokers[node].peer_listener
            assert listener is not None
            await listener.close()
        client = await WireClient.connect(fleet.entry("node-a"))
        pub = await client.session()
        await pub.send(publish(b"alone", 1))
        async with asyncio.timeout(10):
            answer = await pub.recv()
        assert isinstance(answer, PublishError), answer
        assert (answer.code, answer.retry) == ("quorum_timeout", "outcome_unknown")
        assert "did not reach a majority within 0.8s" in answer.message
        assert stream_records(fleet, "node-a") == []  # readers stop at the mark
        client.close()


async def test_the_leaders_loss_promotes_a_successor_holding_every_acked_record(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        await opened(fleet, "node-a", 1)
        client = await WireClient.connect(fleet.entry("node-a"))
        pub = await client.session()
        for i in range(6):
            await pub.send(publish(b"k%d" % i, i + 1))
            assert isinstance(await pub.recv(), PublishOk)
        client.close()
        await fleet.brokers["node-a"].stop()  # the leader's process ends
        fleet.down.add("node-a")
        await opened(fleet, "node-b", 2)
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        await pub.send(publish(b"after", 1))
        assert isinstance(await pub.recv(), PublishOk)
        payloads = [p for _, _, p in stream_records(fleet, "node-b")]
        assert payloads == [*(b"k%d" % i for i in range(6)), b"after"]
        client.close()


async def test_a_named_leader_without_a_majority_is_settling_for_readers_and_writers(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path, with_catalog=CATALOG) as fleet:
        fleet.down.update({"node-b", "node-c"})  # no peer address: its fence reaches nobody
        lead(fleet, "node-a", 1)
        replication = fleet.brokers["node-a"].replication
        assert replication is not None
        await until(lambda: replication.driver(SHARD) is not None)
        client = await WireClient.connect(fleet.entry("node-a"))
        read = await client.request(
            StreamRead(tenant_id=TENANT, namespace=NS, stream="q", shard=0, from_=0, request_id=1)
        )
        assert isinstance(read, Error), read
        assert (read.code, read.detail and read.detail.reason) == ("shard_unavailable", "not_ready")
        pub = await client.session()
        await pub.send(publish(b"early", 1))
        answer = await pub.recv()
        assert isinstance(answer, PublishError), answer
        assert (answer.code, answer.retry) == ("shard_unavailable", "retry")
        assert stream_records(fleet, "node-a") == []
        client.close()
