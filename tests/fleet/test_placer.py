"""The placer against a real etcd: one holder at a time, and only the holder's writes land."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Assignment, Keyspace, decode_assignment, encode_record
from felix_controlplane.placement import Write, shard_specs
from felix_wire.fleet import AssignmentState as RecordState
from tests.fleet.support import PREFIX, eventually, node, placer

pytestmark = pytest.mark.timeout(60)

SPECS = shard_specs([("t", "ns", "orders", 6, False)], [("t", "ns", "kv", 2)])


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_two_placers_started_at_once_only_one_ever_writes(etcd_server: EtcdProcess) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    a, b = node(ep, "a"), node(ep, "b")
    await a.start()
    await b.start()
    writes: list[tuple[str, Write, int]] = []
    placers = [placer(ep, "p1", SPECS), placer(ep, "p2", SPECS)]
    for p in placers:
        p.add_listener(lambda w, rev, p=p: writes.append((p.holder_id, w, rev)))
    tasks = [asyncio.create_task(p.run()) for p in placers]
    try:
        await eventually(lambda: len(writes) >= len(SPECS), what="every shard placed")
        await asyncio.sleep(0.5)  # both keep running: the loser must still not write
        holders = {holder for holder, _, _ in writes}
        assert len(holders) == 1
        assert sum(p.holding for p in placers) == 1
        revisions = [rev for _, _, rev in writes]
        assert revisions == sorted(set(revisions))  # generations are never reused
        first = next(p for p in placers if p.holding)
        # The holder goes away: the other takes over, and only from then on writes.
        await cancel(tasks[placers.index(first)])
        other = next(p for p in placers if p is not first)
        await eventually(lambda: other.holding, what="the other placer takes over")
        count = len(writes)
        await b.stop()  # b's shards: in-memory stream shards re-placed, cache shards kept
        await eventually(lambda: len(writes) > count, what="the new holder re-places")
        assert {holder for holder, _, _ in writes[count:]} == {other.holder_id}
    finally:
        for task in tasks:
            await cancel(task)
        await a.stop()
        await b.stop()


async def test_a_placer_that_lost_its_key_cannot_write(etcd_server: EtcdProcess) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    keys = Keyspace(PREFIX)
    probe = EtcdClient([ep])
    a = node(ep, "a")
    await a.start()
    p = placer(ep, "p1", SPECS)
    task = asyncio.create_task(p.run())
    try:
        await eventually(lambda: p.writes >= len(SPECS), what="placed")
        token = p._token
        # Someone else takes the key (as after our lease expired and another won).
        await probe.delete(keys.placer)
        await probe.put(keys.placer, b"intruder")
        shard = SPECS[0].shard
        held = await probe.get(keys.assignment(shard))
        assert held is not None
        stale = Write(
            shard, Assignment(replicas=[], state=RecordState.ACTIVE, leader="zz"), held.mod_revision
        )
        p._token = token  # as if it had not noticed yet
        assert not await p._write(stale)
        after = await probe.get(keys.assignment(shard))
        assert after is not None and decode_assignment(after.value).leader == "a"
        await eventually(lambda: not p.holding, what="the placer notices")
    finally:
        await cancel(task)
        await a.stop()
        await probe.close()


async def test_a_write_planned_from_an_old_generation_is_refused(etcd_server: EtcdProcess) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    keys = Keyspace(PREFIX)
    probe = EtcdClient([ep])
    a = node(ep, "a")
    await a.start()
    p = placer(ep, "p1", SPECS)
    task = asyncio.create_task(p.run())
    try:
        await eventually(lambda: p.writes >= len(SPECS), what="placed")
        shard = SPECS[0].shard
        held = await probe.get(keys.assignment(shard))
        assert held is not None
        await probe.put(
            keys.assignment(shard),
            encode_record(Assignment(replicas=[], state=RecordState.ACTIVE, leader="a")),
        )
        old = Write(
            shard, Assignment(replicas=[], state=RecordState.ACTIVE, leader="q"), held.mod_revision
        )
        assert not await p._write(old)  # another write came in between
        assert not await p._write(Write(shard, old.record, 0))  # the key exists already
    finally:
        await cancel(task)
        await a.stop()
        await probe.close()
