"""Consumer groups over real QUIC against an in-process broker (short timeouts by config)."""

from __future__ import annotations

import asyncio
import json
import platform
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from felix_broker.metrics import build_version
from felix_transport import default_impl
from felix_wire.codec import encode_frame
from felix_wire.features import Feature
from felix_wire.messages import (
    AuthOk,
    CacheOk,
    Error,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetterList,
    GroupDeadLetters,
    GroupDelete,
    GroupDeleted,
    GroupDescribe,
    GroupDiscard,
    GroupExtend,
    GroupExtended,
    GroupInfo,
    GroupNack,
    GroupPoll,
    GroupPosition,
    GroupRecords,
    GroupRedrive,
    GroupSeek,
    StartOffset,
)

from ..broker.harness import running_broker
from ..fleet.harness import THROUGH_LEADER
from ..support.wire import NS, OFFICIAL_FEATURES, TENANT, WireClient, token
from .session import GroupSession

pytestmark = pytest.mark.timeout(60)

BUILD_LABELS = {
    "version": build_version(),
    "python": platform.python_version(),
    "implementation": platform.python_implementation(),
}
SCOPE: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "stream": "log", "shard": 0}


async def session(broker: Any, **auth: Any) -> GroupSession:
    client = await WireClient.connect(broker)
    stream, answer = await client.authed(**auth)
    assert isinstance(answer, AuthOk), answer
    return GroupSession(stream, {**SCOPE, "group": "g"})


def stale(answer: Any, retry: str = "retry") -> bool:
    return isinstance(answer, Error) and answer.code == "stale_claim" and answer.retry == retry


