"""Which broker of a fleet a case's connections go to: the owner of what it asks of a leader.

A broker that does not lead a shard forwards publishes and cache operations to
its owner, but answers every request only a leader serves with `not_leader`
(subscribe, cache_watch, the group requests, publish_if, commit, state_get,
stream_read, offset_for_time, idempotent publishes). A real client learns the
owner and goes there; so does the kit. Before a case that sends such a request
runs against a fleet, the kit asks the target `shard_owners` for the stream or
cache of the first one, and the case's connections to "the target" go to the
named owner instead. Everything the case sends there (publishes included) is
then sent to the owner, as a client that has learnt the owner would.

Cases that choose their brokers themselves (the cluster cases, `setup.brokers`
of 2 or more) are never routed: they test `not_leader` itself. A single broker,
a target that did not advertise FEATURE_SHARD_OWNERS, or an owner with no
client address (a standalone broker's view) leaves the case at the target.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from felix_wire.features import Feature
from felix_wire.messages import ShardOwner
from felix_wire.routing import shard_for_key

from .matching import MissingVariableError, substitute
from .model import Case
from .target import Advertised, Target, TargetRefusedError, TargetUnreachableError, shard_owners
from .wirelog import WireLog

__all__ = ["LEADER_SERVED", "LeaderRequest", "leader_requests", "owner_of", "route_to_owner"]

# The requests a non-owner answers with not_leader (the table in
# docs/architecture.md, "What a non-owner does with each request type"), by type.
LEADER_SERVED = frozenset(
    {
        "subscribe",
        "cache_watch",
        "publish_if",
        "publish_idempotent",
        "commit",
        "state_get",
        "stream_read",
        "offset_for_time",
        "group_poll",
        "group_ack",
        "group_nack",
        "group_extend",
        "group_seek",
        "group_describe",
        "group_delete",
        "group_dead_letters",
        "group_dead_letter",
        "group_discard",
        "group_redrive",
    }
)


@dataclass(frozen=True)
class LeaderRequest:
    """A leader-served request a case sends: what it names, and where it lands."""

    kind: str  # "stream" | "cache"
    name: str
    shard: int | None  # the request's own `shard` field
    key: bytes | None  # its routing key, when it has no shard field


def _key(body: dict[str, Any], variables: dict[str, Any]) -> bytes | None:
    """The routing key: a cache key as text, a stream's key or entity_key as base64."""
    value = substitute(body.get("entity_key", body.get("key")), variables)
    if not isinstance(value, str):
        return None
    if "cache" in body:
        return value.encode()
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value.encode()


def leader_requests(case: Case, variables: dict[str, Any]) -> list[LeaderRequest]:
    """The leader-served requests of the case's `send` steps, in order: JSON
    messages by type, binary batches carrying a producer id (idempotent)."""
    found: list[LeaderRequest] = []
    for step in case.steps:
        if step.action != "send" or len(step.frames) != 1:
            continue
        (spec,) = step.frames
        if spec.kind == "message" and spec.body.get("type") in LEADER_SERVED:
            body = spec.body
        elif spec.kind == "binary" and "producer_id" in spec.body.get("fields", {}):
            body = spec.body["fields"]
        else:
            continue
        kind = "cache" if "cache" in body else "stream"
        try:
            name = substitute(body.get(kind), variables)
            key = _key(body, variables)
        except MissingVariableError:
            continue  # a name only known at run time: nothing to route by
        if not isinstance(name, str):
            continue
        shard = body.get("shard")
        found.append(LeaderRequest(kind, name, shard if isinstance(shard, int) else None, key))
    return found


def owner_of(request: LeaderRequest, owners: list[ShardOwner]) -> ShardOwner | None:
    """The owner of the shard the request lands on. Every shard with one owner
    needs no shard; otherwise the request's `shard`, or its key's shard
    (modulo routing, the default), or shard 0 for a request with neither."""
    if not owners:
        return None
    if len({o.addr for o in owners}) == 1:
        return owners[0]
    shard = request.shard
    if shard is None:
        shard = shard_for_key(request.key, len(owners))
    return next((o for o in owners if o.shard == shard), None)


async def route_to_owner(
    case: Case, target: Target, advertised: Advertised, log: WireLog
) -> Target:
    """The target the case's default connections go to (see the module doc); the
    wire log says where and why. A target that cannot answer `shard_owners`
    leaves the case where it was (its not_leader, if any, then fails it)."""
    if len(target.fleet) < 2 or case.min_brokers > 1:
        return target
    if not advertised.features & int(Feature.FEATURE_SHARD_OWNERS):
        return target
    requests = leader_requests(case, target.variables)
    if not requests:
        return target
    first = requests[0]
    try:
        owners = await shard_owners(target, [(first.kind, first.name)])
    except (TargetRefusedError, TargetUnreachableError) as exc:
        log.note("route", f"shard_owners failed ({exc}): the case stays at {target.address}")
        return target
    owner = owner_of(first, owners.get((first.kind, first.name), []))
    if owner is None or not owner.addr:
        log.note("route", f"no owner with an address for {first.kind} {first.name!r}")
        return target
    where = f"{first.kind} {first.name!r}" + (
        f" shard {first.shard}" if first.shard is not None else ""
    )
    if owner.addr == target.address:
        log.note("route", f"{target.address} ({owner.node_id}) leads {where}")
        return target
    log.note(
        "route",
        f"{owner.node_id} at {owner.addr} leads {where} (generation {owner.generation}): "
        f"the case's connections go there, not to {target.address}",
    )
    return target.at(owner.addr)
