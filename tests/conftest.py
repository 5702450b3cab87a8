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
    errors = process.stderr.read().decode(errors="replace") if process.stderr else ""
    found = [line for line in errors.splitlines() if any(m in line for m in ASYNCIO_WARNINGS)]
    if found:
        pytest.fail("the fixture broker logged asyncio warnings:\n" + "\n".join(found[:20]))


# --- asyncio must stay silent (issue 20, finding 9) ----------------------------------
# A task destroyed while pending, an exception nobody retrieved, or a callback that
# raised is a bug even when the test's assertions pass. The asyncio logger says so
# at ERROR (often only when the object is garbage-collected), so every test ends with
# a collection and fails if anything was logged.

import gc  # noqa: E402
import logging  # noqa: E402

ASYNCIO_WARNINGS = (
    "Task was destroyed but it is pending",
    "Task exception was never retrieved",
    "Future exception was never retrieved",
    "Exception in callback",
)


class AsyncioErrors(logging.Handler):
    """Collects what the asyncio logger reports at ERROR or above."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        self.messages.append(text)


ASYNCIO_ERRORS = AsyncioErrors()
logging.getLogger("asyncio").addHandler(ASYNCIO_ERRORS)


@pytest.fixture(autouse=True)
def _no_asyncio_errors() -> Iterator[None]:
    gc.collect()
    ASYNCIO_ERRORS.messages.clear()
    yield
    gc.collect()
    found, ASYNCIO_ERRORS.messages[:] = list(ASYNCIO_ERRORS.messages), []
    if found:
        pytest.fail("asyncio reported:\n" + "\n".join(found[:20]), pytrace=False)


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
