"""`felix group ...`, `felix consume`, `felix counter`, `--version` on every console
script and `felix token --json`, as subprocesses against the reference broker."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from felix_transport import __version__

from .support import felix

pytestmark = pytest.mark.timeout(120)


def _lines(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _fresh_group(doc: dict[str, Any]) -> str:
    name = f"cli-{uuid.uuid4().hex[:10]}"
    stream = doc["durable_stream"]
    seek = _lines(felix(doc, "group", "seek", stream, name, "--to", "latest", "--json"))
    assert [s["shard"] for s in seek] == [0, 1, 2, 3] and all(s["moved"] for s in seek)
    return name


def test_group_commands(felix_fixture: dict[str, Any]) -> None:
    doc, stream = felix_fixture, felix_fixture["durable_stream"]
    name = _fresh_group(doc)
    assert felix(doc, "publish", stream, "job-a", "job-b", "--key", "cli-g").returncode == 0

    polled = _lines(felix(doc, "group", "poll", stream, name, "--wait", "3", "--json"))
    assert [r["payload"] for r in polled] == ["job-a", "job-b"]
    shard = str(polled[0]["shard"])
    a, b = (str(r["offset"]) for r in polled)
    done = felix(doc, "group", "ack", stream, name, "--shard", shard, a)
    assert done.returncode == 0 and done.stdout.strip() == f"[{shard}:{a}] acked"
    done = felix(doc, "group", "nack", stream, name, "--shard", shard, b, "--attempts", "1")
    assert done.returncode == 0, done.stderr

    again = felix(doc, "group", "poll", stream, name, "--shard", shard, "--wait", "3")
    assert again.returncode == 0 and again.stdout.strip() == f"[{shard}:{b}] job-b (attempt 2)"

    info = _lines(felix(doc, "group", "info", stream, name, "--shard", shard, "--json"))
    assert info == [
        {
            "shard": int(shard),
            "committed": int(a) + 1,
            "tail": int(b) + 1,
            "in_flight": 1,
            "owed": 0,
            "dead_letters": 0,
        }
    ]
    text = felix(doc, "group", "info", stream, name, "--shard", shard)
    assert f"shard {shard}: committed {int(a) + 1}, tail {int(b) + 1}" in text.stdout

    # Dead letters: listed, redriven, discarded.
    assert felix(doc, "group", "nack", stream, name, "--shard", shard, b).returncode == 0
    for _ in range(10):  # nacked until the broker dead-letters it (max attempts)
        got = felix(doc, "group", "poll", stream, name, "--shard", shard, "--wait", "1", "--json")
        if not _lines(got):
            break
        assert felix(doc, "group", "nack", stream, name, "--shard", shard, b).returncode == 0
    dead = _lines(felix(doc, "group", "dead-letters", stream, name, "--shard", shard, "--json"))
    assert dead == [{"shard": int(shard), "offsets": [int(b)]}]
    done = felix(doc, "group", "redrive", stream, name, "--shard", shard, b)
    assert done.stdout.strip() == f"[{shard}:{b}] redriven"
    assert felix(doc, "group", "dead-letters", stream, name, "--shard", shard).stdout.strip() == (
        f"shard {shard}: none"
    )

    deleted = _lines(felix(doc, "group", "delete", stream, name, "--json"))
    assert [d["existed"] for d in deleted if d["shard"] == int(shard)] == [True]
    # Offsets are per shard: settling without --shard is a usage error.
    done = felix(doc, "group", "ack", stream, name, "3")
    assert done.returncode == 2 and "--shard" in done.stderr


def test_consume_prints_and_acks(felix_fixture: dict[str, Any]) -> None:
    doc, stream = felix_fixture, felix_fixture["durable_stream"]
    name = _fresh_group(doc)
    payloads = [f"consume-{i}" for i in range(6)]
    for payload in payloads:
        assert felix(doc, "publish", stream, payload, "--key", payload).returncode == 0
    done = felix(doc, "consume", stream, "--group", name, "--count", "4", "--json")
    first = _lines(done)
    assert len(first) == 4 and {r["shard"] for r in first} <= {0, 1, 2, 3}
    assert all(r["attempts"] == 1 for r in first)
    # The rest, as text, until nothing comes for a second; acked ones never again.
    done = felix(doc, "consume", stream, "--group", name, "--timeout", "2")
    assert done.returncode == 0, done.stderr
    rest = [line.split("] ", 1)[1].split(" (attempt")[0] for line in done.stdout.splitlines()]
    assert sorted([r["payload"] for r in first] + rest) == payloads
    info = _lines(felix(doc, "group", "info", stream, name, "--json"))
    assert all(s["in_flight"] == 0 and s["committed"] == s["tail"] for s in info)


def test_counter_commands(felix_fixture: dict[str, Any]) -> None:
    doc, cache = felix_fixture, felix_fixture["cache"]
    key = f"cli-counter-{uuid.uuid4().hex[:6]}"
    assert felix(doc, "counter", "get", cache, key).stdout.strip() == f"{key}: (none)"
    assert felix(doc, "counter", "add", cache, key, "5").stdout.strip() == f"{key}: 5"
    assert felix(doc, "counter", "add", cache, key, "--", "-2").stdout.strip() == f"{key}: 3"
    got = _lines(felix(doc, "counter", "get", cache, key, "--json"))
    assert got == [{"key": key, "value": 3}]
    done = felix(doc, "counter", "add", cache, key, "many")
    assert done.returncode == 2 and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "script", ["felix", "felix-broker", "felix-controlplane", "felix-conformance"]
)
def test_every_console_script_has_one_version(script: str) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / script), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f" {__version__}") and __version__ != "0+unknown"


def test_token_json_is_one_line(felix_fixture: dict[str, Any]) -> None:
    done = felix(felix_fixture, "token", "--json")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1
    assert json.loads(done.stdout)["claims"]["tid"] == felix_fixture["tenant_id"]
