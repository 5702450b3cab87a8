"""UDP GSO/GRO in the datagram loop: fewer system calls, the same bytes, and the
fallback when the kernel refuses a segmented send."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
import sys

import pytest

from felix_transport import (
    CertKeyPair,
    Connection,
    ConnectionClosedError,
    StreamClosedError,
    TransportConfig,
    connect,
    generate_ca,
    generate_leaf,
    serve,
    udp,
)
from felix_transport.endpoint import _Endpoint

IMPLS = ["qh3", "aioquic"]
HOST = "127.0.0.1"

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="UDP GSO/GRO are Linux options")

A = ("127.0.0.1", 1)
B = ("127.0.0.1", 2)


def test_runs_keep_order_and_end_at_a_shorter_segment() -> None:
    datagrams = [(b"a" * 10, A), (b"b" * 10, A), (b"c" * 4, A), (b"d" * 10, A), (b"e" * 10, A)]
    assert udp.gso_runs(datagrams) == [
        (A, 10, [b"a" * 10, b"b" * 10, b"c" * 4]),
        (A, 10, [b"d" * 10, b"e" * 10]),
    ]


def test_runs_split_at_a_longer_segment_and_an_address_change() -> None:
    datagrams = [(b"a" * 5, A), (b"b" * 9, A), (b"c" * 9, B), (b"d" * 9, B)]
    assert udp.gso_runs(datagrams) == [
        (A, 5, [b"a" * 5]),
        (A, 9, [b"b" * 9]),
        (B, 9, [b"c" * 9, b"d" * 9]),
    ]


def test_runs_respect_the_segment_and_byte_caps() -> None:
    small = [(b"x" * 100, A)] * (udp.MAX_SEGMENTS + 3)
    assert [len(run) for _, _, run in udp.gso_runs(small)] == [udp.MAX_SEGMENTS, 3]
    big = [(b"y" * 1350, A)] * 60  # 48 x 1350 = 64,800 fits; 49 would not
    sizes = [len(run) for _, _, run in udp.gso_runs(big)]
    assert sizes == [48, 12]
    assert all(sum(map(len, run)) <= udp.MAX_GSO_BYTES for _, _, run in udp.gso_runs(big))


def test_split_gro_cuts_at_the_reported_segment_size() -> None:
    cmsg = [(udp.SOL_UDP, udp.UDP_GRO, struct.pack("=i", 4))]
    assert udp.split_gro(b"aaaabbbbcc", cmsg) == [b"aaaa", b"bbbb", b"cc"]
    assert udp.split_gro(b"aaaa", cmsg) == [b"aaaa"]
    assert udp.split_gro(b"aaaabbbb", []) == [b"aaaabbbb"]


@linux_only
def test_one_sendmsg_arrives_as_separate_datagrams_on_loopback() -> None:
    """The kernel really splits a GSO send (and a GRO socket really glues them)."""
    for gro in (False, True):
        receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            receiver.bind((HOST, 0))
            receiver.settimeout(5)
            if gro:
                assert udp.enable_gro(receiver)
            assert udp.gso_supported(sender)
            run = [bytes([i]) * 1000 for i in range(5)] + [b"z" * 10]
            udp.send_gso(sender, receiver.getsockname(), 1000, run)
            got: list[bytes] = []
            while len(got) < len(run):
                data, ancdata, _, _ = receiver.recvmsg(65535, udp.gro_cmsg_space())
                got.extend(udp.split_gro(data, ancdata))
            assert got == run
        finally:
            receiver.close()
            sender.close()


@pytest.fixture(scope="module")
def pki() -> tuple[CertKeyPair, CertKeyPair]:
    ca = generate_ca()
    return ca, generate_leaf(ca)


async def _upload(
    pki: tuple[CertKeyPair, CertKeyPair],
    impl: str,
    *,
    size: int,
    refuse_gso: bool = False,
    **kw: object,
) -> _Endpoint:
    """Send ``size`` bytes client -> server on one stream; the server answers the
    digest. Returns the client's endpoint (its send counters)."""
    payload = os.urandom(size)

    async def digest(conn: Connection) -> None:
        with contextlib.suppress(ConnectionClosedError, StreamClosedError):
            stream = await conn.accept_stream()
            hasher = hashlib.sha256()
            while chunk := await stream.read():
                hasher.update(chunk)
            await stream.write(hasher.digest(), end_stream=True)

    ca, leaf = pki
    server_config = TransportConfig.server(
        leaf.cert_pem + ca.cert_pem, leaf.key_pem, impl=impl, **kw
    )
    server = await serve(server_config, HOST, 0, digest)
    try:
        config = TransportConfig.client(ca.cert_pem, impl=impl, **kw)
        conn = await connect(config, HOST, server.address[1])
        driver = conn._driver
        assert isinstance(driver, _Endpoint)
        if refuse_gso:
            # SO_NO_CHECK: the kernel refuses every segmented send on this socket
            # (EINVAL), as a kernel or device without GSO would.
            driver._sock.setsockopt(socket.SOL_SOCKET, 11, 1)  # SO_NO_CHECK
            driver.send_calls = driver.datagrams_sent = 0
        stream = await conn.open_bidi_stream()
        async with asyncio.timeout(30):
            for start in range(0, size, 64 * 1024):
                await stream.write(payload[start : start + 64 * 1024])
            await stream.finish()
            answer = b""
            while chunk := await stream.read():
                answer += chunk
        assert answer == hashlib.sha256(payload).digest()
        conn.close()
        return driver
    finally:
        server.close()
        await server.wait_closed()


@linux_only
@pytest.mark.timeout(60)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gro", [True, False])
async def test_a_bulk_upload_uses_fewer_send_calls_than_datagrams(
    pki: tuple[CertKeyPair, CertKeyPair], impl: str, gro: bool
) -> None:
    driver = await _upload(pki, impl, size=2 * 1024 * 1024, udp_gro=gro)
    assert driver.gso
    assert driver.datagrams_sent > 1500  # 2 MiB in 1350-byte datagrams
    assert driver.send_calls * 2 < driver.datagrams_sent, (driver.send_calls, driver.datagrams_sent)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("impl", IMPLS)
async def test_gso_off_sends_one_datagram_per_call(
    pki: tuple[CertKeyPair, CertKeyPair], impl: str
) -> None:
    driver = await _upload(pki, impl, size=512 * 1024, udp_gso=False, udp_gro=False)
    assert not driver.gso
    assert driver.send_calls == driver.datagrams_sent > 300


@linux_only
@pytest.mark.timeout(60)
@pytest.mark.parametrize("impl", IMPLS)
async def test_a_refused_gso_send_falls_back_once_and_loses_nothing(
    pki: tuple[CertKeyPair, CertKeyPair], impl: str
) -> None:
    driver = await _upload(pki, impl, size=1024 * 1024, refuse_gso=True)
    assert not driver.gso  # detected once, then one datagram per call
    assert driver.send_calls == driver.datagrams_sent
