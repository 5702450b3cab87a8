"""The README's conformance-kit commands, run word for word against our broker."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from felix_conformance.clienttest.cases import CLIENT_CASES
from felix_conformance.corpus import load_corpus

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
    # Summaries of the runs after the profile: --profile, --fixture, then the client tester.
    summaries = re.findall(
        r"(\d+) cases: pass (\d+), fail (\d+), unsupported \d+, setup (\d+)", later
    )
    assert len(summaries) == 3, later[-3000:]
    # With the profile only the cases the single-broker fixture cannot serve are setup:
    # those needing a fleet and those needing a stream that stores publishers.
    beyond = [c for c in load_corpus() if c.min_brokers > 1 or "publisher_stream" in c.variables]
    for _total, _passed, failed, setup in summaries[:2]:
        assert failed == "0" and int(setup) == len(beyond), later[-3000:]
    total, passed, failed, setup = summaries[2]  # the client tester's run
    assert total == passed == str(len(CLIENT_CASES)) and failed == setup == "0"
    for produced in (
        "profile.yaml", "report.html", "report.json", "report.xml", "logs", "client.html"
    ):  # fmt: skip
        assert (tmp_path / produced).exists(), produced
