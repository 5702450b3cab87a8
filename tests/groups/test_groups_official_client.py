"""Consumer groups through the official client (felix-client 0.6.2) against an in-process
broker; the client is synchronous, so it runs in a thread."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ..broker.harness import running_broker
from ..fleet.harness import TOPOLOGIES, leader_of
from ..support.wire import NS, TENANT, token

felix = pytest.importorskip("felix", reason="the official felix-client package")

pytestmark = pytest.mark.timeout(90)


def scenario(addr: str, ca: str, tok: str) -> dict[str, Any]:
    client = felix.Client([addr], tenant_id=TENANT, token=tok, ca_file=ca)
    for payload in (b"one", b"two", b"three"):
        client.publish(TENANT, NS, "log", payload)
    scope = (TENANT, NS, "log", 0, "workers")
    records = client.group_poll(*scope, max_records=10, wait=1.0)
    got = [(r.offset, r.payload, r.attempts) for r in records]
    client.group_ack(*scope, records[0].offset)
    client.group_nack(*scope, records[1])
    again = client.group_poll(*scope, max_records=10, wait=1.0)
    redelivered = [(r.offset, r.attempts) for r in again]
    stale = ""
    try:
        client.group_nack(*scope, records[1])  # that delivery no longer holds a claim
    except felix.FelixError as exc:
        stale = str(exc)
    for record in again:
        client.group_ack(*scope, record.offset)
    empty = client.group_poll(*scope, max_records=10, wait=0.2)
    return {"got": got, "redelivered": redelivered, "stale": stale, "empty": empty}


def dead_letters(addr: str, ca: str, tok: str) -> list[list[int]]:
    client = felix.Client([addr], tenant_id=TENANT, token=tok, ca_file=ca)
    scope = (TENANT, NS, "log", 0, "workers")
    seen = [list(client.group_dead_letters(*scope))]
    client.group_redrive(*scope, 2)
    seen.append(list(client.group_dead_letters(*scope)))
    records = client.group_poll(*scope, max_records=10, wait=1.0)
    seen.append([r.offset for r in records])
    return seen


def discard(addr: str, ca: str, tok: str) -> list[int]:
    client = felix.Client([addr], tenant_id=TENANT, token=tok, ca_file=ca)
    scope = (TENANT, NS, "log", 0, "workers")
    client.group_discard(*scope, 2)
    return list(client.group_dead_letters(*scope))


def trusted(broker: Any, tmp: Path) -> str:
    """One CA file for the broker reached and, in a fleet, the owner it redirects to
    (each in-process member has its own TLS material)."""
    paths = dict.fromkeys([broker.ca_path, leader_of(broker).ca_path])
    bundle = tmp / "trusted.pem"
    bundle.write_text("".join(Path(p).read_text() for p in paths))
    return str(bundle)


# In a fleet the client is given only the broker reached: through a non-owner its
# publishes are forwarded and its group requests redirected (not_leader) to the owner.
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_official_client_groups(tmp_path: Path, topology: str) -> None:
    async with running_broker(
        tmp_path, topology=topology, group_visibility_timeout_ms=1500, group_max_attempts=2
    ) as broker:
        assert broker.ca_path is not None
        addr, tok = f"127.0.0.1:{broker.quic_port}", token(broker)
        ca = trusted(broker, tmp_path)
        result = await asyncio.to_thread(scenario, addr, ca, tok)
        assert result["got"] == [(0, b"one", 1), (1, b"two", 1), (2, b"three", 1)]
        assert result["redelivered"] == [(1, 2)]
        assert "no longer holds a claim" in result["stale"]
        assert result["empty"] == []
        # Offset 2 is still claimed: let it lapse, nack it past max attempts.
        await asyncio.to_thread(dead_letter_by_nacks, addr, ca, tok)
        seen = await asyncio.to_thread(dead_letters, addr, ca, tok)
        assert seen == [[2], [], [2]]  # listed; redriven; owed again
        await asyncio.to_thread(dead_letter_by_nacks, addr, ca, tok)
        assert await asyncio.to_thread(discard, addr, ca, tok) == []


def dead_letter_by_nacks(addr: str, ca: str, tok: str) -> None:
    client = felix.Client([addr], tenant_id=TENANT, token=tok, ca_file=ca)
    scope = (TENANT, NS, "log", 0, "workers")
    for _ in range(10):
        if list(client.group_dead_letters(*scope)) == [2]:
            return
        for record in client.group_poll(*scope, max_records=10, wait=1.0):
            client.group_nack(*scope, record)
    raise AssertionError("offset 2 was never dead-lettered")
