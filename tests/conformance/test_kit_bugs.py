"""Regression tests for the kit's own bugs named in issue 17, one per bug."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import felix_conformance.cli as cli
from felix_conformance.corpus import load_corpus, load_file, select
from felix_conformance.recorder import Recorder, recorder_from_args
from felix_conformance.runner import run_case
from felix_conformance.target import Target, probe, target_from_fixture
from felix_conformance.verdicts import Verdict
from felix_transport import generate_ca

pytestmark = pytest.mark.timeout(120)


def test_record_keep_idle_reaches_the_recorder(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(generate_ca("test CA").cert_pem)
    common = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:5000", "--ca-file", str(ca)]
    kept, _, _ = recorder_from_args([*common, "--out", str(tmp_path / "a"), "--keep-idle"])
    dropped, _, _ = recorder_from_args([*common, "--out", str(tmp_path / "b")])
    assert kept.keep_idle is True
    assert dropped.keep_idle is False


async def test_recorded_counter_values_replay_by_shape(
    reference_target: Target, tmp_path: Path
) -> None:
    """A counter's sum is the broker's choice: a recording of it must pass again
    on the broker it was recorded on, where the sum has since grown."""
    recorder = Recorder(reference_target, tmp_path, variables=reference_target.variables)
    host, port = await recorder.start()
    try:
        relayed = Target(host, port, recorder.relay.ca_pem, "localhost", reference_target.variables)
        advertised = await probe(relayed)
        (case,) = select(load_corpus(), ["gated.counters"])
        first = await run_case(case, relayed, advertised)
        assert first.verdict is Verdict.PASS, first.detail
        for _ in range(100):
            if recorder.written:
                break
            await asyncio.sleep(0.1)
    finally:
        await recorder.close()
    assert len(recorder.written) == 1, recorder.written
    recorded = load_file(recorder.written[0])
    again = await run_case(recorded, reference_target, await probe(reference_target))
    assert again.verdict is Verdict.PASS, (again.detail, again.wire_log)
    assert "$type: integer" in recorder.written[0].read_text()


def test_fixture_ca_file_is_relative_to_the_fixture(
    felix_fixture: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "fixture-folder"
    folder.mkdir()
    (folder / "ca.pem").write_bytes(Path(str(felix_fixture["ca_file"])).read_bytes())
    (folder / "fx.json").write_text(json.dumps({**felix_fixture, "ca_file": "ca.pem"}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    target = target_from_fixture(Path("..") / "fixture-folder" / "fx.json")
    assert target.ca_pem == (folder / "ca.pem").read_bytes()


def test_the_cli_docstring_names_only_real_options() -> None:
    doc = cli.__doc__ or ""
    usage = re.findall(r"^ {4}felix-conformance(.*(?:\n {8}.*)*)", doc, re.MULTILINE)
    assert len(usage) >= 5
    parsers = cli.parsers()
    for line in usage:
        words = line.split()
        command = words[0] if words and words[0] in parsers else ""
        known = set(parsers[command]._option_string_actions)
        for option in re.findall(r"--[a-z][a-z-]*", line):
            assert option in known, f"`felix-conformance {command}` has no {option}"


def test_serve_writes_no_ca_into_the_working_directory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "felix_conformance.cli", "serve", "--listen", "127.0.0.1:0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert "trust " in line, line
        ca = Path(line.rsplit("trust ", 1)[1].strip())
        assert ca.is_file() and tmp_path not in ca.parents
        assert list(tmp_path.iterdir()) == []
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
    assert list(tmp_path.iterdir()) == []
    assert not ca.exists()  # the temporary folder went away with the server
