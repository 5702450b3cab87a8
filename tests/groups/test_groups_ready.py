"""Group polls and acks answered without a task of their own (the dispatcher's ready
path), over real QUIC: no task per request, acks still written before they are
answered, the per-stream bound, and a poll answer that cannot be written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from felix_broker.groups.records import Kind, decode_change
from felix_broker.session.context import ConnectionState, RequestContext
from felix_transport import StreamClosedError
from felix_wire.codec import encode_frame
from felix_wire.messages import (
    AuthOk,
    CacheOk,
    GroupAck,
    GroupDescribe,
    GroupInfo,
    GroupPoll,
    GroupRecords,
)

from ..broker.harness import running_broker
from ..support.wire import NS, TENANT, WireClient
from .session import GroupSession

pytestmark = pytest.mark.timeout(60)

SCOPE: dict[str, Any] = {"tenant_id": TENANT, "namespace": NS, "stream": "log", "shard": 0}


async def _session(broker: Any) -> GroupSession:
    client = await WireClient.connect(broker)
    stream, answer = await client.authed()
    assert isinstance(answer, AuthOk), answer
    return GroupSession(stream, {**SCOPE, "group": "g"})


async def _claimed(s: GroupSession, n: int) -> list[Any]:
    """Publish `n` records and claim them all (the group's first poll writes its cursor)."""
    await s.publish(*(b"r%d" % i for i in range(n)))
    records: list[Any] = []
    for _ in range(50):
        records += await s.poll(n - len(records), wait_ms=200)
        if len(records) == n:
            break
    assert len(records) == n
    return records


def _count_request_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request that got a task of its own, by type."""
    started: list[str] = []
    real = ConnectionState.spawn_request

    async def counting(self: ConnectionState, coro: Any, kind: str, io: Any) -> None:
        started.append(kind)
        await real(self, coro, kind, io)

    monkeypatch.setattr(ConnectionState, "spawn_request", counting)
    return started


def _acked_in_log(log: Any) -> set[int]:
    """The offsets the group log holds an ack of (what is written, page cache included)."""
    acked: set[int] = set()
    for record in log.read(log.start_offset, max_records=100_000, max_bytes=1 << 24):
        change = decode_change(record.payload)
        if change.kind is Kind.ACKED or change.kind is Kind.SETTLED:
            acked.add(change.offset)
        elif change.kind is Kind.CURSOR and change.offset is not None:
            acked.update(range(change.offset))
    return acked


async def test_polls_and_acks_with_ready_answers_take_no_task_and_acks_are_written_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path, durable_fsync_mode="periodic") as broker:
        s = await _session(broker)
        records = await _claimed(s, 32)
        await s.publish(b"next")
        assert broker.groups is not None
        (groups,) = broker.groups._shards.values()
        log = groups.log
        appends: list[int] = []
        real_append = log.append

        def counting_append(payloads: Any, **kw: Any) -> int:
            appends.append(len(payloads))
            return real_append(payloads, **kw)

        log.append = counting_append  # type: ignore[method-assign]
        started = _count_request_tasks(monkeypatch)
        first = s.rid + 1
        frames = [
            encode_frame(GroupAck(**SCOPE, group="g", offset=r.offset, request_id=s.next_id()))
            for r in records
        ]
        poll_id = s.next_id()
        frames.append(
            encode_frame(GroupPoll(**SCOPE, group="g", max_records=5, request_id=poll_id))
        )
        await s.stream.send(b"".join(frames))  # one write: they arrive together
        acked: set[int] = set()
        polled: list[Any] = []
        for _ in range(33):
            answer = await s.stream.recv()
            if isinstance(answer, GroupRecords):
                assert answer.request_id == poll_id
                polled = list(answer.records)
                continue
            assert isinstance(answer, CacheOk), answer
            offset = records[answer.request_id - first].offset
            # Answered only once the ack's change is written to the group log.
            assert offset in _acked_in_log(log), offset
            acked.add(answer.request_id)
        assert acked == set(range(first, first + 32))
        assert [r.payload for r in polled] == [b"next"]
        assert started == [], started  # neither the acks nor the poll had a task
        assert sum(appends) >= 32 and len(appends) <= 4, appends  # one write per pass
        info = await s.call(GroupDescribe)
        assert isinstance(info, GroupInfo) and info.committed == 32 and info.in_flight == 1
        value = broker.metrics.registry.get_sample_value
        assert value("felix_group_poll_ack_seconds_count") == 32
        assert value("felix_request_seconds_count", {"type": "group_ack"}) == 32
        ok = value("felix_group_requests_total", {"type": "group_ack", "outcome": "ok"})
        assert ok == 32


async def test_acks_past_the_per_stream_bound_take_the_task_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(
        tmp_path, durable_fsync_mode="periodic", max_inflight_requests_per_conn=2
    ) as broker:
        s = await _session(broker)
        records = await _claimed(s, 16)
        started = _count_request_tasks(monkeypatch)
        first = s.rid + 1
        frames = [
            encode_frame(GroupAck(**SCOPE, group="g", offset=r.offset, request_id=s.next_id()))
            for r in records
        ]
        await s.stream.send(b"".join(frames))
        answered = set()
        for _ in records:
            answer = await s.stream.recv()
            assert isinstance(answer, CacheOk), answer
            answered.add(answer.request_id)
        assert answered == set(range(first, first + 16))
        # Two held answers at most per stream; the rest went through the request bound.
        assert 1 <= len(started) <= 14 and set(started) == {"group_ack"}, started
        info = await s.call(GroupDescribe)
        assert isinstance(info, GroupInfo) and info.committed == 16


async def test_under_on_commit_every_ack_waits_for_its_fsync_in_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path, durable_fsync_mode="on_commit") as broker:
        s = await _session(broker)
        records = await _claimed(s, 4)
        started = _count_request_tasks(monkeypatch)
        assert broker.groups is not None
        (groups,) = broker.groups._shards.values()
        for record in records:
            assert isinstance(await s.call(GroupAck, offset=record.offset), CacheOk)
            assert groups.log.durable_offset == groups.log.next_offset
        assert started == ["group_ack"] * 4


async def test_a_poll_answer_that_cannot_be_written_hands_its_claims_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        s = await _session(broker)
        await _claimed(s, 1)  # the group exists (its cursor is written)
        await s.publish(b"a", b"b")
        started = _count_request_tasks(monkeypatch)
        failed = asyncio.Event()
        real_write = RequestContext.write

        async def failing_write(self: RequestContext, data: bytes) -> None:
            if not failed.is_set():
                failed.set()
                raise StreamClosedError(0, "reset by the peer")  # as if the client reset
            await real_write(self, data)

        monkeypatch.setattr(RequestContext, "write", failing_write)
        await s.stream.send(GroupPoll(**SCOPE, group="g", max_records=5, request_id=s.next_id()))
        async with asyncio.timeout(5):
            await failed.wait()
        assert started == []  # it was the ready path's answer that failed
        # The answer never left: both records are owed again at once, and the
        # delivery that never reached the client is not counted.
        again = await s.poll(5)
        assert [(r.payload, r.attempts) for r in again] == [(b"a", 1), (b"b", 1)]


async def test_a_stream_finished_right_after_its_requests_still_gets_every_answer(
    tmp_path: Path,
) -> None:
    """A client that sends acks (answered by the commit, without a task) and a long
    poll (its own task) and at once finishes its side gets all their answers before
    the broker ends the stream: its end waits for the answers owed elsewhere."""
    async with running_broker(tmp_path, durable_fsync_mode="periodic") as broker:
        s = await _session(broker)
        records = await _claimed(s, 8)
        first = s.rid + 1
        frames = [
            encode_frame(GroupAck(**SCOPE, group="g", offset=r.offset, request_id=s.next_id()))
            for r in records
        ]
        poll_id = s.next_id()
        frames.append(
            encode_frame(
                GroupPoll(**SCOPE, group="g", max_records=5, wait_ms=300, request_id=poll_id)
            )
        )
        await s.stream.send(b"".join(frames))
        await s.stream.stream.finish()  # nothing more from this client on the stream
        answers = [await s.stream.recv(timeout=5) for _ in range(9)]
        acks = [a for a in answers if isinstance(a, CacheOk)]
        assert sorted(a.request_id for a in acks) == list(range(first, first + 8)), answers
        (poll,) = [a for a in answers if isinstance(a, GroupRecords)]
        assert poll.request_id == poll_id and list(poll.records) == []
        await s.stream.expect_end()
