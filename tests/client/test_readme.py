"""Every sh and python snippet of the README's client section runs as written.

The snippets assume `make run` in the repository: a broker on 127.0.0.1:5000
with its data in ./felix-data, and the virtualenv in .venv/. The test runs a
real `felix-broker` on its embedded defaults in a scratch folder (on an
ephemeral loopback port) and runs each snippet there, changing only the port
and where `.venv/bin/` is.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)

SECTION = "## The client"
_BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def client_snippets() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return [(m[1], m[2]) for m in _BLOCK.finditer(text[start : end if end >= 0 else None])]


@pytest.fixture(scope="module")
def readme_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A broker on its embedded defaults in a scratch folder: (folder, address)."""
    cwd = tmp_path_factory.mktemp("readme")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "felix-broker"),
            "--quic-bind",
            "127.0.0.1:0",
            "--metrics-bind",
            "127.0.0.1:0",
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"QUIC on (127\.0\.0\.1:\d+)", line)
        assert found, line
        yield cwd, found[1]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _as_run_here(code: str, addr: str) -> str:
    venv_bin = str(Path(sys.executable).parent) + "/"
    return code.replace("127.0.0.1:5000", addr).replace(".venv/bin/", venv_bin)


def test_the_client_section_has_snippets() -> None:
    kinds = [kind for kind, _ in client_snippets()]
    assert "sh" in kinds and "python" in kinds


def test_every_client_snippet_runs(readme_broker: tuple[Path, str]) -> None:
    cwd, addr = readme_broker
    env = dict(os.environ)
    for name in [n for n in env if n.startswith("FELIX_")]:
        del env[name]  # only what the snippets themselves set
    token = subprocess.run(
        [str(Path(sys.executable).parent / "felix-broker"), "token", "--tenant", "t1"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    for kind, code in client_snippets():
        code = _as_run_here(code, addr)
        started = time.monotonic()
        if kind == "sh":
            done = subprocess.run(
                ["bash", "-e", "-c", code],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        else:
            done = subprocess.run(
                [sys.executable, "-c", code],
                cwd=cwd,
                env={**env, "FELIX_TOKEN": token},
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert done.returncode == 0, (kind, code, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        if kind == "sh":
            # The background subscriber and the publisher share stdout: their lines
            # may interleave, so look for the events, not for whole lines.
            assert "] hello" in done.stdout and "] world" in done.stdout, done.stdout
            assert done.stdout.splitlines()[-1] == "k: v", done.stdout
        else:
            assert done.stdout.startswith("b'hello' on shard 0"), done.stdout
        assert time.monotonic() - started < 30
