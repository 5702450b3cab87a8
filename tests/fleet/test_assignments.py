"""The assignment watcher against a real etcd: one read, then a watch from the read's
revision + 1; every change applied once, in generation order; compaction re-reads;
etcd stopped and restarted under a running broker."""

from __future__ import annotations

import asyncio

import pytest

from felix_broker.fleet.assignments import AssignmentWatcher
from felix_broker.fleet.routing import AssignmentState, RoutingSnapshot, ShardId, ShardKind
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient, EtcdUnavailableError, WatchEvent
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Assignment, Keyspace, encode_record
from felix_wire.fleet import AssignmentState as RecordState
from tests.fleet.support import PREFIX, Applied, eventually, node
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(90)

KEYS = Keyspace(PREFIX)
S = [ShardId(ShardKind.STREAM, "t", "ns", "orders", i) for i in range(3)]


def active(leader: str) -> bytes:
    return encode_record(Assignment(replicas=[], state=RecordState.ACTIVE, leader=leader))


async def put_retrying(client: EtcdClient, key: str, value: bytes) -> int:
    """A write right after etcd restarted: the channel may first report the old failure."""
    for _ in range(50):
        try:
            return await client.put(key, value)
        except EtcdUnavailableError:
            await asyncio.sleep(0.1)
    raise AssertionError("etcd did not come back")


async def test_changes_apply_once_and_in_generation_order(etcd_server: EtcdProcess) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    writer = EtcdClient([ep])
    generations = [await writer.put(KEYS.assignment(S[0]), active("a"))]
    view = FleetView(RoutingSnapshot("a"))
    applied = Applied("a")
    view.add_listener(applied)
    watcher = AssignmentWatcher(EtcdClient([ep]), KEYS, view)
    await watcher.start()
    try:
        assert view.snapshot.leads(S[0])
        assert view.snapshot.route(S[0]).generation == generations[0]  # type: ignore[union-attr]
        for leader in ("b", "a", "b", "a"):
            generations.append(await writer.put(KEYS.assignment(S[0]), active(leader)))
        generations.append(await writer.put(KEYS.assignment(S[1]), active("a")))
        await eventually(lambda: view.revision >= generations[-1], what="watch caught up")
        route = view.snapshot.route(S[0])
        assert route is not None and route.generation == generations[-2] and route.leader == "a"
        # A late or repeated event (a re-watch, a read racing the watch) changes nothing.
        before = view.snapshot
        stale = WatchEvent("put", KEYS.assignment(S[0]), active("b"), generations[1])
        watcher.apply(stale)
        await watcher.catch_up()  # a read at the same revision: nothing new
        assert view.snapshot is before
        # A deleted assignment goes; its key made again comes back at a newer generation.
        await writer.delete(KEYS.assignment(S[1]))
        await eventually(lambda: view.snapshot.route(S[1]) is None, what="delete seen")
        again = await writer.put(KEYS.assignment(S[1]), active("a"))
        await eventually(lambda: view.snapshot.route(S[1]) is not None, what="re-created")
        assert view.snapshot.route(S[1]).generation == again  # type: ignore[union-attr]
    finally:
        await watcher.stop()
        await writer.close()
    applied.check_never_twice_nor_backwards()
    assert [g for s, g in applied.seen if s == S[0]] == generations[:5]


async def test_a_watch_behind_the_compaction_point_reads_again(etcd_server: EtcdProcess) -> None:
    ep = ("127.0.0.1", etcd_server.client_port)
    proxy = TcpProxy(*ep)
    await proxy.start()
    writer = EtcdClient([ep])
    await writer.put(KEYS.assignment(S[0]), active("a"))
    view = FleetView(RoutingSnapshot("a"))
    applied = Applied("a")
    view.add_listener(applied)
    watcher = AssignmentWatcher(EtcdClient([proxy.endpoint]), KEYS, view)
    await watcher.start()
    try:
        proxy.cut()  # the watch breaks; meanwhile etcd moves on and compacts
        last = 0
        for leader in ("b", "c", "a"):
            last = await writer.put(KEYS.assignment(S[0]), active(leader))
        await writer.put(KEYS.assignment(S[2]), active("c"))
        await writer.delete(KEYS.assignment(S[0]))
        await writer.put(KEYS.assignment(S[1]), active("b"))
        revision, _ = await writer.get_prefix(PREFIX + "/")
        await writer.compact(revision)
        assert watcher.reads == 1
        proxy.heal()
        await eventually(lambda: watcher.reads >= 2, within=15, what="a second read")
        await eventually(lambda: view.revision >= revision, what="caught up")
        snap = view.snapshot
        assert snap.route(S[0]) is None  # deleted while the watch was away
        assert snap.route(S[1]).leader == "b"  # type: ignore[union-attr]
        assert snap.route(S[2]).leader == "c"  # type: ignore[union-attr]
        assert last < revision
    finally:
        await watcher.stop()
        await writer.close()
        await proxy.close()
    applied.check_never_twice_nor_backwards()


