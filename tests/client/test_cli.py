"""The `felix` command line end to end, as subprocesses against the reference broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .support import FELIX, env_for, felix

pytestmark = pytest.mark.timeout(90)


def test_publish_and_subscribe(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["memory_stream"]
    sub = subprocess.Popen(
        [*FELIX, "subscribe", stream, "--count", "2", "--timeout", "20", "--json"],
        env=env_for(felix_fixture),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A latest subscription sees only what is published after it registered:
        # publish until the subscriber has seen two events.
        deadline = time.monotonic() + 30
        while sub.poll() is None and time.monotonic() < deadline:
            done = felix(felix_fixture, "publish", stream, "hello", "world", "--batch")
            assert done.returncode == 0, done.stderr
            time.sleep(0.3)
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
    assert sub.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["payload"] for e in events] == ["hello", "world"]
    assert events[0]["shard"] == 0


def test_publish_readable_and_flags_override_env(felix_fixture: dict[str, Any]) -> None:
    done = felix(
        felix_fixture,
        "publish",
        felix_fixture["memory_stream"],
        "one",
        "--addr",
        felix_fixture["addrs"][0],
        FELIX_ADDR="127.0.0.1:1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "published 1 record(s)"


def test_errors_exit_non_zero(felix_fixture: dict[str, Any]) -> None:
    done = felix(felix_fixture, "publish", felix_fixture["missing_stream"], "x")
    assert done.returncode == 1 and "NotFoundError" in done.stderr
    done = felix(felix_fixture, "publish", "s", "x", FELIX_TENANT="")
    assert done.returncode == 2 and "tenant" in done.stderr
    # An in-memory stream has no log to read.
    done = felix(felix_fixture, "read", felix_fixture["memory_stream"], "--from", "0")
    assert done.returncode == 1 and "in memory" in done.stderr


def test_read_a_range(felix_fixture: dict[str, Any]) -> None:
    stream = felix_fixture["durable_stream"]
    assert felix(felix_fixture, "publish", stream, "ranged-a", "ranged-b").returncode == 0
    # The publish is acknowledged when queued, so the append may lag the answer under
    # load: read again (a bounded number of times) until the batch is in the log.
    for _ in range(20):
        done = felix(felix_fixture, "read", stream, "--from", "0", "--json")
        assert done.returncode == 0, done.stderr
        payloads = [json.loads(line)["payload"] for line in done.stdout.splitlines()]
        if "ranged-b" in payloads:
            break
        time.sleep(0.25)
    index = payloads.index("ranged-a")
    assert payloads[index : index + 2] == ["ranged-a", "ranged-b"]


def test_cache_commands(felix_fixture: dict[str, Any]) -> None:
    cache = felix_fixture["cache"]
    assert felix(felix_fixture, "cache", "put", cache, "cli-key", "v1").returncode == 0
    done = felix(felix_fixture, "cache", "get", cache, "cli-key")
    assert done.returncode == 0 and done.stdout.strip() == "cli-key: v1"
    done = felix(felix_fixture, "cache", "get", cache, "cli-key", "--json")
    assert json.loads(done.stdout)["payload"] == "v1"
    done = felix(felix_fixture, "cache", "delete", cache, "cli-key")
    assert done.returncode == 0 and done.stdout.strip() == "cli-key: deleted"
    done = felix(felix_fixture, "cache", "get", cache, "cli-key")
    assert done.stdout.strip() == "cli-key: (none)"


def test_cache_watch(felix_fixture: dict[str, Any]) -> None:
    cache = felix_fixture["single_shard_cache"]
    assert felix(felix_fixture, "cache", "put", cache, "w-key", "before").returncode == 0
    done = felix(
        felix_fixture,
        "cache",
        "watch",
        cache,
        "--prefix",
        "w-",
        "--retained",
        "--count",
        "1",
        "--timeout",
        "10",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("w-key: before")


def test_token_from_file_and_env(felix_fixture: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(felix_fixture["token"] + "\n")
    done = felix(felix_fixture, "token", "--json", FELIX_TOKEN="", FELIX_TOKEN_FILE=str(path))
    assert done.returncode == 0, done.stderr
    claims = json.loads(done.stdout)["claims"]
    assert claims["tid"] == felix_fixture["tenant_id"] and claims["sub"] == "fixture"
    done = felix(felix_fixture, "token")
    assert "sub: fixture" in done.stdout and "exp: " in done.stdout
    done = felix(felix_fixture, "token", FELIX_TOKEN="not-a-token")
    assert done.returncode == 2


# -- ordinary mistakes: one line, no traceback, exit 2 (usage) or 1 ------------------

BROKER = [sys.executable, "-m", "felix_broker.cli"]


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    return lines[0]


def test_usage_mistakes_are_one_line(felix_fixture: dict[str, Any]) -> None:
    done = felix(felix_fixture, "publish", "s", "x", "--addr", "localhost")
    assert done.returncode == 2
    assert _one_line(done) == (
        "felix: a broker address is HOST:PORT (e.g. 127.0.0.1:5000), not 'localhost'"
    )
    done = felix(felix_fixture, "subscribe", "s", "--timeout", "-1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    done = felix(felix_fixture, "publish", "s", "x", FELIX_CA_FILE="/no/such/ca.pem")
    assert done.returncode == 2 and "no CA certificate" in _one_line(done)


@pytest.mark.parametrize(
    "args",
    [["--ttl", "0"], ["--perm", ""], ["--perm", "bogus"]],
    ids=["ttl-0", "perm-empty", "perm-bogus"],
)
def test_broker_token_mistakes_are_one_line(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run(
        [*BROKER, "--data-dir", str(tmp_path), "token", "--tenant", "t1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert _one_line(done).startswith("felix-broker token: ")


def test_broker_log_level_is_checked(tmp_path: Path) -> None:
    done = subprocess.run(
        [*BROKER, "--log-level", "verbose", "--data-dir", str(tmp_path), "token", "--tenant", "t"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "invalid choice: 'VERBOSE'" in done.stderr


def test_no_broker_answering_is_named(felix_fixture: dict[str, Any]) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        done = felix(
            felix_fixture, "publish", "s", "x", "--connect-timeout", "0.5",
            FELIX_ADDR=f"127.0.0.1:{port}",
        )  # fmt: skip
    assert done.returncode == 1
    assert _one_line(done).endswith(
        f"no broker answered at 127.0.0.1:{port} within 0.5 s (is it running?)"
    )


def test_a_reader_that_goes_away_is_one_line(felix_fixture: dict[str, Any]) -> None:
    """`felix subscribe | head -1`: the pipe closes after the first line."""
    stream = felix_fixture["memory_stream"]
    sub = subprocess.Popen(
        [*FELIX, "subscribe", stream, "--timeout", "30"],
        env=env_for(felix_fixture),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        deadline = time.monotonic() + 30
        first = ""
        while not first and time.monotonic() < deadline:
            assert felix(felix_fixture, "publish", stream, "pipe").returncode == 0
            time.sleep(0.3)
            import select

            if select.select([sub.stdout], [], [], 0)[0]:
                first = sub.stdout.readline()
        assert first.strip().endswith("pipe")
        sub.stdout.close()  # what head does after its line
        while sub.poll() is None and time.monotonic() < deadline:
            felix(felix_fixture, "publish", stream, "more")
        _, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
    assert sub.returncode == 1
    assert "Traceback" not in err and err.strip() == "felix: output closed by the reader"


def test_subscribe_and_read_cover_every_shard(felix_fixture: dict[str, Any]) -> None:
    """On the 4-shard stream, 8 keyed records reach `felix subscribe` and `felix read`."""
    stream = felix_fixture["durable_stream"]
    tag = f"all-{time.monotonic_ns()}"
    for i in range(8):
        done = felix(felix_fixture, "publish", stream, f"{tag}-{i}", "--key", f"k{i}")
        assert done.returncode == 0, done.stderr
    # From the oldest record of every shard, until nothing comes for 3 s.
    done = felix(
        felix_fixture, "subscribe", stream, "--from", "earliest", "--timeout", "3", "--json"
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    events = [e for e in events if e["payload"].startswith(tag)]
    assert sorted(e["payload"] for e in events) == sorted(f"{tag}-{i}" for i in range(8))
    assert len({e["shard"] for e in events}) == 4
    done = felix(felix_fixture, "read", stream, "--from", "0", "--json")
    assert done.returncode == 0, done.stderr
    read = [json.loads(line) for line in done.stdout.splitlines()]
    mine = [r for r in read if r["payload"].startswith(tag)]
    assert sorted(r["payload"] for r in mine) == sorted(f"{tag}-{i}" for i in range(8))
    assert len({r["shard"] for r in mine}) == 4
