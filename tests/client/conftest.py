"""Client test helpers: a connected client against the session's reference broker."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import felix_client


async def connect_client(doc: dict[str, Any], **options: Any) -> felix_client.Client:
    token = options.pop("token", doc["token"])
    return await felix_client.connect(
        doc["addrs"],
        tenant_id=doc["tenant_id"],
        token=token,
        namespace=doc["namespace"],
        ca_file=doc["ca_file"],
        **options,
    )


def mint_token(doc: dict[str, Any], *, ttl_secs: int = 3600, forged: bool = False) -> str:
    body = json.dumps({"ttl_secs": ttl_secs, "forged": forged}).encode()
    request = urllib.request.Request(
        doc["control_url"] + "/tokens",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["token"])


async def amint_token(doc: dict[str, Any], **options: Any) -> str:
    return await asyncio.to_thread(mint_token, doc, **options)


@pytest.fixture(autouse=True)
def no_stray_asyncio_complaints(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test after which asyncio complained (a future's exception never
    retrieved, a task destroyed while pending, an exception in a callback)."""
    yield
    gc.collect()
    complaints = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.WARNING]
    assert not complaints, "\n".join(r.getMessage() for r in complaints)


@pytest.fixture
async def client(felix_fixture: dict[str, Any]) -> AsyncIterator[felix_client.Client]:
    c = await connect_client(felix_fixture)
    try:
        yield c
    finally:
        await c.aclose()