async def test_etcd_stopped_and_restarted_under_a_running_broker(etcd_server: EtcdProcess) -> None:
    """Shorter than the lease: the broker keeps serving what it leads, and sees every
    assignment once. Longer: it fences, then rejoins with a new incarnation."""
    ep = ("127.0.0.1", etcd_server.client_port)
    writer = EtcdClient([ep])
    for shard in S:
        await writer.put(KEYS.assignment(shard), active("a"))
    # etcd's stop and start block this loop (by PID, waiting for the process), so the
    # lease must outlast them with room to spare on a loaded machine: 8 s (it stops
    # serving 6 s after its last keepalive).
    a = node(ep, "a", ttl_ms=8000)
    applied = Applied("a")
    a.view.add_listener(applied)
    await a.start()
    first = a.membership.incarnation
    try:
        assert all(a.view.snapshot.leads(s) for s in S)
        etcd_server.stop()
        served = 0
        for _ in range(20):  # 1 s of etcd being away, well inside the lease's margin
            await asyncio.sleep(0.05)
            served += all(a.view.snapshot.leads(s) for s in S)
        assert served == 20 and a.membership.held and not a.view.fenced
        etcd_server.start()
        gen = await put_retrying(writer, KEYS.assignment(S[0]), active("b"))
        await eventually(lambda: a.view.revision >= gen, within=15, what="watch resumed")
        assert not a.view.snapshot.leads(S[0]) and a.view.snapshot.leads(S[1])
        assert a.membership.losses == 0 and a.membership.incarnation == first

        etcd_server.stop()  # now longer than the lease: it must stop serving
        await eventually(lambda: a.view.fenced, within=15, what="fenced")
        assert not any(a.view.snapshot.leads(s) for s in S)
        await asyncio.sleep(0.5)
        etcd_server.start()
        await eventually(lambda: a.membership.held, within=20, what="rejoined")
        assert a.membership.incarnation > first
        assert a.view.snapshot.leads(S[1]) and a.view.snapshot.leads(S[2])
        assert a.view.snapshot.route(S[0]).state is AssignmentState.ACTIVE  # type: ignore[union-attr]
    finally:
        await a.stop()
        await writer.close()
    applied.check_never_twice_nor_backwards()
    assert len(applied.seen) == len(set(applied.seen)) == len(S) + 1


async def test_a_draining_broker_is_left_out_of_the_topology_list(
    etcd_server: EtcdProcess,
) -> None:
    from felix_common.fleet import Drain
    from felix_common.fleet import Member as MemberRecord

    ep = ("127.0.0.1", etcd_server.client_port)
    writer = EtcdClient([ep])
    for name in ("a", "b", "c"):
        member = MemberRecord(
            node_id=name,
            client_addr=f"127.0.0.1:{7000 + ord(name)}",
            peer_addr="p",
            features=[],
            incarnation=1,
        )
        await writer.put(KEYS.member(name), encode_record(member))
    # b drained by an operator before this broker starts: the first read sees it.
    await writer.put(KEYS.drain("b"), encode_record(Drain(requested_by="operator")))
    view = FleetView(RoutingSnapshot("a"))
    watcher = AssignmentWatcher(EtcdClient([ep]), KEYS, view)
    await watcher.start()

    def listed() -> list[str]:
        return [m.node_id for m in view.snapshot.routable_members()]

    try:
        assert listed() == ["a", "c"]
        # c asks for its own drain (shutdown) as well: the watch sees it.
        await writer.put(KEYS.drain_request("c"), encode_record(Drain(requested_by="c")))
        await eventually(lambda: listed() == ["a"], what="c's own drain seen")
        await writer.put(KEYS.drain("c"), encode_record(Drain(requested_by="operator")))
        await writer.delete(KEYS.drain_request("c"))  # still drained by the operator
        await writer.delete(KEYS.drain("b"))
        await eventually(lambda: listed() == ["a", "b"], what="b's drain cancelled")
        await writer.delete(KEYS.drain("c"))
        await eventually(lambda: listed() == ["a", "b", "c"], what="c's drain cancelled")
        assert view.snapshot.members.keys() == {"a", "b", "c"}  # redirects still know them
    finally:
        await watcher.stop()
        await writer.close()
