"""What the fleet keeps in etcd: the keyspace and the JSON records stored under it.

The one seam between the fleet's etcd code and the record shapes. Keys, under
the prefix ``P`` (FELIX_ETCD_PREFIX, default ``/felix``):

- ``P/members/{node_id}`` → `MemberRecord`, attached to the broker's own lease;
- ``P/assignments/{kind}/{tenant}/{namespace}/{name}/{shard}`` → `AssignmentRecord`;
  the shard's generation is the key's etcd ``mod_revision`` (not stored);
- ``P/placer`` → the placer holder's id, attached to the holder's lease;
- ``P/incarnations/{node_id}`` → the last incarnation a node registered with.

Key segments are percent-encoded, so a name can never be read as a separator.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

import msgspec

from felix_broker.fleet.routing import AssignmentState, Member, Route, ShardId, ShardKind

__all__ = [
    "AssignmentRecord",
    "Keyspace",
    "MemberRecord",
    "RecordError",
    "decode_assignment",
    "decode_member",
    "encode",
    "member_of",
    "route_of",
]


class MemberRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A broker's registration (the value of ``P/members/{node_id}``)."""

    node_id: str
    client_addr: str = ""
    peer_addr: str = ""
    features: list[str] = msgspec.field(default_factory=list)
    incarnation: int = 0


class AssignmentRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One shard's assignment (the value of its assignment key)."""

    state: str  # an AssignmentState value
    leader: str | None = None
    replicas: list[str] = msgspec.field(default_factory=list)
    reason: str | None = None
    successor: str | None = None


class RecordError(ValueError):
    """A stored value or key that is not a fleet record."""


_member_decoder = msgspec.json.Decoder(MemberRecord)
_assignment_decoder = msgspec.json.Decoder(AssignmentRecord)
_STATES = {s.value: s for s in AssignmentState}


def encode(record: MemberRecord | AssignmentRecord) -> bytes:
    return msgspec.json.encode(record)


def decode_member(value: bytes) -> MemberRecord:
    try:
        return _member_decoder.decode(value)
    except msgspec.DecodeError as exc:
        raise RecordError(f"not a member record: {exc}") from None


def decode_assignment(value: bytes) -> AssignmentRecord:
    try:
        record = _assignment_decoder.decode(value)
    except msgspec.DecodeError as exc:
        raise RecordError(f"not an assignment record: {exc}") from None
    if record.state not in _STATES:
        raise RecordError(f"unknown assignment state {record.state!r}")
    return record


def member_of(record: MemberRecord) -> Member:
    return Member(
        node_id=record.node_id,
        client_addr=record.client_addr,
        peer_addr=record.peer_addr,
        features=frozenset(record.features),
    )


def route_of(record: AssignmentRecord, generation: int) -> Route:
    return Route(
        generation=generation,
        state=_STATES[record.state],
        leader=record.leader,
        replicas=tuple(record.replicas),
        reason=record.reason,
        successor=record.successor,
    )


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
    def members(self) -> str:
        return f"{self.prefix}/members/"

    @property
    def assignments(self) -> str:
        return f"{self.prefix}/assignments/"

    @property
    def placer(self) -> str:
        return f"{self.prefix}/placer"

    def member(self, node_id: str) -> str:
        return self.members + quote(node_id, safe="")

    def incarnation(self, node_id: str) -> str:
        return f"{self.prefix}/incarnations/" + quote(node_id, safe="")

    def node_of(self, key: str) -> str:
        if not key.startswith(self.members):
            raise RecordError(f"not a member key: {key!r}")
        return unquote(key[len(self.members) :])

    def assignment(self, shard: ShardId) -> str:
        parts = (shard.kind.value, shard.tenant, shard.namespace, shard.name, str(shard.shard))
        return self.assignments + "/".join(quote(p, safe="") for p in parts)

    def shard_of(self, key: str) -> ShardId:
        if not key.startswith(self.assignments):
            raise RecordError(f"not an assignment key: {key!r}")
        parts = key[len(self.assignments) :].split("/")
        if len(parts) != 5 or not parts[4].isdigit():
            raise RecordError(f"not an assignment key: {key!r}")
        kind, tenant, namespace, name, index = (unquote(p) for p in parts)
        try:
            shard_kind = ShardKind(kind)
        except ValueError:
            raise RecordError(f"unknown shard kind in {key!r}") from None
        return ShardId(shard_kind, tenant, namespace, name, int(index))
