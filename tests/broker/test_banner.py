"""The start banner's last line names a way to get a token this broker accepts."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from felix_broker.cli import token_hint
from felix_broker.config import load_config
from felix_common.tokens import DevIssuer, TokenVerifier


def test_a_development_broker_names_its_token_command_with_its_data_folder(
    tmp_path: Path,
) -> None:
    default = load_config(environ={}, cwd=tmp_path)
    assert token_hint(default, cwd=tmp_path) == "a token: felix-broker token --tenant t1"
    elsewhere = load_config(environ={}, overrides={"data_dir": str(tmp_path / "d")}, cwd=tmp_path)
    hint = token_hint(elsewhere, cwd=tmp_path)
    assert hint == f"a token: FELIX_DATA_DIR={tmp_path / 'd'} felix-broker token --tenant t1"


def test_the_suggested_command_mints_a_token_the_broker_verifies(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path / "d")}, cwd=tmp_path)
    command = token_hint(config, cwd=tmp_path).removeprefix("a token: ")
    env, _, rest = command.partition(" ")
    result = subprocess.run(
        [
            "env",
            *shlex.split(env),
            sys.executable,
            "-m",
            "felix_broker.cli",
            *shlex.split(rest)[1:],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    issuer = DevIssuer.load_or_create(tmp_path / "d")
    principal = TokenVerifier(issuer.jwks()).verify(result.stdout.strip(), "t1")
    assert principal.tenant_id == "t1"


def test_a_control_plane_broker_points_at_the_control_plane(tmp_path: Path) -> None:
    config = load_config(
        environ={},
        overrides={"controlplane_url": "http://127.0.0.1:8900/"},
        cwd=tmp_path,
    )
    hint = token_hint(config, cwd=tmp_path)
    assert "http://127.0.0.1:8900/v1/tenants/TENANT/tokens" in hint
    assert "token/exchange" in hint and "development tokens are refused" in hint
    assert "felix-broker token" not in hint


def test_a_broker_with_an_external_issuer_names_its_keys(tmp_path: Path) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    config = load_config(environ={}, overrides={"jwks_path": str(jwks)}, cwd=tmp_path)
    hint = token_hint(config, cwd=tmp_path)
    assert str(jwks) in hint and "felix-broker token" not in hint
