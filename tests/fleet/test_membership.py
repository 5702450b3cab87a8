"""A broker's membership against a real etcd: registration under its lease, incarnations,
a lost lease fencing what it leads, and re-registration."""

from __future__ import annotations

import pytest

from felix_broker.fleet.membership import NodeIdInUseError
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace, decode_member
from tests.fleet.support import PREFIX, eventually, node

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
