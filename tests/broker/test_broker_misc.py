"""Discovery answers, HTTP endpoints, the felix-broker command line and SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from felix_common.tokens import TokenVerifier
from felix_wire.messages import (
    CacheShards,
    CacheShardsView,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    ShardRouting,
    StreamShards,
    StreamShardsView,
    Topology,
    TopologyView,
    Unsupported,
)

from ..conftest import start_fixture_broker, stop_fixture_broker
from ..fleet.harness import TOPOLOGIES, leader_of
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

pytestmark = pytest.mark.timeout(40)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_discovery_answers(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        # A fleet member answers from its routing snapshot: every shard led by node-a
        # at generation 1, whichever member is asked; a standalone broker names no owner.
        leader = None if topology == "one" else leader_of(broker)

        def owners(count: int) -> list[ShardOwner]:
            if leader is None:
                return [ShardOwner(shard=i, generation=0) for i in range(count)]
            addr = f"127.0.0.1:{leader.quic_port}"
            return [
                ShardOwner(shard=i, node_id=leader.node_id, addr=addr, generation=1)
                for i in range(count)
            ]

        cases = [
            (
                StreamShards(tenant_id=TENANT, namespace=NS, stream="mod", request_id=1),
                StreamShardsView(shards=3, request_id=1),
            ),
            (
                StreamShards(tenant_id=TENANT, namespace=NS, stream="wide", request_id=2),
                StreamShardsView(shards=4, request_id=2, routing=ShardRouting.JUMP_HASH),
            ),
            # 0 means unknown, never "one" (D3); another tenant's names are unknown here.
            (
                StreamShards(tenant_id=TENANT, namespace=NS, stream="nope", request_id=3),
                StreamShardsView(shards=0, request_id=3),
            ),
            (
                StreamShards(tenant_id="t2", namespace=NS, stream="other", request_id=4),
                StreamShardsView(shards=0, request_id=4),
            ),
            (
                CacheShards(tenant_id=TENANT, namespace=NS, cache="c", request_id=5),
                CacheShardsView(shards=2, request_id=5),
            ),
            (
                CacheShards(tenant_id=TENANT, namespace=NS, cache="x", request_id=6),
                CacheShardsView(shards=0, request_id=6),
            ),
            (
                ShardOwners(
                    tenant_id=TENANT, namespace=NS, name="mod", kind="stream", request_id=7
                ),
                ShardOwnersView(owners=owners(3), request_id=7),
            ),
            (
                ShardOwners(tenant_id=TENANT, namespace=NS, name="c", kind="cache", request_id=8),
                ShardOwnersView(owners=owners(2), request_id=8),
            ),
            (
                ShardOwners(
                    tenant_id=TENANT, namespace=NS, name="nope", kind="stream", request_id=9
                ),
                ShardOwnersView(owners=[], request_id=9),
            ),
        ]
        for request, expected in cases:
            await stream.send(request)
            assert await stream.recv() == expected
        await stream.send(Topology())
        answer = await stream.recv()
        if topology == "one":
            # Not advertised by a standalone broker: answered unsupported, the stream goes on.
            assert answer == Unsupported(request_type="topology")
        else:
            assert isinstance(answer, TopologyView), answer
            assert [b.node_id for b in answer.brokers] == ["node-a", "node-b", "node-c"]
        client.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# Standalone: operator HTTP of one broker, not the client protocol (a member's
# /backup/offsets: tests/fleet/test_backup_offsets.py).
async def test_http_endpoints_report_the_broker(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        base = f"http://127.0.0.1:{broker.http_port}"
        client = await WireClient.connect(broker)
        await client.authed()
        assert await asyncio.to_thread(_get, base + "/live") == (200, "ok")
        assert await asyncio.to_thread(_get, base + "/ready") == (200, "ok")
        status, metrics = await asyncio.to_thread(_get, base + "/metrics")
        assert status == 200 and "felix_connections_open 1.0" in metrics
        status, body = await asyncio.to_thread(_get, base + "/backup/offsets")
        offsets = json.loads(body)
        # Nothing written yet: the durable stream has no log, the log-backed
        # cache's shards are open and empty, the in-memory streams are skipped.
        assert offsets["node_id"] == ""
        assert [(s["kind"], s["name"], s["logs"]) for s in offsets["shards"]] == [
            ("cache", "c", {"records": 0}),
            ("cache", "c", {"records": 0}),
        ]
        assert {s["reason"] for s in offsets["skipped"]} == {"not_durable"}
        assert len(offsets["skipped"]) == 1 + 4 + 3 + 1  # orders, wide, mod, other
        client.close()


# Standalone: the `token` command of the CLI, no broker running.
def test_token_command_prints_a_verifiable_token(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "felix_broker.cli",
            "--data-dir",
            str(tmp_path),
            "token",
            "--tenant",
            "acme",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    from felix_common.tokens import DevIssuer

    principal = TokenVerifier(DevIssuer.load_or_create(tmp_path).jwks()).verify(
        result.stdout.strip(), "acme"
    )
    assert principal.permissions.allows("stream.publish", "stream:acme/ns/s")


# Standalone: configuration checked before any broker (or fleet) starts.
def test_bad_configuration_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "broker.yaml"
    config.write_text("pub_queue_dept: 5\n")
    result = subprocess.run(
        [sys.executable, "-m", "felix_broker.cli", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "pub_queue_dept" in result.stderr


# Standalone: the single-broker fixture process (--brokers 3: tests/fixture/test_fleet_fixture.py).
def test_fixture_serves_until_sigterm_and_drains(tmp_path: Path) -> None:
    process, document = start_fixture_broker(tmp_path)
    try:
        assert document["tenant_id"] == TENANT and document["addrs"][0].startswith("127.0.0.1:")
        assert Path(document["ca_file"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
        request = urllib.request.Request(
            document["control_url"] + "/tokens",
            data=json.dumps({"ttl_secs": 60, "forged": True}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.loads(response.read())["token"].count(".") == 2
        assert _get(document["http_url"] + "/ready") == (200, "ok")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    stop_fixture_broker(process)


# Standalone: the standalone CLI process's start message.
def test_start_message_names_addresses_ca_and_token(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "felix_broker.cli",
            "--data-dir",
            str(tmp_path),
            "--quic-bind",
            "127.0.0.1:0",
            "--metrics-bind",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert "QUIC on 127.0.0.1:" in lines[0] and "HTTP on 127.0.0.1:" in lines[0]
        assert str(tmp_path) in lines[1] and "ca.pem" in lines[1]
        assert "felix-broker token --tenant" in lines[2]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


# Standalone: operator HTTP of one broker (a member's: tests/fleet/test_backup_offsets.py).
async def test_backup_offsets_without_durable_storage_skip_everything(tmp_path: Path) -> None:
    async with running_broker(tmp_path, durable_storage_dir="") as broker:
        base = f"http://127.0.0.1:{broker.http_port}"
        status, body = await asyncio.to_thread(_get, base + "/backup/offsets")
        assert status == 200
        offsets = json.loads(body)
        assert offsets["shards"] == []
        skipped = {(s["kind"], s["name"], s["shard"], s["reason"]) for s in offsets["skipped"]}
        assert {("stream", "log", 0, "not_durable"), ("stream", "log", 1, "not_durable")} <= skipped
        assert {("cache", "c", 0, "not_durable"), ("cache", "c", 1, "not_durable")} <= skipped
