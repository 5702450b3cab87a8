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

from felix_broker.cli import full_rights
from felix_common.tokens import DevIssuer
from felix_transport import TransportConfig, connect
from felix_wire.gating import client_auth
from felix_wire.messages import (
    AckMode,
    AuthOk,
    CacheOk,
    GroupAck,
    GroupDeadLetter,
    GroupDeadLetters,
    GroupDescribe,
    GroupPoll,
    GroupRecords,
    Publish,
    PublishOk,
)

from ..broker.harness import NS, OFFICIAL_FEATURES, OFFICIAL_FLAGS, TENANT, WireStream

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


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class _Session:
    def __init__(self, stream: WireStream) -> None:
        self.stream = stream
        self.rid = 0

    async def call(self, message_type: Any, **fields: Any) -> Any:
        self.rid += 1
        await self.stream.send(message_type(**{**SCOPE, **fields, "request_id": self.rid}))
        return await self.stream.recv()


async def _session(tmp: Path, port: int) -> _Session:
    data = tmp / "data"
    issuer = DevIssuer.load_or_create(data)
    tok = issuer.mint(TENANT, subject="crash", perms=full_rights(TENANT))
    ca = (data / "tls" / "ca.pem").read_bytes()
    connection = await connect(TransportConfig.client(ca), "127.0.0.1", port)
    stream = WireStream(await connection.open_bidi_stream())
    await stream.send(
        client_auth(TENANT, tok, client_flags=OFFICIAL_FLAGS, client_features=OFFICIAL_FEATURES)
    )
    assert isinstance(await stream.recv(), AuthOk)
    return _Session(stream)


async def _before_crash(tmp: Path, port: int) -> set[int]:
    s = await _session(tmp, port)
    for i in range(40):
        s.rid += 1
        await s.stream.send(
            Publish(
                tenant_id=TENANT,
                namespace=NS,
                stream="jobs",
                payload=f"job-{i}".encode(),
                ack=AckMode.PER_MESSAGE,
                request_id=s.rid,
            )
        )
        assert isinstance(await s.stream.recv(), PublishOk)
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
    port = _free_udp_port()
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
