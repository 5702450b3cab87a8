"""Mutual TLS through felix_transport: a server with `client_ca_pem` completes the
handshake only for a client presenting a certificate signed by that CA; both sides
then see the other's leaf. The server side is aioquic (qh3 2.1 cannot request client
certificates and its configuration says so); clients run on both stacks."""

from __future__ import annotations

import asyncio

import pytest
from cryptography import x509

from felix_transport import (
    ConnectionClosedError,
    TransportConfig,
    connect,
    generate_ca,
    generate_leaf,
    serve,
)

HOST = "127.0.0.1"
IMPLS = ["qh3", "aioquic"]


async def _refused_with(config: TransportConfig, port: int) -> int:
    """The TLS alert a refused handshake ends with. In TLS 1.3 the client's side of
    the handshake may complete before the server has judged the client's
    certificate; the server's close then follows at once."""
    try:
        conn = await connect(config, HOST, port)
    except ConnectionClosedError as exc:
        return exc.error_code - 0x100
    async with asyncio.timeout(5):
        await conn.wait_closed()
    assert conn.termination is not None
    return conn.termination.error_code - 0x100


def _dns_names(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


async def _server(client_ca_pem: bytes) -> tuple[object, asyncio.Queue[object]]:
    ca, leaf = _fleet["ca"], _fleet["server"]
    accepted: asyncio.Queue[object] = asyncio.Queue()

    async def keep(conn):  # type: ignore[no-untyped-def]
        await accepted.put(conn)
        await conn.wait_closed()

    config = TransportConfig.server(
        leaf.cert_pem + ca.cert_pem, leaf.key_pem, impl="aioquic", client_ca_pem=client_ca_pem
    )
    server = await serve(config, HOST, 0, keep)
    return server, accepted


_ca = generate_ca("fleet ca")
_fleet = {
    "ca": _ca,
    "server": generate_leaf(_ca, dns_names=("node-a",), client_auth=True),
    "client": generate_leaf(_ca, dns_names=("node-b",), client_auth=True),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("impl", IMPLS)
async def test_both_sides_see_the_other_certificate(impl: str) -> None:
    ca, client = _fleet["ca"], _fleet["client"]
    server, accepted = await _server(ca.cert_pem)
    try:
        config = TransportConfig.client(
            ca.cert_pem,
            impl=impl,
            server_name="node-a",
            certificate_chain_pem=client.cert_pem + ca.cert_pem,
            private_key_pem=client.key_pem,
        )
        conn = await connect(config, HOST, server.address[1])  # type: ignore[attr-defined]
        async with asyncio.timeout(5):
            server_conn = await accepted.get()
        assert conn.peer_certificate is not None
        assert _dns_names(conn.peer_certificate) == ["node-a"]
        seen = server_conn.peer_certificate  # type: ignore[attr-defined]
        assert seen is not None and _dns_names(seen) == ["node-b"]
        conn.close()
        await conn.wait_closed()
    finally:
        server.close()  # type: ignore[attr-defined]
        await server.wait_closed()  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("impl", IMPLS)
async def test_a_client_without_a_certificate_is_refused(impl: str) -> None:
    ca = _fleet["ca"]
    server, accepted = await _server(ca.cert_pem)
    try:
        config = TransportConfig.client(ca.cert_pem, impl=impl, server_name="node-a")
        port = server.address[1]  # type: ignore[attr-defined]
        assert await _refused_with(config, port) == 116  # TLS alert certificate_required
        assert accepted.empty()
    finally:
        server.close()  # type: ignore[attr-defined]
        await server.wait_closed()  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("impl", IMPLS)
async def test_a_client_certificate_from_another_ca_is_refused(impl: str) -> None:
    ca = _fleet["ca"]
    other = generate_ca("not the fleet")
    stranger = generate_leaf(other, dns_names=("node-b",), client_auth=True)
    server, accepted = await _server(ca.cert_pem)
    try:
        config = TransportConfig.client(
            ca.cert_pem,
            impl=impl,
            server_name="node-a",
            certificate_chain_pem=stranger.cert_pem + other.cert_pem,
            private_key_pem=stranger.key_pem,
        )
        port = server.address[1]  # type: ignore[attr-defined]
        assert await _refused_with(config, port) == 42  # TLS alert bad_certificate
        assert accepted.empty()
    finally:
        server.close()  # type: ignore[attr-defined]
        await server.wait_closed()  # type: ignore[attr-defined]


def test_a_qh3_server_cannot_require_client_certificates() -> None:
    ca, leaf = _fleet["ca"], _fleet["server"]
    with pytest.raises(ValueError, match="aioquic"):
        TransportConfig.server(
            leaf.cert_pem + ca.cert_pem, leaf.key_pem, impl="qh3", client_ca_pem=ca.cert_pem
        )
