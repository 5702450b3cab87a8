"""The README's conformance-kit commands, run word for word against our broker."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def readme_kit_block() -> str:
    """The first shell block of the README's conformance-kit section."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## The conformance kit") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


@pytest.mark.timeout(420)
def test_the_readme_kit_commands_pass_word_for_word(tmp_path: Path) -> None:
    block = readme_kit_block()
    assert "felix-conformance --target" in block and "--profile" in block
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    (tmp_path / "conformance").symlink_to(REPO / "conformance")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FELIX_")}
    env.pop("FORCE_COLOR", None)
    script = "set -euo pipefail\n" + block
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, (done.stdout[-6000:], done.stderr[-3000:])
    out = done.stdout
    # The first run names no stream: those cases are "setup", none fails.
    first = out[: out.index("wrote profile.yaml")]
    assert re.search(r"setup [1-9]", first), first[-2000:]
    assert "fail 0" in first
    later = out[out.index("wrote profile.yaml") :]
    assert "setup 0" in later and "fail 0" in later, later[-3000:]
    assert "20 cases: pass 20, fail 0, unsupported 0" in out  # the client tester's run
    for produced in (
        "profile.yaml", "report.html", "report.json", "report.xml", "logs", "client.html"
    ):  # fmt: skip
        assert (tmp_path / produced).exists(), produced
