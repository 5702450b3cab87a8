"""A failing group request closes what it opened (issue 20, finding 3), over real QUIC."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_wire.errors import ErrorCode
from felix_wire.messages import Error, GroupDescribe

from ..broker.harness import running_broker
from ..support.process import fd_count
from ..support.wire import NS, TENANT, WireClient

pytestmark = pytest.mark.timeout(90)


async def test_200_failing_group_requests_leave_no_file_open(tmp_path: Path) -> None:
    # The stream's own log cannot be created (a file where the tenant folder goes);
    # the group log lives in another tree and could be opened before that fails.
    (tmp_path / "durable").mkdir()
    (tmp_path / "durable" / TENANT).write_bytes(b"")
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        control, _ = await client.authed()

        async def describe(request_id: int) -> None:
            await control.send(
                GroupDescribe(
                    tenant_id=TENANT,
                    namespace=NS,
                    stream="log",
                    shard=0,
                    group="g",
                    request_id=request_id,
                )
            )
            answer = await control.recv()
            assert isinstance(answer, Error), answer
            assert answer.code == ErrorCode.STORAGE.wire

        await describe(0)
        baseline = fd_count()
        for request_id in range(1, 201):
            await describe(request_id)
        assert fd_count() <= baseline + 2
        client.close()