async def test_groups_are_advertised_only_with_durable_storage(tmp_path: Path) -> None:
    wanted = (
        Feature.FEATURE_CONSUMER_GROUP
        | Feature.FEATURE_GROUP_DEAD_LETTERS
        | Feature.FEATURE_GROUP_ADMIN
        | Feature.FEATURE_GROUP_CLAIM_CONTROL
        | Feature.FEATURE_GROUP_CONSUMER
        | Feature.FEATURE_GROUP_SKIPPED
        | Feature.FEATURE_GROUP_PUBLISHER
    )
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        _, answer = await client.authed()
        assert isinstance(answer, AuthOk)
        assert answer.server_features & wanted == wanted
    async with running_broker(tmp_path / "mem", durable_storage_dir=None) as broker:
        assert broker.groups is None
        client = await WireClient.connect(broker)
        stream, answer = await client.authed()
        assert isinstance(answer, AuthOk)
        assert not answer.server_features & wanted
        await stream.send(GroupPoll(**SCOPE, group="g", max_records=1, request_id=1))
        assert not isinstance(await stream.recv(), GroupRecords)


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_poll_ack_and_the_contiguous_cursor(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b", b"c")
        records = await s.poll(10)
        assert [(r.offset, r.payload, r.attempts) for r in records] == [
            (0, b"a", 1),
            (1, b"b", 1),
            (2, b"c", 1),
        ]
        assert await s.poll(10) == []  # everything is claimed
        assert isinstance(await s.call(GroupAck, offset=1), CacheOk)
        info = await s.call(GroupDescribe)
        assert isinstance(info, GroupInfo)
        assert (info.committed, info.tail, info.in_flight, info.owed) == (0, 3, 2, 0)
        assert isinstance(await s.call(GroupAck, offset=0), CacheOk)
        info = await s.call(GroupDescribe)
        assert info.committed == 2 and info.in_flight == 1
        assert isinstance(await s.call(GroupAck, offset=0), CacheOk)  # duplicate: harmless
        answer = await s.call(GroupAck, offset=3)  # at the tail
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        await s.publish(b"d")
        assert stale(await s.call(GroupAck, offset=3))  # written after the state, not handed out
        metrics = broker.metrics.exposition().decode()
        assert "felix_group_records_claimed_total 3.0" in metrics
        assert 'felix_group_requests_total{outcome="ok",type="group_ack"} 3.0' in metrics
        assert 'felix_group_requests_total{outcome="stale_claim",type="group_ack"} 1.0' in metrics
        assert (
            'felix_group_requests_total{outcome="invalid_request",type="group_ack"} 1.0' in metrics
        )


async def test_the_acks_of_one_pass_share_one_group_log_write_and_are_durable_first(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, durable_fsync_mode="on_commit") as broker:
        s = await session(broker)
        await s.publish(*(b"r%d" % i for i in range(32)))
        records: list[Any] = []
        for _ in range(50):  # a publish is answered when queued: readable after the fsync
            records += await s.poll(32 - len(records), wait_ms=200)
            if len(records) == 32:
                break
        assert len(records) == 32
        assert broker.groups is not None
        (groups,) = broker.groups._shards.values()
        log = groups.log
        appends: list[int] = []
        real_append = log.append

        def counting_append(payloads: Any, **kw: Any) -> int:
            appends.append(len(payloads))
            return real_append(payloads, **kw)

        log.append = counting_append  # type: ignore[method-assign]
        first = s.rid + 1
        acks = [
            encode_frame(GroupAck(**SCOPE, group="g", offset=r.offset, request_id=s.next_id()))
            for r in records
        ]
        await s.stream.send(b"".join(acks))  # one write: the acks arrive together
        answered = set()
        for _ in records:
            answer = await s.stream.recv()
            assert isinstance(answer, CacheOk), answer
            # Answered only once the change is on disk and synced (on_commit).
            assert log.durable_offset == log.next_offset
            answered.add(answer.request_id)
        assert answered == set(range(first, first + 32))
        # One write per pass, not per ack (a pass per datagram at worst).
        assert sum(appends) == 32 and len(appends) <= 4, appends
        info = await s.call(GroupDescribe)
        assert isinstance(info, GroupInfo) and info.committed == 32


async def test_latency_histograms_see_requests_publishes_fsyncs_and_poll_to_ack(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, durable_fsync_mode="on_commit") as broker:
        s = await session(broker)
        await s.publish(b"a", b"b", b"c")
        records: list[Any] = []
        for _ in range(50):
            records += await s.poll(3 - len(records), wait_ms=200)
            if len(records) == 3:
                break
        for record in records:
            assert isinstance(await s.call(GroupAck, offset=record.offset), CacheOk)
        value = broker.metrics.registry.get_sample_value
        assert value("felix_group_poll_ack_seconds_count") == 3
        assert value("felix_request_seconds_count", {"type": "group_ack"}) == 3
        assert value("felix_request_seconds_count", {"type": "group_poll"}) >= 1
        assert value("felix_request_seconds_count", {"type": "publish"}) == 3
        assert value("felix_stream_publish_ack_seconds_count") == 3
        fsyncs = value("felix_storage_fsync_seconds_count")
        assert fsyncs is not None and fsyncs >= 1  # on_commit: the group log's, at least
        build = value("felix_build_info", {**BUILD_LABELS, "quic_impl": default_impl()})
        assert build == 1.0


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_gated_fields_are_dropped_for_a_client_that_did_not_offer_them(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology, record_publishers=True) as broker:
        s = await session(broker, features=int(Feature.FEATURE_ERROR_CODES))
        await s.publish(b"x")
        [record] = await s.poll(1)
        assert record.timestamp_micros is None and record.publisher is None
        offered = Feature.FEATURE_RECORD_TIMESTAMPS | Feature.FEATURE_GROUP_PUBLISHER
        s2 = await session(broker, features=OFFICIAL_FEATURES | offered)
        await s2.publish(b"y")
        [record] = await s2.poll(1)
        assert record.publisher == "tester" and record.timestamp_micros


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_long_poll_wakes_on_publish_and_is_capped(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology, group_max_wait_ms=300) as broker:
        s = await session(broker)
        publisher = await session(broker)
        started = time.monotonic()
        assert await s.poll(5, wait_ms=10_000) == []  # capped at 300 ms
        assert time.monotonic() - started < 2
        pending = asyncio.ensure_future(s.poll(5, wait_ms=250))
        await asyncio.sleep(0.05)
        await publisher.publish(b"wake")
        records = await pending
        assert [r.payload for r in records] == [b"wake"]


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_a_lapsed_claim_comes_back_and_max_attempts_dead_letters(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(
        tmp_path, topology=topology, group_visibility_timeout_ms=150, group_max_attempts=2
    ) as broker:
        s = await session(broker)
        await s.publish(b"poison")
        assert [(r.offset, r.attempts) for r in await s.poll(5)] == [(0, 1)]
        assert await s.poll(5) == []
        await asyncio.sleep(0.3)
        assert [(r.offset, r.attempts) for r in await s.poll(5)] == [(0, 2)]
        await asyncio.sleep(0.3)
        await s.publish(b"fine")
        assert [(r.offset, r.attempts) for r in await s.poll(5)] == [(1, 1)]
        await s.call(GroupAck, offset=1)
        assert (await s.call(GroupDescribe)).committed == 2
        dead = await s.call(GroupDeadLetters)
        assert isinstance(dead, GroupDeadLetterList) and dead.offsets == [0]


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_nack_now_later_and_by_delivery(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        s = await session(broker)
        await s.publish(b"a")
        [record] = await s.poll(1)
        assert isinstance(await s.call(GroupNack, offset=0, attempts=1), CacheOk)
        assert stale(await s.call(GroupNack, offset=0, attempts=1), "fatal")
        [record] = await s.poll(1)
        assert record.attempts == 2
        assert isinstance(await s.call(GroupNack, offset=0, attempts=2, delay_ms=200), CacheOk)
        assert await s.poll(1) == []  # delayed: not owed yet
        started = time.monotonic()
        [record] = await s.poll(1, wait_ms=2000)
        assert record.attempts == 3 and time.monotonic() - started >= 0.1


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_extend_keeps_a_claim_and_stale_once_it_lapsed(tmp_path: Path, topology: str) -> None:
    async with running_broker(
        tmp_path, topology=topology, group_visibility_timeout_ms=200, group_max_visibility_ms=400
    ) as broker:
        s = await session(broker)
        await s.publish(b"a")
        await s.poll(1)
        answer = await s.call(GroupExtend, offset=0, attempts=1, extend_ms=60_000)
        assert isinstance(answer, GroupExtended) and answer.visible_ms == 400
        await asyncio.sleep(0.25)
        assert await s.poll(1) == []  # still claimed past the 200 ms default
        answer = await s.call(GroupExtend, offset=0, attempts=1, extend_ms=0)
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        await asyncio.sleep(0.25)
        assert stale(await s.call(GroupExtend, offset=0, attempts=1, extend_ms=100), "fatal")
        [record] = await s.poll(1, visibility_ms=5000)
        assert record.attempts == 2


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_in_flight_cap_answers_empty(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology, group_max_in_flight=2) as broker:
        s = await session(broker)
        await s.publish(b"1", b"2", b"3")
        assert len(await s.poll(10)) == 2
        assert await s.poll(10, wait_ms=100) == []
        await s.call(GroupAck, offset=0)
        assert [r.offset for r in await s.poll(10)] == [2]


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_dead_letter_by_hand_redrive_and_discard(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b")
        await s.poll(2)
        assert isinstance(await s.call(GroupDeadLetter, offset=0), CacheOk)
        answer = await s.call(GroupDeadLetter, offset=0)
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        assert (await s.call(GroupDeadLetters)).offsets == [0]
        assert isinstance(await s.call(GroupRedrive, offset=0), CacheOk)
        assert (await s.call(GroupDeadLetters)).offsets == []
        [record] = await s.poll(5)
        assert (record.offset, record.attempts) == (0, 1)
        await s.call(GroupDeadLetter, offset=0)
        assert isinstance(await s.call(GroupDiscard, offset=0), CacheOk)
        assert (await s.call(GroupDeadLetters)).offsets == []
        answer = await s.call(GroupRedrive, offset=0)
        assert isinstance(answer, Error) and answer.code == "invalid_request"


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_seek_describe_delete(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b", b"c", b"d")
        info = await s.call(GroupDescribe, group="new")
        assert info.committed is None and info.tail == 4
        answer = await s.call(GroupSeek, group="new", start="latest", if_new=True)
        assert isinstance(answer, GroupPosition) and (answer.offset, answer.moved) == (4, True)
        answer = await s.call(GroupSeek, group="new", start="earliest", if_new=True)
        assert (answer.offset, answer.moved) == (4, False)
        await s.poll(2)
        answer = await s.call(GroupSeek, start=StartOffset(offset=3))
        assert (answer.offset, answer.moved) == (3, True)
        assert stale(await s.call(GroupAck, offset=3))  # the claim was voided by the seek
        assert isinstance(await s.call(GroupAck, offset=1), CacheOk)  # below: duplicate
        answer = await s.call(GroupSeek, start=StartOffset(offset=9))
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        assert [r.offset for r in await s.poll(5)] == [3]
        deleted = await s.call(GroupDelete)
        assert isinstance(deleted, GroupDeleted) and deleted.existed
        assert (await s.call(GroupDelete)).existed is False
        assert [r.offset for r in await s.poll(5)] == [0, 1, 2, 3]  # afresh at 0


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_permissions_and_refusals(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        consume = token(broker, perms=[f"group.consume:group:{TENANT}/{NS}/log/g"])
        s = await session(broker, tok=consume)
        assert await s.poll(1) == []
        answer = await s.call(GroupPoll, group="other", max_records=1)
        assert isinstance(answer, Error) and answer.code == "forbidden"
        answer = await s.call(GroupSeek, start="latest")
        assert isinstance(answer, Error) and answer.code == "forbidden"
        subscriber = token(broker, perms=[f"stream.subscribe:stream:{TENANT}/{NS}/log"])
        s2 = await session(broker, tok=subscriber)
        assert await s2.poll(1) == []  # group.consume through stream.subscribe
        answer = await s2.call(GroupDelete)
        assert isinstance(answer, Error) and answer.code == "forbidden"
        owner = await session(broker)
        answer = await owner.call(GroupPoll, shard=2, max_records=1)  # not a shard here
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        answer = await owner.call(GroupPoll, stream="orders", max_records=1)  # in memory
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        answer = await owner.call(GroupPoll, stream="nope", max_records=1)
        assert isinstance(answer, Error) and answer.code == "not_found"
        answer = await owner.call(GroupPoll, max_records=1, consumer="")
        assert isinstance(answer, Error) and answer.code == "invalid_request"


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_named_consumer_reclaims_from_an_older_connection(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        old = await session(broker)
        await old.publish(b"a", b"b", b"c")
        held = await old.poll(2, consumer="w1")
        assert [r.offset for r in held] == [0, 1]
        other = await session(broker)
        assert [r.offset for r in await other.poll(5)] == [2]
        new = await session(broker)
        got = await new.poll(5, consumer="w1", reclaim=True)
        assert [(r.offset, r.attempts) for r in got] == [(0, 2), (1, 2)]
        assert stale(await old.call(GroupNack, offset=0, attempts=1), "fatal")


@pytest.mark.parametrize("topology", THROUGH_LEADER)
async def test_idle_state_is_dropped_without_losing_the_cursor(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b")
        await s.poll(1)
        await s.call(GroupAck, offset=0)
        assert broker.groups is not None
        assert broker.groups.evict_idle(time.monotonic_ns() // 1_000_000 + 10**9) == 1
        info = await s.call(GroupDescribe)
        assert (info.committed, info.in_flight) == (1, 0)
        assert [r.offset for r in await s.poll(5)] == [1]
        await s.call(GroupAck, offset=1)


async def test_cursor_and_dead_letters_survive_a_broker_restart(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b", b"c", b"d")
        await s.poll(4)
        await s.call(GroupAck, offset=0)
        await s.call(GroupDeadLetter, offset=1)
        await s.call(GroupAck, offset=3)
    async with running_broker(tmp_path) as broker:
        s = await session(broker)
        info = await s.call(GroupDescribe)
        assert (info.committed, info.dead_letters) == (2, 1)
        assert (await s.call(GroupDeadLetters)).offsets == [1]
        # The unacknowledged record comes back; 3, acknowledged above the cursor, does not.
        assert [r.offset for r in await s.poll(5)] == [2]
        await s.call(GroupAck, offset=2)
        assert (await s.call(GroupDescribe)).committed == 4


async def test_backup_offsets_name_the_group_log_caches_and_in_memory_shards(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as broker:
        s = await session(broker)
        await s.publish(b"a", b"b", b"c")
        assert [r.offset for r in await s.poll(2)] == [0, 1]
        assert isinstance(await s.call(GroupAck, offset=0), CacheOk)
        url = f"http://127.0.0.1:{broker.http_port}/backup/offsets"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        status = json.loads(body)
        assert broker.groups is not None
        group_log = broker.groups.committed_offsets()[(TENANT, NS, "log", 0)]
        assert group_log > 0  # the group's creation, claims and ack were logged
        shards = {(s["kind"], s["name"], s["shard"]): s for s in status["shards"]}
        assert shards["stream", "log", 0]["logs"] == {"records": 3, "group_cursors": group_log}
        # The catalog's durable cache: log-backed, both shards, nothing written yet.
        assert shards["cache", "c", 0]["logs"] == {"records": 0}
        assert shards["cache", "c", 1]["generation"] == 0
        skipped = {(s["kind"], s["name"], s["shard"], s["reason"]) for s in status["skipped"]}
        assert ("stream", "orders", 0, "not_durable") in skipped
        assert {("stream", "wide", i, "not_durable") for i in range(4)} <= skipped
        assert not any(name == "log" for _, name, _, _ in skipped)
