"""A broker started against a control plane says, on start, where its tokens come from."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .support import SYNC_TOKEN, control_plane

pytestmark = pytest.mark.timeout(60)


async def test_the_banner_of_a_control_plane_broker_names_the_control_plane(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "sync-token"
    token_file.write_text(SYNC_TOKEN)
    async with control_plane(tmp_path) as plane:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "felix_broker.cli",
                *("--data-dir", str(tmp_path / "broker")),
                *("--quic-bind", "127.0.0.1:0", "--metrics-bind", "127.0.0.1:0"),
                *("--set", f"controlplane_url={plane.url}"),
                *("--set", f"controlplane_sync_token_file={token_file}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            lines = [await asyncio.to_thread(process.stdout.readline) for _ in range(3)]
            assert "QUIC on 127.0.0.1:" in lines[0], lines
            assert f"POST {plane.url}/v1/tenants/TENANT/tokens" in lines[2]
            assert "felix-broker token" not in lines[2]
        finally:
            process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.wait, 20) == 0
