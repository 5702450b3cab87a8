"""The adapters without sockets: two endpoints pumped in memory."""

from __future__ import annotations

import itertools

import pytest

from felix_transport import (
    HandshakeCompleted,
    StreamClosedError,
    StreamDataReceived,
    TransportConfig,
    TransportEvent,
    generate_ca,
    generate_leaf,
)
from felix_transport.backends import ConnectionAdapter, create_client_adapter, server_factory

CLIENT_ADDR = ("127.0.0.1", 40001)
SERVER_ADDR = ("127.0.0.1", 40002)
PAIRS = [("qh3", "qh3"), ("aioquic", "aioquic"), ("qh3", "aioquic"), ("aioquic", "qh3")]


class Pair:
    """A client and a server adapter exchanging datagrams through lists."""

    def __init__(self, client_impl: str, server_impl: str, **options: object) -> None:
        ca = generate_ca()
        leaf = generate_leaf(ca)
        self.client = create_client_adapter(
            TransportConfig.client(ca.cert_pem, impl=client_impl, **options)  # type: ignore[arg-type]
        )
        self.factory = server_factory(
            TransportConfig.server(
                leaf.cert_pem + ca.cert_pem,
                leaf.key_pem,
                impl=server_impl,  # type: ignore[arg-type]
                **options,
            )
        )
        self.server: ConnectionAdapter | None = None
        self.now = 1000.0
        self.client_events: list[TransportEvent] = []
        self.server_events: list[TransportEvent] = []
        self.server_build_failures = 0
        self.client.connect(SERVER_ADDR, self.now)

    def pump(self, rounds: int = 60) -> None:
        """Exchange datagrams, running timers as a loop would, until both go quiet."""
        for _ in range(rounds):
            self.now += 0.001
            if self._exchange():
                continue
            # Nothing to send: jump to the earliest timer (ack delay, PTO) if any
            # fires within the next two seconds, as the event loop would.
            timers = [
                (when, side)
                for side in (self.client, self.server)
                if side is not None and (when := side.get_timer()) is not None
            ]
            if not timers:
                return
            when, side = min(timers, key=lambda item: item[0])
            if when > self.now + 2.0:
                return
            self.now = max(self.now, when)
            side.handle_timer(self.now)

    def _exchange(self) -> bool:
        moved = False
        out = [d for d, _ in self.client.datagrams_to_send(self.now)]
        if out:
            moved = True
            if self.server is None:
                dcid = out[0][6 : 6 + out[0][5]]
                self.server = self.factory.create(dcid)
            self.server.receive_datagrams(out, CLIENT_ADDR, self.now)
        if self.server is not None:
            try:
                back = [d for d, _ in self.server.datagrams_to_send(self.now)]
            except Exception:
                # qh3 2.1 cannot answer the first copy of an aioquic Initial (see
                # felix_transport.connection); the client's PTO resend gets through.
                self.server_build_failures += 1
                back = []
            if back:
                moved = True
                self.client.receive_datagrams(back, SERVER_ADDR, self.now)
            self.server_events.extend(iter(self.server.next_event, None))
        self.client_events.extend(iter(self.client.next_event, None))
        return moved

    def received(self, events: list[TransportEvent], stream_id: int) -> bytes:
        return b"".join(
            e.data for e in events if isinstance(e, StreamDataReceived) and e.stream_id == stream_id
        )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("client_impl", "server_impl"), PAIRS)
def test_adapters_handshake_and_streams(client_impl: str, server_impl: str) -> None:
    pair = Pair(client_impl, server_impl, offer_alpn=True)
    pair.pump()
    assert pair.server is not None
    assert HandshakeCompleted("felix/1") in pair.client_events
    assert HandshakeCompleted("felix/1") in pair.server_events
    assert pair.client.alpn_protocol == pair.server.alpn_protocol == "felix/1"
    # Documents the qh3-server / aioquic-client first-flight failure (the
    # handshake then completes after loss recovery); 0 for every other pair.
    if (client_impl, server_impl) != ("aioquic", "qh3"):
        assert pair.server_build_failures == 0
    assert pair.server.peer_address is not None

    bidi = pair.client.open_stream(unidirectional=False)
    uni = pair.client.open_stream(unidirectional=True)
    assert (bidi & 0x3, uni & 0x3) == (0, 2)
    pair.client.send(bidi, b"hello", end_stream=True)
    pair.client.send(uni, b"one way")
    pair.pump()
    assert pair.received(pair.server_events, bidi) == b"hello"
    assert pair.received(pair.server_events, uni) == b"one way"
    assert StreamDataReceived(bidi, b"", True) in pair.server_events or any(
        isinstance(e, StreamDataReceived) and e.stream_id == bidi and e.end_stream
        for e in pair.server_events
    )
    with pytest.raises(StreamClosedError):
        pair.client.send(bidi, b"after FIN")

    pair.server.close(0x33, "done")
    pair.pump()
    terminated = [e for e in pair.client_events if type(e).__name__ == "ConnectionTerminated"]
    # The peer's close is reported once the client's draining timer runs.
    for _ in itertools.repeat(None, 10):
        if terminated:
            break
        pair.now += 1.0
        pair.client.handle_timer(pair.now)
        pair.client_events.extend(iter(pair.client.next_event, None))
        terminated = [e for e in pair.client_events if type(e).__name__ == "ConnectionTerminated"]
    assert terminated and terminated[0].error_code == 0x33  # type: ignore[union-attr]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("server_impl", ["qh3", "aioquic"])
def test_receive_credit_follows_reads(server_impl: str) -> None:
    window = 64 * 1024
    pair = Pair("qh3", server_impl, stream_receive_window=window)
    pair.pump()
    assert pair.server is not None
    sid = pair.client.open_stream(unidirectional=False)
    pair.client.send(sid, b"x" * (1024 * 1024))
    pair.pump(200)
    got = len(pair.received(pair.server_events, sid))
    if pair.server.capabilities.per_stream_receive_credit:
        # Nothing read by the application: the peer stops at the window.
        assert got == window
        assert pair.server.consumed(sid, got)
        pair.pump(200)
        assert len(pair.received(pair.server_events, sid)) == 2 * window
    else:
        # qh3's core extends windows by itself: the connection layer must pause input.
        assert got == 1024 * 1024
