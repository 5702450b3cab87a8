"""A `Leader`-consistency stream with replication factor 3 on a real fleet: etcd, the
control plane, three brokers each its own OS process (`chaos.fleet.ChaosFleet`).

- publishes to the leader are acknowledged at its own disk and shipped: the
  followers' stream logs equal the leader's record for record, and `shard_inspect`
  at the leader shows both followers with their lag;
- the leader is cut off from its followers (the test-mode `peer_blocked` fault) and
  takes more writes it acknowledges but never ships, then is killed with SIGKILL:
  the most caught-up follower is promoted and serves, keeping every shipped record
  (the Leader promise: what was acknowledged and never shipped may be lost);
- the old leader restarts: it cuts the records it never shipped from its stream
  log (`Log.truncate`) and follows, so in the end all three logs are the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from chaos.fleet import NAMESPACE, TENANT, BrokerProcess, ChaosFleet, Layout
from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.chaos.faults import Faults
from felix_broker.storage import FsyncMode, Log, LogConfig
from felix_client import Client, ClientConfig, connect
from felix_client.errors import BrokerError, ClientError

pytestmark = pytest.mark.timeout(300)

STREAM = "leader3"
_ERRORS = (BrokerError, ClientError, TimeoutError, OSError)


class LeaderLayout(Layout):
    def catalog(self) -> StaticCatalog:
        base = super().catalog()
        extra = StreamSpec(TENANT, NAMESPACE, STREAM, durable=True, replication_factor=3)
        return StaticCatalog(streams=[*base.streams(), extra], caches=list(base.caches()))


async def client_for(fleet: ChaosFleet, addrs: list[str]) -> Client:
    return await connect(
        addrs,
        tenant_id=TENANT,
        token=fleet.operator_token,
        namespace=NAMESPACE,
        ca_file=fleet.ca_file,
        config=ClientConfig(ack_on_commit=True, request_timeout=5.0),
    )


async def leader_addr(fleet: ChaosFleet, addrs: list[str], not_: str | None = None) -> str:
    client = await client_for(fleet, addrs)
    try:
        for _ in range(300):
            owners = await client.shard_owners(STREAM)
            addr = next((o.addr for o in owners if o.shard == 0 and o.addr), None)
            if addr and addr != not_:
                return addr
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()
    raise AssertionError(f"{STREAM} has no leader (other than {not_})")


async def eventually(
    check: Callable[[], Awaitable[object]], what: str, within: float = 60.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = None
    while loop.time() < deadline:
        try:
            last = await check()
        except _ERRORS as exc:
            last = exc
        if last is True:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} within {within:.0f} s (last: {last!r})")


def stream_log(broker: BrokerProcess) -> list[tuple[int, int, bytes]]:
    """(offset, append time, payload) of the shard's stream log, read from the disk
    of a stopped broker."""
    folders = [p for p in (broker.data_dir / "durable").rglob("*") if p.is_dir()]
    folder = next(p for p in folders if p.name == "0" and STREAM in p.parent.name)
    log = Log.open(folder, LogConfig(fsync_mode=FsyncMode.NONE))
    try:
        records = log.read(0, max_records=100_000, max_bytes=1 << 30)
        return [(r.offset, r.timestamp_us, r.payload) for r in records]
    finally:
        log.close()


async def test_leader_rf3_ships_fails_over_and_the_old_leader_cuts_what_it_never_shipped(
    tmp_path: Path,
) -> None:
    fleet = await ChaosFleet.start(tmp_path / "fleet", LeaderLayout())
    closed = False
    try:
        await fleet.wait_ready(120.0)
        old_addr = await leader_addr(fleet, fleet.addrs)
        old = fleet.by_addr(old_addr)
        assert old is not None
        followers = [b for b in fleet.brokers if b is not old]
        client = await client_for(fleet, [old_addr])
        try:
            shipped = [b"shipped-%d" % i for i in range(20)]
            for payload in shipped:
                await client.publish(STREAM, payload)

            async def caught_up() -> object:
                seen = await client.shard_inspect(STREAM)
                views = sorted((v.node_id, v.lag, v.matched) for v in seen.replicas or [])
                tail = seen.replication_tail
                ok = (
                    seen.replica_state == "leader"
                    and [v[0] for v in views] == sorted(f.node_id for f in followers)
                    and all(lag == 0 and matched == tail for _n, lag, matched in views)
                )
                return ok or views

            await eventually(caught_up, "both followers hold the leader's log (lag 0)")

            # Replication cut off: acknowledged at the leader, never shipped.
            old.set_fault(Faults(peer_blocked=frozenset(f.node_id for f in followers)))
            await asyncio.sleep(0.5)
            unshipped = [b"unshipped-%d" % i for i in range(10)]
            for payload in unshipped:
                await client.publish(STREAM, payload)

            async def lagging() -> object:
                seen = await client.shard_inspect(STREAM)
                lags = [v.lag or 0 for v in seen.replicas or []]
                return (len(lags) == 2 and min(lags) >= len(unshipped)) or lags

            await eventually(lagging, "shard_inspect shows the followers' lag", within=10.0)
        finally:
            await client.aclose()

        await old.kill()
        assert await fleet.wait_successor(STREAM, old_addr, 90.0), "no successor serves"
        others = [b.addr for b in followers]
        new_addr = await leader_addr(fleet, others, not_=old_addr)
        new = fleet.by_addr(new_addr)
        assert new is not None
        client = await client_for(fleet, [new_addr])
        try:
            after = [b"after-%d" % i for i in range(5)]
            for payload in after:
                await client.publish(STREAM, payload)
            old.set_fault(Faults())
            await old.start()

            async def rejoined() -> object:
                seen = await client.shard_inspect(STREAM)
                views = {v.node_id: (v.lag, v.matched) for v in seen.replicas or []}
                back = views.get(old.node_id)
                return (back is not None and back[0] == 0) or views

            await eventually(rejoined, "the old leader follows the new one (lag 0)", 90.0)
        finally:
            await client.aclose()
        await fleet.close()
        closed = True
        logs = {b.node_id: stream_log(b) for b in fleet.brokers}
        leader_log = logs[new.node_id]
        payloads = [payload for _o, _t, payload in leader_log]
        assert payloads == shipped + after  # the unshipped suffix is gone everywhere
        for node, log in logs.items():
            assert log == leader_log, f"{node}'s stream log differs from the leader's"
    finally:
        if not closed:
            await fleet.close()
