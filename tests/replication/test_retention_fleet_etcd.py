"""Retention cuts of a Quorum stream end to end (decision quorum-retention-cut): a real
etcd, the control plane and three brokers (real QUIC, mutual TLS between peers, real
storage). A cut the leader appends to the shard's replication log is applied by every
replica at its place in the log: every replica forgets the idle producer there, a
follower restarted afterwards keeps the cut (its table rebuilt from its log and trimmed
at it), and the producer's next batch is refused `unknown_producer` by the fleet while
its replicas' stream logs stay the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_broker.app import Broker
from felix_broker.replication.apply import StreamApplier
from felix_broker.streams.engine import now_micros
from felix_common.etcd_process import EtcdProcess
from felix_wire.messages import PublishOk, PublishRefused
from tests.support.etcd import etcd_server

from ..fleet.harness import NODES
from ..fleet.support import eventually
from .support import (
    SHARD,
    SPEC,
    ask,
    batch,
    producer,
    running_quorum_fleet,
    same_everywhere,
    session,
    start_broker_with_faults,
)

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(180)


def applier(broker: Broker) -> StreamApplier | None:
    replication = broker.replication
    return replication.stream_applier(SHARD) if replication is not None else None


def forgot(broker: Broker, pid: int, cut: int) -> bool:
    stream = applier(broker)
    if stream is None or stream.retained_from != cut:
        return False
    assert broker.engine is not None
    return broker.engine.shard(SPEC, 0).marks.producers.next_sequence(pid) is None


async def test_a_replicated_retention_cut_forgets_a_producer_on_every_replica(
    etcd_server: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_quorum_fleet(tmp_path, etcd_server.endpoint) as (
        fleet,
        leader,
        _generation,
    ):
        follower = next(n for n in NODES if n != leader)
        client, s = await session(fleet, leader)
        pid = await producer(s, 1)
        assert await ask(s, batch(pid, 0, [b"p0"], 2)) == PublishOk(request_id=2, offset=0)
        other = await producer(s, 3)
        assert await ask(s, batch(other, 0, [b"o0"], 4)) == PublishOk(request_id=4, offset=1)
        await same_everywhere(fleet, [b"p0", b"o0"])
        # The cut at 1 (`pid`'s batches all lie below it, `other`'s do not), as if every
        # replica's retention policy would now start its log there (a real one needs
        # sealed segments: tests/replication/test_retention_cut.py): only the leader
        # appends it.
        for broker in fleet.brokers.values():
            stream = applier(broker)
            assert stream is not None
            monkeypatch.setattr(
                stream, "proposed_cut", lambda _now, st=stream: 1 if st.retained_from < 1 else None
            )
        for node, broker in fleet.brokers.items():
            replication = broker.replication
            assert replication is not None
            if node != leader:
                assert await replication.propose_cuts(now_micros()) == 0
        replication = fleet.brokers[leader].replication
        assert replication is not None
        assert await replication.propose_cuts(now_micros()) == 1
        for broker in fleet.brokers.values():
            await eventually(
                lambda b=broker: forgot(b, pid, 1), within=30, what="every replica cut at 1"
            )
        await fleet.brokers[follower].stop()
        again = await start_broker_with_faults(
            tmp_path, follower, etcd_server.endpoint, fleet.fleet_ca, fleet.issuer
        )
        fleet.brokers[follower] = again
        try:
            assert await replication.propose_cuts(now_micros()) == 0  # applied: none again
            await eventually(
                lambda: forgot(again, pid, 1), within=30, what="the restarted follower kept it"
            )
            assert again.engine is not None
            table = again.engine.shard(SPEC, 0).marks.producers
            assert table.next_sequence(other) == 1
            refused = await ask(s, batch(pid, 1, [b"p1"], 5))
            assert isinstance(refused, PublishRefused) and refused.reason == "unknown_producer"
            assert await ask(s, batch(other, 1, [b"o1"], 6)) == PublishOk(request_id=6, offset=2)
            client.close()
            await same_everywhere(fleet, [b"p0", b"o0", b"o1"])
        finally:
            await again.stop()
