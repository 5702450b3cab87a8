"""The core's peer messages on the wire: conversion at the edge of the sans-IO core.

The core (`core.py`) speaks small frozen dataclasses so the model tests can
compare, hash and build them cheaply. On the broker-to-broker channel every
shape is the fleet catalogue's (`spec/fleet.yaml`, generated `felix_wire.fleet`):
`to_wire` wraps a core message with the shard it is about, `from_wire` unwraps a
received one. Both are one table per direction (message type to converter), and
a round trip is the identity (tests/replication/test_wire.py checks every type).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from felix_common.fleet import ShardId, ShardKind
from felix_wire.fleet import (
    AssignmentKind,
    ReplicaEntry,
    ReplicaFence,
    ReplicaFenceOk,
    ReplicaFenceRefused,
    ReplicaShard,
    ReplicaShip,
    ReplicaShipOk,
    ReplicaShipRefused,
)

from .core import Entry, Fence, FenceOk, FenceRefused, Message, Ship, ShipOk, ShipRefused

__all__ = ["REPLICATION_MESSAGE_TYPES", "WireMessage", "from_wire", "shard_of", "to_wire"]

WireMessage = (
    ReplicaShip
    | ReplicaShipOk
    | ReplicaShipRefused
    | ReplicaFence
    | ReplicaFenceOk
    | ReplicaFenceRefused
)

REPLICATION_MESSAGE_TYPES: tuple[type[WireMessage], ...] = (
    ReplicaShip,
    ReplicaShipOk,
    ReplicaShipRefused,
    ReplicaFence,
    ReplicaFenceOk,
    ReplicaFenceRefused,
)
"""The peer message types the replication handler serves (one dispatch entry each)."""


def wire_shard(shard: ShardId) -> ReplicaShard:
    return ReplicaShard(
        kind=AssignmentKind(shard.kind.value),
        tenant=shard.tenant,
        namespace=shard.namespace,
        name=shard.name,
        shard=shard.shard,
    )


def shard_of(message: WireMessage) -> ShardId:
    s = message.shard
    return ShardId(ShardKind(s.kind.value), s.tenant, s.namespace, s.name, s.shard)


def _entry_out(entry: Entry) -> ReplicaEntry:
    return ReplicaEntry(generation=entry.generation, payload=entry.payload, start=entry.start)


def _entry_in(entry: ReplicaEntry) -> Entry:
    return Entry(entry.generation, bytes(entry.payload), entry.start)


def _ship_out(m: Any, s: ReplicaShard) -> WireMessage:
    ship = cast(Ship, m)
    return ReplicaShip(
        shard=s,
        generation=ship.generation,
        leader=ship.leader,
        offset=ship.offset,
        prev_generation=ship.prev_generation,
        entries=[_entry_out(e) for e in ship.entries],
        commit=ship.commit,
        compacted=ship.compacted,
    )


def _ship_ok_out(m: Any, s: ReplicaShard) -> WireMessage:
    ok = cast(ShipOk, m)
    return ReplicaShipOk(
        shard=s, generation=ok.generation, sender=ok.sender, durable=ok.durable, matched=ok.matched
    )


def _ship_refused_out(m: Any, s: ReplicaShard) -> WireMessage:
    refused = cast(ShipRefused, m)
    return ReplicaShipRefused(
        shard=s,
        generation=refused.generation,
        sender=refused.sender,
        refusal=refused.refusal,
        resume_at=refused.resume_at,
    )


def _fence_out(m: Any, s: ReplicaShard) -> WireMessage:
    fence = cast(Fence, m)
    return ReplicaFence(shard=s, generation=fence.generation, candidate=fence.candidate)


def _fence_ok_out(m: Any, s: ReplicaShard) -> WireMessage:
    ok = cast(FenceOk, m)
    return ReplicaFenceOk(
        shard=s,
        generation=ok.generation,
        sender=ok.sender,
        last_generation=ok.last_generation,
        length=ok.length,
    )


def _fence_refused_out(m: Any, s: ReplicaShard) -> WireMessage:
    refused = cast(FenceRefused, m)
    return ReplicaFenceRefused(shard=s, generation=refused.generation, sender=refused.sender)


_OUT: dict[type, Callable[[Any, ReplicaShard], WireMessage]] = {
    Ship: _ship_out,
    ShipOk: _ship_ok_out,
    ShipRefused: _ship_refused_out,
    Fence: _fence_out,
    FenceOk: _fence_ok_out,
    FenceRefused: _fence_refused_out,
}


def _ship_in(w: Any) -> Message:
    ship = cast(ReplicaShip, w)
    return Ship(
        ship.generation,
        ship.leader,
        ship.offset,
        ship.prev_generation,
        tuple(_entry_in(e) for e in ship.entries),
        ship.commit,
        ship.compacted,
    )


def _ship_ok_in(w: Any) -> Message:
    ok = cast(ReplicaShipOk, w)
    return ShipOk(ok.generation, ok.sender, ok.durable, ok.matched)


def _ship_refused_in(w: Any) -> Message:
    refused = cast(ReplicaShipRefused, w)
    return ShipRefused(refused.generation, refused.sender, refused.refusal, refused.resume_at)


def _fence_in(w: Any) -> Message:
    fence = cast(ReplicaFence, w)
    return Fence(fence.generation, fence.candidate)


def _fence_ok_in(w: Any) -> Message:
    ok = cast(ReplicaFenceOk, w)
    return FenceOk(ok.generation, ok.sender, ok.last_generation, ok.length)


def _fence_refused_in(w: Any) -> Message:
    refused = cast(ReplicaFenceRefused, w)
    return FenceRefused(refused.generation, refused.sender)


_IN: dict[type, Callable[[Any], Message]] = {
    ReplicaShip: _ship_in,
    ReplicaShipOk: _ship_ok_in,
    ReplicaShipRefused: _ship_refused_in,
    ReplicaFence: _fence_in,
    ReplicaFenceOk: _fence_ok_in,
    ReplicaFenceRefused: _fence_refused_in,
}


def to_wire(shard: ShardId, message: Message) -> WireMessage:
    """The catalogued peer message carrying the core's `message` about `shard`."""
    return _OUT[type(message)](message, wire_shard(shard))


def from_wire(message: WireMessage) -> tuple[ShardId, Message]:
    """The shard and the core's message a received peer message carries."""
    return shard_of(message), _IN[type(message)](message)
