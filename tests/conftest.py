"""Shared test settings: hypothesis profiles and a real broker process for client and kit tests."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# --- a real broker process for client and kit tests ---------------------------------

import json  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402


def start_fixture_broker(
    tmp: Path, *extra_env: tuple[str, str], args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run `felix-broker fixture` and return the process and its fixture document."""
    out = tmp / "fixture.json"
    env = dict(os.environ)
    env.update(extra_env)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "felix_broker.cli",
            "fixture",
            "--out",
            str(out),
            "--ca-file",
            str(tmp / "ca.pem"),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 30
    while not out.exists():
        if process.poll() is not None:
            errors = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"felix-broker fixture exited: {errors}")
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError("felix-broker fixture did not start within 30 s")
        time.sleep(0.05)
    document: dict[str, Any] = json.loads(out.read_text())
    return process, document


def stop_fixture_broker(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@pytest.fixture(scope="session")
def felix_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fixture document of one reference broker shared by a test session
    (`addrs`, `tenant_id`, `namespace`, `token`, `unauthorized_token`, `ca_file`,
    `durable_stream`, `memory_stream`, `cache`, `single_shard_cache`,
    `missing_stream`, `control_url`, `http_url`)."""
    process, document = start_fixture_broker(tmp_path_factory.mktemp("felix-broker"))
    try:
        yield document
    finally:
        stop_fixture_broker(process)
