"""felix_client against three real fleet members (tests/fleet/harness.py: in-process
brokers over real QUIC sharing one routing snapshot, no etcd): discovery from one
seed, redirected subscriptions keeping their start, publishes through every broker
landing once, and the owner hint of forwarded acks (both QUIC stacks)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import felix_client
from felix_client import ClientConfig

from ..fleet.harness import Fleet, running_fleet, stream_shards
from ..support.wire import NS, TENANT, token

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(params=["qh3", "aioquic"])
async def fleet(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    monkeypatch.setenv("FELIX_QUIC_IMPL", request.param)
    async with running_fleet(tmp_path) as running:
        running.assign_all("node-a", generation=3)
        yield running


def addr_of(fleet: Fleet, node: str) -> str:
    return f"127.0.0.1:{fleet.brokers[node].quic_port}"


async def connect(fleet: Fleet, node: str, tmp: Path, **options: Any) -> felix_client.Client:
    # Each member has its own development CA: the client trusts all three.
    bundle = tmp / "fleet-cas.pem"
    bundle.write_bytes(b"".join(Path(b.ca_path).read_bytes() for b in fleet.brokers.values()))
    return await felix_client.connect(
        addr_of(fleet, node),
        tenant_id=TENANT,
        token=token(fleet.entry(node)),
        namespace=NS,
        ca_file=bundle,
        config=ClientConfig(request_timeout=10.0),
        **options,
    )


async def test_the_client_learns_the_fleet_from_one_seed(fleet: Fleet, tmp_path: Path) -> None:
    client = await connect(fleet, "node-b", tmp_path)
    try:
        assert client.brokers[0] == addr_of(fleet, "node-b")
        assert sorted(client.brokers) == sorted(addr_of(fleet, n) for n in fleet.brokers)
    finally:
        await client.aclose()


async def test_a_redirected_subscription_keeps_its_start_offset(
    fleet: Fleet, tmp_path: Path
) -> None:
    client = await connect(fleet, "node-b", tmp_path)
    try:
        for i in range(6):  # forwarded to node-a, the owner
            await client.publish("log", b"r%d" % i)
        sub = await client.subscribe("log", shard=0, start=2)  # node-b redirects
        events = [await sub.next(timeout=10) for _ in range(4)]
        assert [(e.offset, e.payload) for e in events] == [(i, b"r%d" % i) for i in range(2, 6)]
        assert sub.start_offset == 2
        await sub.aclose()
        owner = client._fleet.owner(("stream", NS, "log", 0))
        assert owner is not None and owner.node_id == "node-a" and owner.generation == 3
    finally:
        await client.aclose()


async def test_publishes_through_every_broker_land_once(fleet: Fleet, tmp_path: Path) -> None:
    sent: list[bytes] = []
    for node in ("node-a", "node-b", "node-c"):
        client = await connect(fleet, node, tmp_path)
        try:
            for i in range(5):
                payload = f"{node}-{i}".encode()
                await client.publish("log", payload)
                sent.append(payload)
        finally:
            await client.aclose()
    reader = await connect(fleet, "node-c", tmp_path)
    try:
        pages = [p async for p in reader.stream_read("log", shard=0, start=0)]
        stored = [r.payload for page in pages for r in page.records]
        assert stored == sent  # each once, in the order acknowledged
    finally:
        await reader.aclose()


async def test_the_owner_hint_sends_the_next_batch_straight_to_the_owner_and_follows_a_move(
    fleet: Fleet, tmp_path: Path
) -> None:
    client = await connect(fleet, "node-b", tmp_path)
    ref = ("stream", NS, "orders", 0)
    try:
        assert client._fleet.owner(ref) is None
        await client.publish("orders", b"first")  # forwarded; the ack names node-a
        owner = client._fleet.owner(ref)
        assert owner is not None
        assert (owner.node_id, owner.addr, owner.generation) == (
            "node-a",
            addr_of(fleet, "node-a"),
            3,
        )
        await client.publish("orders", b"second")  # straight to node-a: no new hint
        assert addr_of(fleet, "node-a") in client._owner_pools
        # The shard moves to node-c: node-a now forwards, and its ack names node-c.
        fleet.assign(stream_shards("orders", 1), "node-c", 4)
        await client.publish("orders", b"third")
        moved = client._fleet.owner(ref)
        assert moved is not None and (moved.node_id, moved.generation) == ("node-c", 4)
        await client.publish("orders", b"fourth")
        assert addr_of(fleet, "node-c") in client._owner_pools
    finally:
        await client.aclose()


async def test_group_and_read_requests_through_a_non_owner_follow_the_redirect(
    fleet: Fleet, tmp_path: Path
) -> None:
    client = await connect(fleet, "node-c", tmp_path)
    try:
        await client.publish("log", b"x")
        pages = [p async for p in client.stream_read("log", shard=0, start=0)]
        assert [r.payload for page in pages for r in page.records] == [b"x"]
        assert await client.offset_for_time("log", 0, shard=0) == 0
        group = client.group("log", "workers")
        claimed = await group.poll(0, max_records=10, wait=2.0)
        assert [r.payload for r in claimed] == [b"x"]
        await group.ack(0, claimed[0].offset)
        assert (await group.describe(0)).committed == 1
    finally:
        await client.aclose()


async def test_a_cache_watch_through_a_non_owner_follows_the_redirect(
    fleet: Fleet, tmp_path: Path
) -> None:
    client = await connect(fleet, "node-b", tmp_path)
    try:
        cache = client.cache("c")
        async with cache.watch(key="k") as watch:
            await cache.put("k", b"v1")  # forwarded to the owner
            change = await watch.next(timeout=10)
            assert (change.key, change.value) == ("k", b"v1")
        assert await cache.get("k") == b"v1"
    finally:
        await client.aclose()


async def test_keyed_publish_if_commit_and_state_get_go_to_the_keys_shard(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Each shard of `log` has its own owner and generation: shard 0 node-a at 9,
    shard 1 node-c at 4. A keyed conditional publish, a commit and a state read are
    about the key's shard: they follow that shard's owner, never shard 0's (whose
    higher generation would make node-c's redirect look stale)."""
    log0, log1 = stream_shards("log", 2)
    fleet.assign([log0], "node-a", 9)
    fleet.assign([log1], "node-c", 4)
    client = await connect(fleet, "node-b", tmp_path)
    try:
        assert await client.publish_if("log", b"zero", expected_offset=0) == 0  # shard 0
        held = client._fleet.owner(("stream", NS, "log", 0))
        assert held is not None and (held.node_id, held.generation) == ("node-a", 9)
        on_shard_1 = [
            k for k in (b"k%d" % i for i in range(64)) if await client.shard_for_key("log", k) == 1
        ]
        key = on_shard_1.pop()
        assert await client.publish_if("log", b"one", expected_offset=0, key=key) == 0
        assert await client.commit("log", key, b"event", changes={"n": b"1"}) == 1
        state = await client.state_get("log", key, "n")
        assert (state.value, state.version) == (b"1", 1)
        owner = client._fleet.owner(("stream", NS, "log", 1))
        assert owner is not None and (owner.node_id, owner.generation) == ("node-c", 4)
        held = client._fleet.owner(("stream", NS, "log", 0))  # shard 0's hint untouched
        assert held is not None and (held.node_id, held.generation) == ("node-a", 9)
        pages = [p async for p in client.stream_read("log", shard=1, start=0)]
        assert [r.payload for page in pages for r in page.records] == [b"one", b"event"]
    finally:
        await client.aclose()


async def test_an_idempotent_producer_through_a_non_owner_follows_not_leader(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A non-owner refuses idempotent batches (publish_refused{not_leader}, never
    # forwarded): the producer resends them, under the same sequences, to the leader
    # named, and each lands once (the producer used to end on the first refusal).
    client = await connect(fleet, "node-b", tmp_path)
    try:
        async with client.producer("log", timeout=10.0) as producer:
            offsets = [await producer.publish(b"i%d" % i, key=b"k") for i in range(5)]
        assert offsets == sorted(offsets) and len(set(offsets)) == 5, offsets
        shard = await client.shard_for_key("log", b"k")
        pages = client.stream_read("log", start=0, shard=shard, max_records=100)
        payloads = [r.payload async for page in pages for r in page.records]
        assert payloads == [b"i%d" % i for i in range(5)]
    finally:
        await client.aclose()
