"""A connection's task that ends with an exception is logged once, naming the request
type that started it, and counted in felix_task_failures_total."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from felix_wire.messages import AuthOk

from ..support.wire import WireClient
from .harness import running_broker


async def test_a_failed_task_is_logged_once_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        _stream, ok = await client.authed()
        assert isinstance(ok, AuthOk), ok
        assert broker.session is not None
        (state,) = broker.session.connections.values()

        async def broken() -> None:
            raise RuntimeError("a handler bug")

        with caplog.at_level(logging.ERROR, logger="felix_broker.session.context"):
            task = state.spawn(broken(), "cache_get")
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0)
        failures = [r for r in caplog.records if "cache_get task failed" in r.getMessage()]
        assert len(failures) == 1
        assert failures[0].exc_info is not None and "a handler bug" in str(failures[0].exc_info[1])
        value = broker.metrics.registry.get_sample_value(
            "felix_task_failures_total", {"type": "cache_get"}
        )
        assert value == 1.0
        client.close()
