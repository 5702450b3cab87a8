"""Replication on the broker-to-broker channel: the listener's handlers and the sender.

`ReplicationService` holds this broker's replica drivers (one per replicated
shard it holds) and serves the six `replica_*` peer messages through one
dispatch table (message type to handler). A message is fed to the shard's
driver only when the node it names as its sender (`leader`, `candidate` or
`sender`) is the node the peer certificate and hello proved: a broker cannot
speak for another. The answer is `replica_received {held}`: whether a replica
of that shard is here (delivery, not outcome: the core's answers travel as
messages of their own, the other way).

`peer_sender` turns a `PeerDialer` and an address book (node id to peer
address, from the routing snapshot's members) into the drivers' `Sender`. A lone
message (nothing behind it in the outbox, nothing on its way) is one request,
answered before the next leaves. A burst is pipelined: one `PeerPipe` per node
(one QUIC stream, messages written in order, the listener admitting them in that
order), so a message leaves once written, not after the previous one's answer;
at most the pipe's `stream_window` are unanswered (a send beyond waits: the
driver's outbox then fills, and past its bound drops). An idle pipe finishes
itself once every message on it was answered, so order holds from one pipe or
request to the next.
A message written but never answered (the pipe broke, or no answer within
`ANSWER_TIMEOUT_S`) is lost, as on a network: the core resends what matters; the
connection is then dropped and the next message dials again (a peer restarted on
the same address never answers the old connection).

Both take an optional `blocked` predicate (node id -> bool), set only in test mode
(FELIX_TEST_FAULTS' ``peer_blocked``, `felix_broker.chaos.faults`): replication
messages to a blocked node are dropped before they are sent, and those from one
are answered ``held: false`` unseen, a partition of replication alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from felix_broker.fleet.peer import (
    PeerDialer,
    PeerOrigin,
    PeerPipe,
    PeerProtocolError,
    PeerUnavailableError,
)
from felix_common.fleet import ShardId
from felix_wire.fleet import (
    PeerMessage,
    ReplicaFence,
    ReplicaFenceOk,
    ReplicaFenceRefused,
    ReplicaReceived,
    ReplicaShip,
    ReplicaShipOk,
    ReplicaShipRefused,
)

from .driver import ReplicaDriver, Sender
from .wire import WireMessage, from_wire

__all__ = ["ReplicationService", "peer_sender", "with_replication"]

_log = logging.getLogger(__name__)

# Which field of each message names the node that sent it.
_SENDER_FIELD: Mapping[type, str] = {
    ReplicaShip: "leader",
    ReplicaShipOk: "sender",
    ReplicaShipRefused: "sender",
    ReplicaFence: "candidate",
    ReplicaFenceOk: "sender",
    ReplicaFenceRefused: "sender",
}


ANSWER_TIMEOUT_S = 2.0
"""A replication message is answered once delivered to the shard's core (not after
its work): none within this means the link or the peer is gone."""

Blocked = Callable[[str], bool]
"""Whether replication with a node is cut (a test-mode fault)."""


class ReplicationService:
    def __init__(self, blocked: Blocked | None = None) -> None:
        self._blocked = blocked
        self.drivers: dict[ShardId, ReplicaDriver] = {}
        self.handlers: dict[type, Callable[[Any, PeerOrigin], Awaitable[PeerMessage]]] = {
            kind: self._deliver for kind in _SENDER_FIELD
        }
        self.spoofed = 0

    def add(self, driver: ReplicaDriver) -> None:
        self.drivers[driver.shard] = driver

    def remove(self, shard: ShardId) -> ReplicaDriver | None:
        return self.drivers.pop(shard, None)

    async def handle(self, message: PeerMessage, origin: PeerOrigin) -> PeerMessage:
        """The peer listener's handler for replication messages (see `handlers`)."""
        return await self.handlers[type(message)](message, origin)

    async def _deliver(self, message: WireMessage, origin: PeerOrigin) -> PeerMessage:
        named = getattr(message, _SENDER_FIELD[type(message)])
        if named != origin.node_id:
            self.spoofed += 1
            _log.warning("replication message from %s names %s: dropped", origin.node_id, named)
            return ReplicaReceived(held=False)
        if self._blocked is not None and self._blocked(origin.node_id):
            return ReplicaReceived(held=False)  # lost on a partitioned link (test fault)
        shard, core_message = from_wire(message)
        driver = self.drivers.get(shard)
        if driver is None:
            return ReplicaReceived(held=False)
        await driver.receive(core_message)
        return ReplicaReceived(held=True)


