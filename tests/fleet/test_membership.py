"""A broker's membership against a real etcd: registration under its lease, incarnations,
a lost lease fencing what it leads, and re-registration."""

from __future__ import annotations

import asyncio

import pytest

from felix_broker.fleet.membership import NodeIdInUseError
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace, decode_member
from tests.fleet.support import PREFIX, eventually, node
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(60)


def endpoint(etcd: EtcdProcess) -> tuple[str, int]:
    return ("127.0.0.1", etcd.client_port)


async def test_a_member_registers_under_its_lease_and_leaves_on_stop(
    etcd_server: EtcdProcess,
) -> None:
    keys = Keyspace(PREFIX)
    probe = EtcdClient([endpoint(etcd_server)])
    a = node(endpoint(etcd_server), "a")
    await a.start()
    try:
        kv = await probe.get(keys.member("a"))
        assert kv is not None and kv.lease == a.membership.lease_id != 0
        record = decode_member(kv.value)
        assert record.node_id == "a" and record.incarnation > 0
        first = record.incarnation
        await eventually(lambda: "a" in a.view.snapshot.members, what="a sees itself")
    finally:
        await a.stop()
    assert await probe.get(keys.member("a")) is None  # revoked, not left to expire
    b = node(endpoint(etcd_server), "a")
    await b.start()
    try:
        kv = await probe.get(keys.member("a"))
        assert kv is not None and decode_member(kv.value).incarnation > first
    finally:
        await b.stop()
        await probe.close()


async def test_a_second_broker_with_a_live_node_id_is_refused(etcd_server: EtcdProcess) -> None:
    a = node(endpoint(etcd_server), "a", ttl_ms=1000)
    await a.start()
    twin = node(endpoint(etcd_server), "a", ttl_ms=1000)
    try:
        with pytest.raises(NodeIdInUseError):
            await twin.start()
        assert a.membership.held
    finally:
        await twin.stop()
        await a.stop()


async def test_a_restart_waits_out_the_old_lease_and_the_old_process_stays_fenced(
    etcd_server: EtcdProcess,
) -> None:
    """The old process is cut off from etcd (as if hung); its replacement with the same node
    id registers once the old lease expired, and the old one, back, never serves again."""
    proxy = TcpProxy("127.0.0.1", etcd_server.client_port)
    await proxy.start()
    old = node(proxy.endpoint, "a", ttl_ms=1000)
    await old.start()
    new = node(endpoint(etcd_server), "a", ttl_ms=1000)
    try:
        proxy.cut()
        await new.start()  # waits for the old lease to expire, within its bound
        assert new.membership.held and new.membership.incarnation > old.membership.incarnation
        assert old.view.fenced and not old.membership.held
        proxy.heal()
        await asyncio.sleep(2.0)  # the old one keeps trying to rejoin: the key is taken
        assert not old.membership.held and old.view.fenced
        assert new.membership.held
    finally:
        await old.stop()
        await new.stop()
        await proxy.close()
