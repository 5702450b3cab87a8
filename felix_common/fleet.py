"""The fleet's etcd keyspace, as the broker and the control plane's placer both read it.

The key layout and the record shapes are the fleet catalogue's
(`spec/fleet.yaml`, generated `felix_wire.fleet`): this module names shards
(`ShardId`), spells their keys below one prefix (`Keyspace`), and turns a value
that is not a record into one typed `RecordError`. Under the prefix ``P``
(FELIX_ETCD_PREFIX, default ``/felix``):

- ``P/members/{node_id}`` → `Member`, attached to the broker's own lease;
- ``P/assignments/{kind}/{tenant}/{namespace}/{name}/{shard}`` → `Assignment`;
  the shard's generation is the key's etcd ``mod_revision`` (never stored);
- ``P/placer`` → the placement holder's id, attached to the holder's lease;
- ``P/features/{name}`` → `FinalizedFeature`, written once by the control plane
  when it finalizes a fleet feature, never changed or deleted.
- ``P/progress/{node_id}/moves/{kind}/{tenant}/{namespace}/{name}/{shard}`` →
  `MoveCopied`, a move's successor's report, attached to the successor's lease;
- ``P/progress/{node_id}/drain`` → `Drain`, a broker's request for its own drain
  (at shutdown), attached to its own lease;
- ``P/drains/{node_id}`` → `Drain`, written by the control plane while a broker drains.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from felix_wire import fleet as wire
from felix_wire.fleet import (
    Assignment,
    AssignmentState,
    Drain,
    FinalizedFeature,
    Member,
    MoveCopied,
    PromotionRefusal,
)
from felix_wire.wire_errors import MalformedJsonError, MessageFieldError

__all__ = [
    "Assignment",
    "AssignmentState",
    "Drain",
    "FinalizedFeature",
    "Keyspace",
    "Member",
    "MoveCopied",
    "PromotionRefusal",
    "RecordError",
    "ShardId",
    "ShardKind",
    "decode_assignment",
    "decode_drain",
    "decode_finalized_feature",
    "decode_member",
    "decode_move_copied",
    "decode_promotion_refusal",
    "encode_record",
]

encode_record = wire.encode_record


class ShardKind(enum.Enum):
    STREAM = "stream"
    CACHE = "cache"


@dataclass(frozen=True, slots=True)
class ShardId:
    """One shard of one stream or cache."""

    kind: ShardKind
    tenant: str
    namespace: str
    name: str
    shard: int

    def __lt__(self, other: object) -> bool:  # enums do not order; compare by value
        if not isinstance(other, ShardId):
            return NotImplemented
        return self._key() < other._key()

    def _key(self) -> tuple[str, str, str, str, int]:
        return (self.kind.value, self.tenant, self.namespace, self.name, self.shard)


_R = TypeVar("_R")


class RecordError(ValueError):
    """A stored key or value that is not a fleet record."""


def _record_decoder(decode: Callable[[bytes], _R], what: str) -> Callable[[bytes], _R]:
    """`decode` (a generated record decoder) raising `RecordError` naming `what`."""

    def record(value: bytes) -> _R:
        try:
            return decode(value)
        except (MalformedJsonError, MessageFieldError) as exc:
            raise RecordError(f"not {what}: {exc}") from None

    return record


decode_member = _record_decoder(wire.decode_member, "a member record")
decode_finalized_feature = _record_decoder(
    wire.decode_finalizedfeature, "a finalized-feature record"
)
decode_assignment = _record_decoder(wire.decode_assignment, "an assignment record")
decode_move_copied = _record_decoder(wire.decode_movecopied, "a move progress record")
decode_promotion_refusal = _record_decoder(
    wire.decode_promotionrefusal, "a promotion refusal record"
)
decode_drain = _record_decoder(wire.decode_drain, "a drain record")


@dataclass(frozen=True, slots=True)
class Keyspace:
    """The fleet's keys under one prefix."""

    prefix: str = "/felix"

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError(
                f"etcd prefix must start with '/' and not end with it: {self.prefix!r}"
            )

    @property
    def root(self) -> str:
        """Every fleet key starts with this."""
        return self.prefix + "/"

    @property
    def members(self) -> str:
        return self.prefix + "/members/"

    @property
    def assignments(self) -> str:
        return self.prefix + "/assignments/"

    @property
    def features(self) -> str:
        return self.prefix + "/features/"

    def feature(self, name: str) -> str:
        return wire.features_key(self.prefix, name=name)

    def feature_of(self, key: str) -> str:
        parts = wire.parse_features_key(self.prefix, key)
        if parts is None:
            raise RecordError(f"not a feature key: {key!r}")
        return parts[0]

    @property
    def placer(self) -> str:
        return wire.placer_key(self.prefix)

    def member(self, node_id: str) -> str:
        return wire.members_key(self.prefix, node_id=node_id)

    def node_of(self, key: str) -> str:
        parts = wire.parse_members_key(self.prefix, key)
        if parts is None:
            raise RecordError(f"not a member key: {key!r}")
        return parts[0]

    def assignment(self, shard: ShardId) -> str:
        return wire.assignments_key(
            self.prefix,
            kind=shard.kind.value,
            tenant=shard.tenant,
            namespace=shard.namespace,
            name=shard.name,
            shard=shard.shard,
        )

    def shard_of(self, key: str) -> ShardId:
        parts = wire.parse_assignments_key(self.prefix, key)
        if parts is None:
            raise RecordError(f"not an assignment key: {key!r}")
        kind, tenant, namespace, name, index = parts
        try:
            shard_kind = ShardKind(kind)
        except ValueError:
            raise RecordError(f"unknown shard kind in {key!r}") from None
        return ShardId(shard_kind, tenant, namespace, name, index)

    @property
    def progress(self) -> str:
        return self.prefix + "/progress/"

    @property
    def drains(self) -> str:
        return self.prefix + "/drains/"

    def move_progress(self, node_id: str, shard: ShardId) -> str:
        """Where `node_id` reports it holds the copy of `shard` for a move."""
        return wire.move_progress_key(
            self.prefix,
            node_id=node_id,
            kind=shard.kind.value,
            tenant=shard.tenant,
            namespace=shard.namespace,
            name=shard.name,
            shard=shard.shard,
        )

    def drain(self, node_id: str) -> str:
        return wire.drains_key(self.prefix, node_id=node_id)

    def drained_node_of(self, key: str) -> str:
        parts = wire.parse_drains_key(self.prefix, key)
        if parts is None:
            raise RecordError(f"not a drain key: {key!r}")
        return parts[0]

    def progress_of(self, key: str) -> tuple[str, ShardId]:
        """(successor node id, shard) of a move progress key."""
        parts = wire.parse_move_progress_key(self.prefix, key)
        if parts is None:
            raise RecordError(f"not a move progress key: {key!r}")
        node, kind, tenant, namespace, name, index = parts
        try:
            shard_kind = ShardKind(kind)
        except ValueError:
            raise RecordError(f"unknown shard kind in {key!r}") from None
        return node, ShardId(shard_kind, tenant, namespace, name, index)

    def promotion_refused(self, node_id: str, shard: ShardId) -> str:
        """Where replica `node_id` reports it refused a promotion of `shard`."""
        return wire.promotion_refused_key(
            self.prefix,
            node_id=node_id,
            kind=shard.kind.value,
            tenant=shard.tenant,
            namespace=shard.namespace,
            name=shard.name,
            shard=shard.shard,
        )

    def refusal_of(self, key: str) -> tuple[str, ShardId] | None:
        """(replica node id, shard) of a promotion refusal key; None for any other key."""
        parts = wire.parse_promotion_refused_key(self.prefix, key)
        if parts is None:
            return None
        node, kind, tenant, namespace, name, index = parts
        try:
            shard_kind = ShardKind(kind)
        except ValueError:
            raise RecordError(f"unknown shard kind in {key!r}") from None
        return node, ShardId(shard_kind, tenant, namespace, name, index)

    def drain_request(self, node_id: str) -> str:
        """Where a broker told to stop asks for its own drain (under its own lease)."""
        return wire.drain_request_key(self.prefix, node_id=node_id)

    def drain_requester_of(self, key: str) -> str | None:
        """The node id of a drain request key; None for any other key."""
        parts = wire.parse_drain_request_key(self.prefix, key)
        return None if parts is None else parts[0]
