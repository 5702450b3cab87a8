"""A group's dead letters move with its shard (issue 18: "group cursors, dead letters,
producer state and counters move with the shard"): real etcd, the placer and three
brokers over real QUIC (tests/fleet/moves_support.py's fleet)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.fleet.moves_support as moves
from felix_common.etcd_process import EtcdProcess
from felix_wire.messages import (
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetterList,
    GroupDeadLetters,
    GroupPoll,
    GroupRecords,
    PublishOk,
)

from ..support.wire import NS, TENANT, WireClient
from .support import eventually

pytestmark = pytest.mark.timeout(180)

SCOPE = {"tenant_id": TENANT, "namespace": NS, "stream": moves.STREAM, "shard": 0}


async def test_dead_letters_and_the_cursor_move_with_the_shard(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    async with moves.moving_fleet(tmp_path, etcd_server) as fleet:
        owner = fleet.leader()
        client = await WireClient.connect(fleet.entry(owner))
        control = await client.session()
        for i in range(4):
            await control.send(moves.publish(f"r{i}".encode(), i + 1))
            assert await control.recv() == PublishOk(request_id=i + 1)
        group = {**SCOPE, "group": "dl"}
        await control.send(GroupPoll(**group, max_records=3, request_id=10))  # type: ignore[arg-type]
        polled = await control.recv()
        assert isinstance(polled, GroupRecords) and [r.offset for r in polled.records] == [0, 1, 2]
        await control.send(GroupDeadLetter(**group, offset=1, request_id=11))  # type: ignore[arg-type]
        await control.recv()
        for offset in (0, 2):
            await control.send(GroupAck(**group, offset=offset, request_id=20 + offset))  # type: ignore[arg-type]
            await control.recv()
        listed = GroupDeadLetters(**group, request_id=30)  # type: ignore[arg-type]
        await control.send(listed)
        assert await control.recv() == GroupDeadLetterList(offsets=[1], request_id=30)
        client.close()

        await fleet.placer.drain(owner, "test")
        await eventually(
            lambda: fleet.leader() != owner and fleet.settled_on(fleet.leader()),
            within=30,
            what="the shard cut over",
        )
        successor = fleet.leader()
        assert successor != owner
        client = await WireClient.connect(fleet.entry(successor))
        try:
            control = await client.session()
            await control.send(listed)
            assert await control.recv() == GroupDeadLetterList(offsets=[1], request_id=30)
            # The cursor too: the next poll hands out what was never handed out.
            await control.send(GroupPoll(**group, max_records=3, request_id=40))  # type: ignore[arg-type]
            polled = await control.recv()
            assert isinstance(polled, GroupRecords), polled
            assert [r.offset for r in polled.records] == [3], (owner, successor)
        finally:
            client.close()
