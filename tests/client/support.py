"""Helpers for the client tests against the fixture broker: the `felix` command line
with the fixture's address, tenant, token and CA, and an operator token minted
through the fixture's control endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

from felix_broker.cli import full_rights

FELIX = [sys.executable, "-m", "felix_client.cli"]


def env_for(doc: dict[str, Any], **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FELIX_ADDR=",".join(doc["addrs"]),
        FELIX_TENANT=doc["tenant_id"],
        FELIX_TOKEN=doc["token"],
        FELIX_CA_FILE=doc["ca_file"],
        FELIX_NAMESPACE=doc["namespace"],
    )
    env.update(extra)
    return env


def felix(doc: dict[str, Any], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FELIX, *args], env=env_for(doc, **extra), capture_output=True, text=True, timeout=60
    )


VIEW = "node.view:cluster:*"


def _mint(doc: dict[str, Any], perms: list[str]) -> str:
    body = json.dumps({"ttl_secs": 600, "perms": perms}).encode()
    request = urllib.request.Request(
        doc["control_url"] + "/tokens",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["token"])


async def operator_token(doc: dict[str, Any], extra: str = VIEW) -> str:
    return await asyncio.to_thread(_mint, doc, [*full_rights(doc["tenant_id"]), extra])
