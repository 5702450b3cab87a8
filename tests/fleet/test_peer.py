"""The peer listener and dialer on their own: mutual TLS identities, hello, one answer
per request, and the bounds (frame sizes, in-flight requests, connections, time)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from felix_broker.fleet.peer import (
    PeerDialer,
    PeerLimits,
    PeerListener,
    PeerOrigin,
    PeerProtocolError,
    PeerTls,
    PeerUnavailableError,
)
from felix_transport import generate_ca
from felix_wire.fleet import (
    ForwardAck,
    ForwardPublish,
    ForwardPublishOk,
    PeerMessage,
)

pytestmark = pytest.mark.timeout(30)

CA = generate_ca("peer test fleet")
A = PeerTls.issue(CA, "node-a")
B = PeerTls.issue(CA, "node-b")


def forward(request_id: int, payload: bytes = b"x") -> ForwardPublish:
    return ForwardPublish(
        request_id=request_id,
        token="t",
        tenant_id="t1",
        namespace="default",
        stream="orders",
        shard=0,
        generation=1,
        payloads=[payload],
        ack=ForwardAck.ENQUEUED,
    )


@asynccontextmanager
async def listener(handler, limits: PeerLimits | None = None) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    peer = PeerListener(A, handler, limits)
    await peer.start("127.0.0.1", 0)
    host, port = peer.address
    try:
        yield f"{host}:{port}"
    finally:
        await peer.close()


async def echo(message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
    assert origin.node_id == "node-b"
    return ForwardPublishOk(request_id=message.request_id)  # type: ignore[union-attr]


@pytest.mark.parametrize("impl", ["qh3", "aioquic"])
async def test_one_answer_per_request_from_a_named_peer(impl: str) -> None:
    async with listener(echo) as addr:
        dialer = PeerDialer(B, impl=impl)  # type: ignore[arg-type]
        answers = await asyncio.gather(
            *(dialer.request("node-a", addr, forward(i)) for i in range(20))
        )
        assert answers == [ForwardPublishOk(request_id=i) for i in range(20)]
        await dialer.close()


async def test_the_dialer_checks_the_listener_is_the_node_it_dials() -> None:
    async with listener(echo) as addr:
        dialer = PeerDialer(B)
        with pytest.raises(PeerUnavailableError):
            await dialer.request("node-c", addr, forward(1))  # node-a's certificate answers
        await dialer.close()


async def test_a_frame_over_the_bound_ends_the_stream() -> None:
    limits = PeerLimits(max_frame_bytes=65536)
    async with listener(echo, limits) as addr:
        dialer = PeerDialer(B, limits)
        with pytest.raises((PeerUnavailableError, PeerProtocolError)) as info:
            await dialer.request("node-a", addr, forward(1, b"x" * 100_000))
        if isinstance(info.value, PeerUnavailableError):
            assert info.value.sent
        # The connection still serves requests that fit.
        assert await dialer.request("node-a", addr, forward(2)) == ForwardPublishOk(request_id=2)
        await dialer.close()


async def test_a_request_over_the_hello_cap_sent_with_its_hello_is_served() -> None:
    # The dialer writes hello and request in one go; only the hello is held to
    # PEER_HELLO_MAX_FRAME_BYTES, the request to the cap after hello_ok.
    async with listener(echo) as addr:
        dialer = PeerDialer(B)
        big = forward(1, b"x" * 1_000_000)
        assert await dialer.request("node-a", addr, big) == ForwardPublishOk(request_id=1)
        await dialer.close()


async def test_in_flight_requests_are_bounded_per_connection() -> None:
    release = asyncio.Event()
    running = 0
    most = 0

    async def slow(message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return ForwardPublishOk(request_id=message.request_id)  # type: ignore[union-attr]

    limits = PeerLimits(max_inflight=2)
    async with listener(slow, limits) as addr:
        dialer = PeerDialer(B, PeerLimits(max_inflight=8))
        pending = [
            asyncio.ensure_future(dialer.request("node-a", addr, forward(i))) for i in range(5)
        ]
        for _ in range(100):
            if running == 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert running == 2 and most == 2  # the others wait unread
        release.set()
        assert len(await asyncio.gather(*pending)) == 5
        assert most == 2
        await dialer.close()


async def test_a_peer_that_does_not_answer_in_time_fails_the_request() -> None:
    async def never(message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    async with listener(never) as addr:
        dialer = PeerDialer(B, PeerLimits(request_timeout=0.5))
        with pytest.raises(PeerUnavailableError) as info:
            await dialer.request("node-a", addr, forward(1))
        assert info.value.sent  # its outcome is unknown
        await dialer.close()


async def test_an_unreachable_peer_fails_before_anything_is_sent() -> None:
    dialer = PeerDialer(B, PeerLimits(connect_timeout=0.5))
    with pytest.raises(PeerUnavailableError) as info:
        await dialer.request("node-a", "127.0.0.1:9", forward(1))
    assert not info.value.sent
    await dialer.close()


async def test_connections_beyond_the_bound_are_refused() -> None:
    async with listener(echo, PeerLimits(max_connections=1)) as addr:
        first = PeerDialer(B)
        assert await first.request("node-a", addr, forward(1)) == ForwardPublishOk(request_id=1)
        second = PeerDialer(B)
        with pytest.raises(PeerUnavailableError):
            await second.request("node-a", addr, forward(2))
        await first.close()
        await second.close()


def test_peer_tls_from_files_checks_the_node_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from felix_transport import generate_leaf

    leaf = generate_leaf(CA, dns_names=("node-x",), ip_addresses=(), client_auth=True)
    (tmp_path / "cert.pem").write_bytes(leaf.cert_pem)
    (tmp_path / "key.pem").write_bytes(leaf.key_pem)
    (tmp_path / "ca.pem").write_bytes(CA.cert_pem)
    paths = (tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem")
    tls = PeerTls.from_files("node-x", *paths)
    assert tls.chain_pem.endswith(CA.cert_pem) and tls.ca_pem == CA.cert_pem
    with pytest.raises(ValueError, match="node-y"):
        PeerTls.from_files("node-y", *paths)
