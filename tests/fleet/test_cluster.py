"""Three fleet members over real QUIC (client and peer listeners, mutual TLS): what a
broker that does not lead a shard does with each request type (docs/architecture.md).

Every shard is led by node-a unless a test says otherwise; clients talk to node-b.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from felix_broker.fleet.peer import PeerDialer, PeerTls
from felix_broker.fleet.routing import AssignmentState
from felix_transport import generate_ca
from felix_wire.binary import AckStatus, BinaryAckMode, PublishAckFrame, PublishBatchFrame
from felix_wire.features import Feature
from felix_wire.flags import Flag
from felix_wire.fleet import (
    ForwardAck,
    ForwardPublish,
    ForwardPublishOk,
    ForwardRefused,
)
from felix_wire.messages import (
    AckMode,
    CacheGet,
    CacheOk,
    CachePut,
    CacheValue,
    CacheWatch,
    CounterAdd,
    CounterGet,
    CounterValue,
    Error,
    EventStreamHello,
    GroupDescribe,
    GroupPoll,
    NotLeader,
    OffsetForTime,
    Publish,
    PublishBatch,
    PublishError,
    PublishOk,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    StartOffset,
    StreamRead,
    Subscribe,
    Subscribed,
    Topology,
    TopologyView,
)

from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, WireClient, token
from .harness import Fleet, all_shards, running_fleet, stream_shards

pytestmark = pytest.mark.timeout(60)

NO_REDIRECT = OFFICIAL_FEATURES & ~int(Feature.FEATURE_REDIRECT)


def frame(stream: str, *payloads: bytes, **kw: object) -> PublishBatchFrame:
    return PublishBatchFrame(
        tenant_id=TENANT, namespace=NS, stream=stream, payloads=list(payloads), **kw
    )


async def subscribe_on(fleet: Fleet, node: str, stream: str, shard: int = 0, **kw: object):  # type: ignore[no-untyped-def]
    client = await WireClient.connect(fleet.entry(node))
    control = await client.session()
    await control.send(
        Subscribe(tenant_id=TENANT, namespace=NS, stream=stream, shard=shard, **kw)  # type: ignore[arg-type]
    )
    answer = await control.recv()
    assert isinstance(answer, Subscribed), answer
    events = await client.event_stream()
    assert await events.recv() == EventStreamHello(subscription_id=answer.subscription_id)
    return client, events


async def payloads_of(events, count: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    got: list[bytes] = []
    while len(got) < count:
        got.extend((await events.recv()).payloads)
    return got


async def test_a_fleet_member_advertises_topology_redirect_and_shard_moved(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        client = await WireClient.connect(fleet.entry("node-b"))
        control = await client.session()
        assert client.server_features & Feature.FEATURE_TOPOLOGY
        assert client.server_features & Feature.FEATURE_REDIRECT
        assert client.server_features & Feature.FEATURE_SHARD_MOVED
        await control.send(Topology())
        view = await control.recv()
        assert isinstance(view, TopologyView)
        assert [b.node_id for b in view.brokers] == ["node-a", "node-b", "node-c"]
        assert view.brokers[0].addr == f"127.0.0.1:{fleet.brokers['node-a'].quic_port}"
        client.close()


async def test_binary_publishes_through_a_non_owner_land_once_on_the_owner(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=5)
        sub, events = await subscribe_on(fleet, "node-a", "orders")
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        await pub.send(frame("orders", b"plain"))  # 0x0001: never answered
        await pub.send(frame("orders", b"keyed", key=b"k"))
        await pub.nothing()
        await pub.send(frame("orders", b"acked", request_id=7, ack_mode=BinaryAckMode.PER_MESSAGE))
        owner_addr = f"127.0.0.1:{fleet.brokers['node-a'].quic_port}"
        assert await pub.recv() == PublishAckFrame(
            status=AckStatus.OK,
            request_id=7,
            message="",
            node_id="node-a",
            addr=owner_addr,
            generation=5,
        )
        # A client that did not offer the owner hint gets the plain ack.
        plain = await client.session(flags=0x1FFF & ~int(Flag.BINARY_PUBLISH_ACK_OWNER))
        await plain.send(
            frame("orders", b"batch", request_id=8, ack_mode=BinaryAckMode.PER_BATCH, key=b"")
        )
        assert await plain.recv() == PublishAckFrame(status=AckStatus.OK, request_id=8, message="")
        assert await payloads_of(events, 4) == [b"plain", b"keyed", b"acked", b"batch"]
        await events.nothing()  # each once
        client.close()
        sub.close()


async def test_json_publishes_through_a_non_owner_every_ack_mode(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        sub, events = await subscribe_on(fleet, "node-a", "orders")
        client = await WireClient.connect(fleet.entry("node-c"))
        pub = await client.session()
        base = {"tenant_id": TENANT, "namespace": NS, "stream": "orders"}
        await pub.send(Publish(**base, payload=b"one"))  # type: ignore[arg-type]
        await pub.send(Publish(**base, payload=b"two", request_id=1, ack=AckMode.PER_MESSAGE))  # type: ignore[arg-type]
        await pub.send(
            PublishBatch(**base, payloads=[b"3", b"4"], request_id=2, ack=AckMode.PER_BATCH)
        )  # type: ignore[arg-type]
        # Pipelined answers come back in order, and JSON never carries an owner.
        assert await pub.recv() == PublishOk(request_id=1)
        assert await pub.recv() == PublishOk(request_id=2)
        await pub.send(Publish(**base, payload=b"x", ack=AckMode.PER_MESSAGE))  # type: ignore[arg-type]
        refusal = await pub.recv()
        assert isinstance(refusal, Error) and refusal.code == "invalid_request"
        assert await payloads_of(events, 4) == [b"one", b"two", b"3", b"4"]
        await events.nothing()
        client.close()
        sub.close()


async def test_forwarded_acks_after_the_write_carry_the_owners_offset(tmp_path: Path) -> None:
    async with running_fleet(tmp_path, ack_on_commit=True) as fleet:
        fleet.assign_all("node-a", generation=2)
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        offsets = []
        for i in range(3):
            await pub.send(
                frame(
                    "log", b"r%d" % i, request_id=i + 1, ack_mode=BinaryAckMode.PER_BATCH, key=b"x"
                )
            )
            ack = await pub.recv()
            assert isinstance(ack, PublishAckFrame) and ack.status == AckStatus.OK, ack
            assert ack.node_id == "node-a" and ack.generation == 2
            offsets.append(ack.offset)
        assert offsets == [0, 1, 2]
        client.close()


async def test_cache_and_counter_ops_are_forwarded_to_the_keys_owner(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        via_b = await WireClient.connect(fleet.entry("node-b"))
        via_c = await WireClient.connect(fleet.entry("node-c"))
        key = {"tenant_id": TENANT, "namespace": NS, "cache": "c"}
        put = await via_b.request(CachePut(**key, key="k1", value=b"v1", request_id=1))  # type: ignore[arg-type]
        assert put == CacheOk(request_id=1)
        got = await via_c.request(CacheGet(**key, key="k1", request_id=2))  # type: ignore[arg-type]
        assert isinstance(got, CacheValue) and got.value == b"v1" and got.request_id == 2
        direct = await (await WireClient.connect(fleet.entry("node-a"))).request(
            CacheGet(**key, key="k1", request_id=2)  # type: ignore[arg-type]
        )
        assert direct == got  # byte for byte what the owner answers itself
        added = await via_b.request(CounterAdd(**key, key="n", delta=5, request_id=3))  # type: ignore[arg-type]
        assert isinstance(added, CounterValue) and added.value == 5
        value = await via_c.request(CounterGet(**key, key="n", request_id=4))  # type: ignore[arg-type]
        assert isinstance(value, CounterValue) and value.value == 5
        via_b.close()
        via_c.close()


@pytest.mark.parametrize(
    "request_",
    [
        Subscribe(tenant_id=TENANT, namespace=NS, stream="log", shard=1),
        StreamRead(tenant_id=TENANT, namespace=NS, stream="log", shard=1, from_=0, request_id=1),
        OffsetForTime(
            tenant_id=TENANT, namespace=NS, stream="log", shard=1, at_micros=0, request_id=1
        ),
        GroupPoll(
            tenant_id=TENANT,
            namespace=NS,
            stream="log",
            shard=1,
            group="g",
            max_records=1,
            request_id=1,
        ),
    ],
    ids=lambda r: type(r).__name__,
)
async def test_leader_served_requests_are_redirected_with_the_generation(
    tmp_path: Path, request_: object
) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        fleet.assign(stream_shards("log", 2)[1:], "node-c", generation=9)
        client = await WireClient.connect(fleet.entry("node-b"))
        answer = await client.request(request_)  # type: ignore[arg-type]
        owner_addr = f"127.0.0.1:{fleet.brokers['node-c'].quic_port}"
        assert answer == NotLeader(node_id="node-c", addr=owner_addr, generation=9)
        # Without FEATURE_REDIRECT: an error with code not_leader (class redirect).
        answer = await client.request(request_, features=NO_REDIRECT)  # type: ignore[arg-type]
        assert isinstance(answer, Error) and answer.code == "not_leader"
        assert answer.retry == "redirect" and "node-c" in answer.message
        # The owner serves it.
        owner = await WireClient.connect(fleet.entry("node-c"))
        served = await owner.request(request_)  # type: ignore[arg-type]
        assert not isinstance(served, NotLeader | Error), served
        client.close()
        owner.close()


@pytest.mark.parametrize("group", ["../etc", "a/b", "", "g*", "x" * 129], ids=repr)
async def test_a_hostile_group_name_is_refused_by_every_broker_alike(
    tmp_path: Path, group: str
) -> None:
    # A group name is checked before the request is routed: a non-owner refuses it
    # invalid_request as the owner does, never redirects it (A.3: nothing a client
    # sees depends on which broker it reached).
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        key = {"tenant_id": TENANT, "namespace": NS, "stream": "log", "shard": 0, "group": group}
        for node in ("node-b", "node-a"):
            client = await WireClient.connect(fleet.entry(node))
            for request in (
                GroupPoll(**key, max_records=1, request_id=1),  # type: ignore[arg-type]
                GroupDescribe(**key, request_id=2),  # type: ignore[arg-type]
            ):
                answer = await client.request(request)
                assert isinstance(answer, Error), (node, answer)
                assert answer.code == "invalid_request", (node, answer)
                assert "invalid group name" in answer.message
            client.close()


async def test_the_owner_verifies_the_forwarded_token_again(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=3)
        owner = fleet.brokers["node-a"]
        # A fleet peer (mutual TLS, its own certificate) forwarding credentials the
        # owner must refuse: forged, and valid but without stream.publish.
        ca_pem = fleet.brokers["node-b"].fleet.tls.ca_pem  # type: ignore[union-attr]
        dialer = PeerDialer(fleet.brokers["node-b"].fleet.tls)  # type: ignore[union-attr]
        forged = token(fleet.entry("node-b"))[:-4] + "AAAA"
        reader = token(fleet.entry("node-b"), perms=[f"stream.subscribe:stream:{TENANT}/*"])
        for credential in (forged, reader, "not a jwt"):
            answer = await dialer.request(
                "node-a",
                owner.peer_addr,
                ForwardPublish(
                    request_id=1,
                    token=credential,
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    shard=0,
                    generation=3,
                    payloads=[b"x"],
                    ack=ForwardAck.WRITTEN,
                ),
            )
            assert isinstance(answer, ForwardRefused) and answer.refusal.error is not None, answer
            assert answer.refusal.error.code == "forbidden"
        good = ForwardPublish(
            request_id=2,
            token=token(fleet.entry("node-b")),
            tenant_id=TENANT,
            namespace=NS,
            stream="orders",
            shard=0,
            generation=3,
            payloads=[b"x"],
            ack=ForwardAck.WRITTEN,
        )
        assert isinstance(await dialer.request("node-a", owner.peer_addr, good), ForwardPublishOk)
        await dialer.close()
        assert ca_pem


async def test_a_peer_whose_hello_does_not_match_its_certificate_is_refused(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        tls = fleet.brokers["node-b"].fleet.tls  # type: ignore[union-attr]
        liar = PeerDialer(PeerTls("node-c", tls.chain_pem, tls.key_pem, tls.ca_pem))
        from felix_broker.fleet.peer import PeerProtocolError

        with pytest.raises(PeerProtocolError, match="hello refused"):
            await liar.request(
                "node-a",
                fleet.brokers["node-a"].peer_addr,
                ForwardPublish(
                    request_id=1,
                    token="t",
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    shard=0,
                    generation=1,
                    payloads=[b"x"],
                    ack=ForwardAck.ENQUEUED,
                ),
            )
        await liar.close()
        # A certificate from another CA does not get through the handshake.
        stranger = PeerDialer(PeerTls.issue(generate_ca("elsewhere"), "node-b"))
        from felix_broker.fleet.peer import PeerUnavailableError

        with pytest.raises((PeerUnavailableError, PeerProtocolError)):
            await stranger.request(
                "node-a",
                fleet.brokers["node-a"].peer_addr,
                ForwardPublish(
                    request_id=1,
                    token="t",
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="orders",
                    shard=0,
                    generation=1,
                    payloads=[b"x"],
                    ack=ForwardAck.ENQUEUED,
                ),
            )
        await stranger.close()


async def test_generation_mismatch_both_ways(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        shards = stream_shards("orders", 1)
        fleet.assign(shards, "node-a", generation=4)
        sub, events = await subscribe_on(fleet, "node-a", "orders")
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        shard = shards[0]
        routes = dict(fleet.views["node-b"].snapshot.routes)
        # node-b is behind (generation 2): the owner says not_leader naming itself at 4,
        # node-b follows the hint once and the publish lands.
        routes[shard] = fleet.routes[shard].__class__(2, AssignmentState.ACTIVE, leader="node-a")
        fleet.set_view("node-b", routes=routes)
        await pub.send(frame("orders", b"behind", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await pub.recv()
        assert isinstance(ack, PublishAckFrame) and ack.status == AckStatus.OK, ack
        assert ack.generation == 4
        # node-b is ahead (generation 6): the owner must not write: stale route.
        routes[shard] = fleet.routes[shard].__class__(6, AssignmentState.ACTIVE, leader="node-a")
        fleet.set_view("node-b", routes=routes)
        await pub.send(frame("orders", b"ahead", request_id=2, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await pub.recv()
        assert isinstance(ack, PublishAckFrame) and ack.status == AckStatus.ERROR, ack
        assert ack.code == 5 and ack.reason == "stale"  # shard_unavailable / stale
        assert await payloads_of(events, 1) == [b"behind"]
        await events.nothing()
        client.close()
        sub.close()


async def test_a_shard_without_a_serving_leader_is_shard_unavailable(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        client = await WireClient.connect(fleet.entry("node-b"))
        json = await client.session()
        base = {"tenant_id": TENANT, "namespace": NS, "stream": "orders"}
        # The owner's lease is gone: it is no member any more.
        fleet.down.add("node-a")
        fleet.publish()
        await json.send(Publish(**base, payload=b"x", request_id=1, ack=AckMode.PER_MESSAGE))  # type: ignore[arg-type]
        answer = await json.recv()
        assert isinstance(answer, PublishError) and answer.code == "shard_unavailable"
        assert answer.detail is not None and answer.detail.reason == "owner_unavailable"
        # A durable shard kept for its returning leader, marked unavailable.
        fleet.down.clear()
        fleet.assign(
            stream_shards("orders", 1),
            "node-a",
            7,
            AssignmentState.UNAVAILABLE,
            "owner_unavailable",
        )
        got = await client.request(
            Subscribe(tenant_id=TENANT, namespace=NS, stream="orders", start=StartOffset(offset=0))
        )
        assert isinstance(got, Error) and got.code == "shard_unavailable"
        assert got.detail is not None and got.detail.reason == "owner_unavailable"
        owners = await client.request(
            ShardOwners(tenant_id=TENANT, namespace=NS, name="orders", kind="stream", request_id=3)
        )
        assert owners == ShardOwnersView(
            owners=[ShardOwner(shard=0, generation=7, unavailable="owner_unavailable")],
            request_id=3,
        )
        client.close()


async def test_a_forward_to_an_owner_that_stopped_answering_is_refused_retryably(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        await fleet.brokers["node-a"].stop()
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        await pub.send(frame("orders", b"x", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await pub.recv(timeout=30)
        assert isinstance(ack, PublishAckFrame) and ack.status == AckStatus.ERROR
        assert ack.code in (5, 9)  # shard_unavailable (never sent) or unacknowledged
        client.close()


async def test_shard_owners_name_the_leaders_and_generations(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=1)
        shards = stream_shards("wide", 4)
        fleet.assign(shards[1:2], "node-b", generation=3)
        fleet.assign(shards[2:3], "node-c", generation=4)
        answers = []
        for node in ("node-a", "node-b", "node-c"):
            client = await WireClient.connect(fleet.entry(node))
            answers.append(
                await client.request(
                    ShardOwners(
                        tenant_id=TENANT, namespace=NS, name="wide", kind="stream", request_id=1
                    )
                )
            )
            client.close()
        assert answers[0] == answers[1] == answers[2]  # the same whichever broker answers
        view = answers[0]
        assert isinstance(view, ShardOwnersView)
        assert [(o.node_id, o.generation) for o in view.owners] == [
            ("node-a", 1),
            ("node-b", 3),
            ("node-c", 4),
            ("node-a", 1),
        ]
        assert len(all_shards()) > 4
        await asyncio.sleep(0)


async def test_an_owner_that_no_longer_leads_names_the_leader_and_never_forwards(
    tmp_path: Path,
) -> None:
    async with running_fleet(tmp_path) as fleet:
        shards = stream_shards("orders", 1)
        fleet.assign(shards, "node-c", generation=6)
        sub, events = await subscribe_on(fleet, "node-c", "orders")
        # node-b is behind: it still thinks node-a leads at generation 5.
        routes = dict(fleet.views["node-b"].snapshot.routes)
        routes[shards[0]] = fleet.routes[shards[0]].__class__(
            5, AssignmentState.ACTIVE, leader="node-a"
        )
        fleet.set_view("node-b", routes=routes)
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        await pub.send(frame("orders", b"moved", request_id=1, ack_mode=BinaryAckMode.PER_BATCH))
        ack = await pub.recv()
        # node-a answered not_leader(node-c, 6) instead of forwarding onward; node-b
        # followed the newer hint once.
        assert isinstance(ack, PublishAckFrame) and ack.status == AckStatus.OK, ack
        assert (ack.node_id, ack.generation) == ("node-c", 6)
        assert await payloads_of(events, 1) == [b"moved"]
        opened = fleet.brokers["node-a"].engine._shards  # type: ignore[union-attr]
        assert not [key for key in opened if key[2] == "orders"]  # node-a wrote nothing
        client.close()
        sub.close()


async def test_a_cache_watch_is_redirected_like_a_subscribe(tmp_path: Path) -> None:
    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=2)
        client = await WireClient.connect(fleet.entry("node-b"))
        watch = await client.request(
            CacheWatch(tenant_id=TENANT, namespace=NS, cache="c", key="k", subscription_id=1)
        )
        owner_addr = f"127.0.0.1:{fleet.brokers['node-a'].quic_port}"
        assert watch == NotLeader(node_id="node-a", addr=owner_addr, generation=2)
        client.close()


async def test_cache_keys_are_forwarded_to_their_own_shards_owner(tmp_path: Path) -> None:
    from felix_broker.fleet.routing import ShardId, ShardKind
    from felix_wire.routing import shard_for_key

    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a")
        fleet.assign([ShardId(ShardKind.CACHE, TENANT, NS, "c", 1)], "node-c", generation=3)
        keys = {shard_for_key(k.encode(), 2, "modulo"): k for k in ("k0", "k1", "k2", "k3", "k4")}
        assert set(keys) == {0, 1}
        via_b = await WireClient.connect(fleet.entry("node-b"))
        base = {"tenant_id": TENANT, "namespace": NS, "cache": "c"}
        for shard, key in keys.items():
            put = CachePut(**base, key=key, value=b"s%d" % shard, request_id=1)  # type: ignore[arg-type]
            assert await via_b.request(put) == CacheOk(request_id=1)
        # Each key lives on its shard's owner only.
        for node, shard in (("node-a", 0), ("node-c", 1)):
            owner = await WireClient.connect(fleet.entry(node))
            got = await owner.request(CacheGet(**base, key=keys[shard], request_id=2))  # type: ignore[arg-type]
            assert isinstance(got, CacheValue) and got.value == b"s%d" % shard
            owner.close()
        other = fleet.brokers["node-a"].cache
        assert other is not None
        local = other._shards[(TENANT, NS, "c", 1)]  # node-a's copy of a shard it does not lead
        assert local.get(keys[1], int(time.time() * 1000)) is None
        via_b.close()


async def test_conditional_idempotent_and_atomic_writes_are_never_forwarded(
    tmp_path: Path,
) -> None:
    from felix_wire.messages import (
        Commit,
        NotLeaderHint,
        PublishError,
        PublishIdempotent,
        PublishIf,
        PublishRefusal,
        PublishRefused,
    )

    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=8)
        owner_addr = f"127.0.0.1:{fleet.brokers['node-a'].quic_port}"
        client = await WireClient.connect(fleet.entry("node-b"))
        base = {"tenant_id": TENANT, "namespace": NS, "stream": "log"}
        conditional = PublishIf(**base, payloads=[b"x"], key=b"k", expected_offset=0, request_id=1)  # type: ignore[arg-type]
        commit = Commit(**base, entity_key=b"e", event=b"x", request_id=2)  # type: ignore[arg-type]
        for request in (conditional, commit):
            assert await client.request(request) == NotLeader(
                node_id="node-a", addr=owner_addr, generation=8
            )
            refused = await client.request(request, features=NO_REDIRECT)
            assert isinstance(refused, Error) and refused.code == "not_leader"
        hint = PublishRefusal(not_leader=NotLeaderHint(node_id="node-a", addr=owner_addr))
        idempotent = PublishIdempotent(
            **base,  # type: ignore[arg-type]
            payloads=[b"x"],
            key=b"k",
            request_id=3,
            producer_id=1,
            sequence=0,
        )
        answer = await client.request(idempotent)
        assert isinstance(answer, PublishRefused) and answer.request_id == 3
        assert answer.reason == hint
        # A client that did not offer the producer feature does not decode
        # publish_refused: the same refusal as a publish_error coded not_leader.
        without = OFFICIAL_FEATURES & ~int(Feature.FEATURE_IDEMPOTENT_PRODUCER)
        answer = await client.request(idempotent, features=without)
        assert isinstance(answer, PublishError) and answer.request_id == 3, answer
        assert (answer.code, answer.retry) == ("not_leader", "redirect")
        assert "node-a" in answer.message and owner_addr in answer.message
        binary = await client.session()
        await binary.send(
            frame(
                "log",
                b"x",
                key=b"k",
                request_id=4,
                ack_mode=BinaryAckMode.PER_BATCH,
                producer_id=1,
                sequence=1,
            )
        )
        answer = await binary.recv()
        assert isinstance(answer, PublishRefused) and answer.request_id == 4
        assert answer.reason == hint
        # Nothing reached the owner's log.
        owner = await WireClient.connect(fleet.entry("node-a"))
        read = await owner.request(StreamRead(**base, shard=0, from_=0, request_id=5))  # type: ignore[arg-type]
        read_1 = await owner.request(StreamRead(**base, shard=1, from_=0, request_id=6))  # type: ignore[arg-type]
        assert read.records == [] and read_1.records == []  # type: ignore[union-attr]
        client.close()
        owner.close()


async def test_shard_inspect_answers_from_this_brokers_own_view(tmp_path: Path) -> None:
    from felix_wire.messages import ShardInspect, ShardInspectInfo, SubscriptionsList

    async with running_fleet(tmp_path) as fleet:
        fleet.assign_all("node-a", generation=4)
        operator = {"perms": ["node.view:cluster:*"]}
        inspect = ShardInspect(
            tenant_id=TENANT, namespace=NS, name="log", kind="stream", shard=0, request_id=1
        )
        views = {}
        for node in ("node-a", "node-b"):
            client = await WireClient.connect(fleet.entry(node))
            info = await client.request(inspect, **operator)
            assert isinstance(info, ShardInspectInfo), info
            views[node] = info.view
            listed = await client.request(SubscriptionsList(request_id=2), **operator)
            assert listed.node_id == node  # type: ignore[union-attr]
            client.close()
        owner, other = views["node-a"], views["node-b"]
        assert (owner.node_id, owner.role, owner.phase, owner.serving) == (
            "node-a",
            "leader",
            "active",
            True,
        )
        assert owner.generation == 4 and owner.assignment is not None
        assert owner.assignment.leader == "node-a"
        assert (other.node_id, other.role, other.serving, other.generation) == (
            "node-b",
            "none",
            False,
            4,
        )
        assert other.assignment is not None and other.assignment.leader == "node-a"


@pytest.mark.parametrize("ack_on_commit", [False, True])
async def test_pipelined_forwards_land_in_the_order_the_stream_sent_them(
    tmp_path: Path, ack_on_commit: bool
) -> None:
    async with running_fleet(tmp_path, ack_on_commit=ack_on_commit) as fleet:
        fleet.assign_all("node-a")
        sub, events = await subscribe_on(fleet, "node-a", "orders")
        client = await WireClient.connect(fleet.entry("node-b"))
        pub = await client.session()
        expected = []
        for i in range(300):
            payload = b"%03d" % i
            expected.append(payload)
            if i % 3:
                await pub.send(frame("orders", payload))  # unacked, pipelined too
            else:
                await pub.send(
                    frame("orders", payload, request_id=i + 1, ack_mode=BinaryAckMode.PER_BATCH)
                )
        acks = [await pub.recv(timeout=20) for _ in range(100)]
        assert [a.request_id for a in acks] == [i + 1 for i in range(0, 300, 3)]  # type: ignore[union-attr]
        assert all(a.status == AckStatus.OK for a in acks)  # type: ignore[union-attr]
        assert await payloads_of(events, 300) == expected
        client.close()
        sub.close()
