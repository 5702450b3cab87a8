"""kill -9 and restart a real broker process: acknowledged records are never handed out
again, unacknowledged ones are, and cursors and dead letters survive."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from felix_wire.messages import (
    CacheOk,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetters,
    GroupDescribe,
    GroupPoll,
    GroupRecords,
)

from ..support.broker_process import free_udp_port
from ..support.wire import NS, TENANT, BrokerProcess, WireClient, token
from .session import GroupSession

pytestmark = pytest.mark.timeout(120)

CONFIG = """
catalog:
  tenants:
    t1:
      namespaces:
        default:
          streams:
            jobs: {durable: true, shards: 1}
"""
SCOPE: dict[str, Any] = {
    "tenant_id": TENANT,
    "namespace": NS,
    "stream": "jobs",
    "shard": 0,
    "group": "g",
}


def _start(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    config = tmp / "broker.yaml"
    config.write_text(CONFIG)
    env = dict(os.environ, FELIX_DURABLE_STORAGE_DIR=str(tmp / "data" / "durable"))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "felix_broker.cli",
            "--config",
            str(config),
            "--data-dir",
            str(tmp / "data"),
            "--quic-bind",
            f"127.0.0.1:{port}",
            "--metrics-bind",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert process.stdout is not None
    process.stdout.readline()  # started
    return process


async def _session(tmp: Path, port: int) -> GroupSession:
    broker = BrokerProcess(port, tmp / "data")
    client = await WireClient.connect(broker)
    return GroupSession(await client.session(tok=token(broker, subject="crash")), SCOPE)


async def _before_crash(tmp: Path, port: int) -> set[int]:
    s = await _session(tmp, port)
    await s.publish(*(f"job-{i}".encode() for i in range(40)))
    answer = await s.call(GroupPoll, max_records=30)
    assert isinstance(answer, GroupRecords) and len(answer.records) == 30
    acked: set[int] = set()
    # A contiguous run, then a scattered few above a record left in flight (20).
    for offset in [*range(0, 15), 16, 18, 21, 25]:
        assert isinstance(await s.call(GroupAck, offset=offset), CacheOk)
        acked.add(offset)
    assert isinstance(await s.call(GroupDeadLetter, offset=15), CacheOk)
    return acked


async def _after_restart(tmp: Path, port: int) -> tuple[Any, list[int], list[int]]:
    s = await _session(tmp, port)
    info = await s.call(GroupDescribe)
    dead = (await s.call(GroupDeadLetters)).offsets
    handed: list[int] = []
    while True:
        answer = await s.call(GroupPoll, max_records=100, wait_ms=200)
        if not answer.records:
            break
        for record in answer.records:
            handed.append(record.offset)
            await s.call(GroupAck, offset=record.offset)
    return info, dead, handed


def test_acknowledged_records_are_never_redelivered_after_kill_9(tmp_path: Path) -> None:
    port = free_udp_port()
    process = _start(tmp_path, port)
    try:
        acked = asyncio.run(_before_crash(tmp_path, port))
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    process = _start(tmp_path, port)
    try:
        info, dead, handed = asyncio.run(_after_restart(tmp_path, port))
    finally:
        process.kill()
        process.wait(timeout=10)
    assert info.committed == 17  # 0-14 acked, 15 dead, 16 acked, 17 not
    assert dead == [15]
    assert not set(handed) & acked
    assert sorted(handed) == sorted(set(range(17, 40)) - acked)  # every other record comes back
