"""`felix-controlplane`: its help, and the ready file a script that binds port 0 reads."""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from felix_controlplane.cli import build_parser, main, parse_args, run

pytestmark = pytest.mark.timeout(30)


def test_help_describes_every_option_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    # --help and --version are argparse's own actions: they take no value, so no default.
    own = (argparse._HelpAction, argparse._VersionAction)
    actions = build_parser()._actions
    assert any(isinstance(a, argparse._VersionAction) for a in actions)
    assert "--version" in text
    options = [a for a in actions if not isinstance(a, own)]
    assert len(options) >= 12
    for action in options:
        assert action.help, f"{action.option_strings} has no help"
        assert "default" in action.help, f"{action.option_strings} does not say its default"
        for flag in action.option_strings:
            assert flag in text
    # The defaults shown are the real ones.
    for shown in ("felix-controlplane.db", "127.0.0.1:8900", "127.0.0.1:8901", "900", "3600"):
        assert shown in text
    assert "FELIX_CONTROLPLANE_SYNC_TOKEN" in text and "/v1/bootstrap" in text


def test_usage_mistakes_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--bind", "nowhere"], ["--token-ttl", "0"], ["--log-level", "verbose"]):
        with pytest.raises(SystemExit) as stopped:
            parse_args(argv)
        assert stopped.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


async def test_the_ready_file_names_both_listeners(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    args = parse_args(
        [
            *("--db", str(tmp_path / "cp.db")),
            *("--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"),
            *("--ready-file", str(ready)),
        ]
    )
    stop = asyncio.Event()
    plane = asyncio.get_running_loop().create_task(run(args, stop))
    try:
        async with asyncio.timeout(10):
            while not ready.exists():
                await asyncio.sleep(0.02)
        urls = json.loads(ready.read_text())
        assert set(urls) == {"url", "admin_url"}
        secret = (tmp_path / "cp.db.bootstrap-secret").read_text().strip()
        request = urllib.request.Request(
            f"{urls['admin_url']}/v1/tenants", headers={"Authorization": f"Bearer {secret}"}
        )

        def get() -> dict[str, object]:
            with urllib.request.urlopen(request, timeout=5) as response:
                answer: dict[str, object] = json.loads(response.read())
                return answer

        assert (await asyncio.to_thread(get))["items"] == []
    finally:
        stop.set()
        await plane
