"""Test-mode partitions in the peer layer: the fault file's ``peer_blocked_out`` and
``peer_blocked_in`` honoured by the real dialer and listener (QUIC, mutual TLS,
loopback), one way at a time, per pair of nodes, and healed by clearing the file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from felix_broker.chaos.faults import RECHECK_S, FaultFile, Faults, write_fault
from felix_broker.fleet.peer import (
    LinkFaults,
    PeerDialer,
    PeerListener,
    PeerOrigin,
    PeerTls,
    PeerUnavailableError,
)
from felix_transport import generate_ca
from felix_wire.fleet import ForwardAck, ForwardPublish, ForwardPublishOk, PeerMessage

pytestmark = pytest.mark.timeout(30)

CA = generate_ca("peer partition fleet")
A = PeerTls.issue(CA, "node-a")
B = PeerTls.issue(CA, "node-b")
C = PeerTls.issue(CA, "node-c")


def forward(request_id: int) -> ForwardPublish:
    return ForwardPublish(
        request_id=request_id,
        token="t",
        tenant_id="t1",
        namespace="default",
        stream="orders",
        shard=0,
        generation=1,
        payloads=[b"x"],
        ack=ForwardAck.ENQUEUED,
    )


class Served:
    """node-a's handler: records every request that reached it (took effect)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        assert isinstance(message, ForwardPublish)
        self.seen.append((origin.node_id, message.request_id))
        return ForwardPublishOk(request_id=message.request_id)


@asynccontextmanager
async def node_a(served: Served, faults: LinkFaults | None) -> AsyncIterator[str]:
    peer = PeerListener(A, served, faults=faults)
    await peer.start("127.0.0.1", 0)
    host, port = peer.address
    try:
        yield f"{host}:{port}"
    finally:
        await peer.close()


async def set_faults(path: Path, faults: Faults) -> None:
    write_fault(path, faults)
    await asyncio.sleep(RECHECK_S * 2)  # the file is reread at most once per RECHECK_S


async def test_a_dialer_blocking_out_sends_nothing_until_healed(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    served = Served()
    async with node_a(served, None) as addr:
        dialer = PeerDialer(B, faults=FaultFile(path))
        assert await dialer.request("node-a", addr, forward(1)) == ForwardPublishOk(request_id=1)
        await set_faults(path, Faults(blocked_out=frozenset({"node-a"})))
        with pytest.raises(PeerUnavailableError) as lost:
            await dialer.request("node-a", addr, forward(2))
        assert not lost.value.sent
        with pytest.raises(PeerUnavailableError) as no_pipe:
            await dialer.pipe("node-a", addr)
        assert not no_pipe.value.sent
        await set_faults(path, Faults())
        assert await dialer.request("node-a", addr, forward(3)) == ForwardPublishOk(request_id=3)
        assert served.seen == [("node-b", 1), ("node-b", 3)]
        await dialer.close()


async def test_a_listener_blocking_in_drops_that_nodes_requests_unseen(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    served = Served()
    async with node_a(served, FaultFile(path)) as addr:
        await set_faults(path, Faults(blocked_in=frozenset({"node-b"})))
        from_b, from_c = PeerDialer(B), PeerDialer(C)
        with pytest.raises(PeerUnavailableError) as lost:
            await from_b.request("node-a", addr, forward(1))
        assert lost.value.sent  # the dialer cannot know it was lost unseen
        # Pairwise: another node still reaches node-a.
        assert await from_c.request("node-a", addr, forward(2)) == ForwardPublishOk(request_id=2)
        assert served.seen == [("node-c", 2)]
        await set_faults(path, Faults())
        assert await from_b.request("node-a", addr, forward(3)) == ForwardPublishOk(request_id=3)
        assert served.seen == [("node-c", 2), ("node-b", 3)]
        await from_b.close()
        await from_c.close()


async def test_a_listener_blocking_out_serves_the_request_but_loses_its_answer(
    tmp_path: Path,
) -> None:
    """One way: node-b -> node-a is open (node-a hears it and acts), node-a -> node-b
    is cut (node-b never hears back: an unknown outcome)."""
    path = tmp_path / "a.json"
    served = Served()
    async with node_a(served, FaultFile(path)) as addr:
        await set_faults(path, Faults(blocked_out=frozenset({"node-b"})))
        dialer = PeerDialer(B)
        with pytest.raises(PeerUnavailableError) as lost:
            await dialer.request("node-a", addr, forward(1))
        assert lost.value.sent
        assert served.seen == [("node-b", 1)]
        pipe = await dialer.pipe("node-a", addr)
        with pytest.raises(PeerUnavailableError):
            await pipe.answer(await pipe.send(forward(2)))
        assert served.seen == [("node-b", 1), ("node-b", 2)]
        await set_faults(path, Faults())
        assert await dialer.request("node-a", addr, forward(3)) == ForwardPublishOk(request_id=3)
        await dialer.close()


async def test_a_dialer_blocking_in_loses_the_answers_of_requests_that_took_effect(
    tmp_path: Path,
) -> None:
    path = tmp_path / "b.json"
    served = Served()
    async with node_a(served, None) as addr:
        dialer = PeerDialer(B, faults=FaultFile(path))
        await set_faults(path, Faults(blocked_in=frozenset({"node-a"})))
        with pytest.raises(PeerUnavailableError) as lost:
            await dialer.request("node-a", addr, forward(1))
        assert lost.value.sent
        pipe = await dialer.pipe("node-a", addr)  # the stream opens: node-b -> node-a is open
        sent = await pipe.send(forward(2))
        with pytest.raises(PeerUnavailableError):
            await pipe.answer(sent)
        assert not pipe.usable
        assert served.seen == [("node-b", 1), ("node-b", 2)]
        # A pipe that was working breaks at the first message lost out.
        await set_faults(path, Faults())
        pipe = await dialer.pipe("node-a", addr)
        assert await pipe.answer(await pipe.send(forward(3))) == ForwardPublishOk(request_id=3)
        await set_faults(path, Faults(blocked_out=frozenset({"node-a"})))
        with pytest.raises(PeerUnavailableError) as unsent:
            await pipe.send(forward(4))
        assert not unsent.value.sent and not pipe.usable
        assert served.seen == [("node-b", 1), ("node-b", 2), ("node-b", 3)]
        await dialer.close()