def peer_sender(
    dialer: PeerDialer, address_of: Callable[[str], str | None], blocked: Blocked | None = None
) -> Sender:
    """Sends over the peer channel, pipelined (see the module docstring); raises
    PeerUnavailableError for a node with no known peer address, one that cannot be
    reached or one `blocked` (the driver drops the message)."""
    pipes: dict[str, PeerPipe] = {}
    answers: set[asyncio.Task[None]] = set()

    async def answered(node_id: str, pipe: PeerPipe, future: asyncio.Future[PeerMessage]) -> None:
        try:  # delivery only: the core's answers come as messages of their own
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                await asyncio.shield(future)
        except (TimeoutError, PeerUnavailableError) as exc:
            # Unanswered: the connection may be dead (a peer restarted on the same
            # address never answers it): drop it, the next message dials afresh.
            _log.debug("replication message to %s lost: %s", node_id, exc or "no answer")
            lost(node_id, pipe)
        except PeerProtocolError as exc:
            _log.debug("replication message to %s lost: %s", node_id, exc)

    def lost(node_id: str, pipe: PeerPipe | None = None) -> None:
        if pipe is None or pipes.get(node_id) is pipe:
            pipes.pop(node_id, None)
            dialer.forget(node_id)

    async def send(node_id: str, message: WireMessage, more: bool = False) -> None:
        if blocked is not None and blocked(node_id):
            raise PeerUnavailableError(f"{node_id}: replication blocked (test fault)", sent=False)
        address = address_of(node_id)
        if address is None:
            raise PeerUnavailableError(f"{node_id}: no peer address known", sent=False)
        pipe = pipes.get(node_id)
        if not more and (pipe is None or not pipe.usable):
            # Nothing on its way, nothing behind: one request, answered before the
            # next message leaves (cheaper than a pipe for a lone message).
            try:
                async with asyncio.timeout(ANSWER_TIMEOUT_S):
                    await dialer.request(node_id, address, message)
            except TimeoutError:
                lost(node_id)
                raise PeerUnavailableError(f"{node_id} did not answer", sent=True) from None
            except PeerUnavailableError as exc:
                if exc.sent:
                    lost(node_id)
                raise
            return
        for _attempt in range(2):  # an idle pipe finishes itself: open the next once
            pipe = pipes.get(node_id)
            if pipe is None or not pipe.usable:
                pipe = pipes[node_id] = await dialer.pipe(node_id, address)
            try:
                future = await pipe.send(message)
            except PeerUnavailableError:  # it finished or broke meanwhile
                pipes.pop(node_id, None)
                continue
            task = asyncio.get_running_loop().create_task(answered(node_id, pipe, future))
            answers.add(task)
            task.add_done_callback(answers.discard)
            return
        raise PeerUnavailableError(f"{node_id}: no usable pipe", sent=False)

    return send


def with_replication(
    fallback: Callable[[PeerMessage, PeerOrigin], Awaitable[Any]], service: ReplicationService
) -> Callable[[PeerMessage, PeerOrigin], Awaitable[Any]]:
    """The peer listener's handler: replication messages to `service` (its table),
    every other peer message to `fallback` (forwarding, moves, ...)."""

    async def handle(message: PeerMessage, origin: PeerOrigin) -> Any:
        handler = service.handlers.get(type(message))
        if handler is None:
            return await fallback(message, origin)
        return await handler(message, origin)

    return handle
