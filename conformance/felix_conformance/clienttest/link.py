"""A UDP link between the client under test and a scripted broker, which can go silent.

The client connects to the link's address; each client address (a flow) is relayed
through its own socket to the broker, so the broker sees one source per client.
`silence(seconds)` discards every datagram, both ways, until the time is up: a
network outage that neither side hears of, unlike a reset (CONNECTION_CLOSE) or a
stall (the broker withholding answers while QUIC keeps acknowledging). A client
notices only by its QUIC idle timeout, and must connect again once the link is back.

Bounds: at most `MAX_FLOWS` flows (a datagram from one more client address is
discarded and counted); datagrams are relayed as they come, never queued here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

__all__ = ["MAX_FLOWS", "LinkStats", "SilentLink"]

_log = logging.getLogger(__name__)

MAX_FLOWS = 16  # a client under test opens a few connections per case


@dataclass
class LinkStats:
    relayed: int = 0
    silenced: int = 0  # discarded during a silence, both ways
    refused: int = 0  # from a client address past MAX_FLOWS


class _Inbound(asyncio.DatagramProtocol):
    """The link's listening socket: datagrams from clients."""

    def __init__(self, link: SilentLink) -> None:
        self.link = link

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.link._from_client(data, (str(addr[0]), int(str(addr[1]))))


class _Outbound(asyncio.DatagramProtocol):
    """One flow's socket to the broker: datagrams from the broker for one client."""

    def __init__(self, link: SilentLink, client: tuple[str, int]) -> None:
        self.link = link
        self.client = client

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.link._from_broker(data, self.client)


class SilentLink:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.stats = LinkStats()
        self._inbound: asyncio.DatagramTransport | None = None
        self._flows: dict[tuple[str, int], asyncio.DatagramTransport] = {}
        self._opening: set[tuple[str, int]] = set()
        self._silent_until = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Inbound(self), local_addr=("127.0.0.1", 0)
        )
        self._inbound = transport
        host, port = transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    def silence(self, seconds: float) -> None:
        """Discard everything, both ways, for `seconds` from now."""
        self._silent_until = time.monotonic() + seconds

    @property
    def silent(self) -> bool:
        return time.monotonic() < self._silent_until

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for flow in self._flows.values():
            flow.close()
        self._flows.clear()
        if self._inbound is not None:
            self._inbound.close()
            self._inbound = None

    def _from_client(self, data: bytes, client: tuple[str, int]) -> None:
        if self.silent:
            self.stats.silenced += 1
            return
        flow = self._flows.get(client)
        if flow is not None:
            self.stats.relayed += 1
            flow.sendto(data)
            return
        if len(self._flows) + len(self._opening) >= MAX_FLOWS or client in self._opening:
            # Past the bound, or the flow's socket is still being made: QUIC resends.
            self.stats.refused += 1
            return
        self._opening.add(client)
        task = asyncio.get_running_loop().create_task(self._open_flow(client, data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_flow(self, client: tuple[str, int], first: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _Outbound(self, client), remote_addr=self.upstream
            )
        except OSError as exc:
            _log.warning("link: no socket for %s:%d: %s", *client, exc)
            return
        finally:
            self._opening.discard(client)
        self._flows[client] = transport
        self.stats.relayed += 1
        transport.sendto(first)

    def _from_broker(self, data: bytes, client: tuple[str, int]) -> None:
        if self.silent:
            self.stats.silenced += 1
            return
        if self._inbound is not None:
            self.stats.relayed += 1
            self._inbound.sendto(data, client)
