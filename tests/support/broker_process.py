"""A broker as its own OS process, for the tests that kill it with SIGKILL: a durable
single-shard stream `log` under on_commit fsync, files kept in `tmp/data` across
restarts on the same port, stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CRASH_CONFIG", "broker_process", "free_udp_port"]

CRASH_CONFIG = """
catalog:
  tenants:
    t1:
      namespaces:
        default:
          streams:
            log: {durable: true, shards: 1}
"""


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 now (a restarted broker binds the same one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def broker_process(
    tmp: Path, port: int, *, end: signal.Signals = signal.SIGKILL, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`felix-broker` on `port` with CRASH_CONFIG and its data in `tmp / "data"`,
    started (its first line printed) when this enters; ended with `end` (SIGKILL by
    default) when it leaves. `env` adds FELIX_* settings."""
    config = tmp / "broker.yaml"
    config.write_text(CRASH_CONFIG)
    data = tmp / "data"
    environ = dict(
        os.environ,
        FELIX_DURABLE_FSYNC_MODE="on_commit",
        FELIX_DURABLE_STORAGE_DIR=str(data / "durable"),
    )
    environ.update(env)
    process = subprocess.Popen(
        [
            sys.executable,
            *("-m", "felix_broker.cli", "--config", str(config), "--data-dir", str(data)),
            *("--quic-bind", f"127.0.0.1:{port}", "--metrics-bind", "127.0.0.1:0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environ,
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()  # started
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(end)
        process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()
