# Generated from spec/fleet.yaml (with spec/messages.yaml) by codegen - DO NOT EDIT.
# spec sha256: 01b2197a06fb92940e875012e0053afb405241902e71a7c479c5cf6f330ac44f
"""The fleet catalogue: etcd record shapes and broker-to-broker messages.

Broker-to-broker QUIC (TLS 1.3, mutual TLS): each broker's peer certificate is signed by the fleet CA and names its node id as a DNS SAN; both sides check it, and the listener checks it against hello.

Rules of the peer protocol:
- The dialing broker opens bidirectional streams; each starts with hello and carries one request or an ordered run of them. The listener admits a stream's requests in the order they came and answers each with exactly one terminal answer, in the same order; it finishes the stream after the dialer finished its side.
- hello is the first frame of every stream; a stream whose hello names another node id than the dialer's certificate is refused (hello_refused) and closed.
- No chains: a broker never forwards a forwarded request onward. It serves it, or refuses it (forward_refused).
- An owner re-verifies the client's token of every forwarded request (authorized twice); a credential failure is refused with code forbidden.

Peer frames reuse the client protocol's frame envelope (`felix_wire.frame`) with
JSON payloads (flags 0), tagged by "type"; `encode_peer_message` and
`decode_peer_message` are their payload codec. etcd values are the JSON of the
record structs (`encode_record`, `decode_member`, `decode_assignment`), stored
under the keys the `*_key` functions spell below the fleet prefix.
"""

from __future__ import annotations

import enum
import re
from types import MappingProxyType
from typing import Any, Mapping, Union

import msgspec

from .messages import (
    U8,
    U16,
    U32,
    U64,
    I64,
    Unknown,
    _check_u64,
    CacheConditionResult,
    CacheDelete,
    CacheDeleteIf,
    CacheGet,
    CacheOk,
    CachePut,
    CachePutIf,
    CacheValue,
    CounterAdd,
    CounterGet,
    CounterValue,
    Error,
    ErrorDetail,
    Unsupported,
)
from .wire_errors import MalformedJsonError, MessageFieldError

__all__ = [
    "PEER_ALPN",
    "PEER_MAX_FRAME_BYTES",
    "PEER_HELLO_MAX_FRAME_BYTES",
    "members_key",
    "parse_members_key",
    "assignments_key",
    "parse_assignments_key",
    "placer_key",
    "parse_placer_key",
    "features_key",
    "parse_features_key",
    "move_progress_key",
    "parse_move_progress_key",
    "drain_request_key",
    "parse_drain_request_key",
    "promotion_refused_key",
    "parse_promotion_refused_key",
    "drains_key",
    "parse_drains_key",
    "AssignmentState",
    "AssignmentKind",
    "ForwardAck",
    "ShipRefusal",
    "CacheOpKind",
    "GroupChangeKind",
    "Member",
    "Assignment",
    "FinalizedFeature",
    "MoveCopied",
    "PromotionRefusal",
    "Drain",
    "LeaderHint",
    "StaleRoute",
    "PeerError",
    "ForwardRefusal",
    "ReplicationHalt",
    "ReplicaShard",
    "ReplicaEntry",
    "ReplicatedBatch",
    "ReplicatedStateChange",
    "ReplicatedCommit",
    "MoveFile",
    "ReplicatedCacheOp",
    "CacheSnapshotEntry",
    "CacheSnapshotCounter",
    "CacheSnapshot",
    "ReplicatedGroupChange",
    "ReplicatedGroupChanges",
    "ReplicatedRetention",
    "CacheOp",
    "CacheOpAnswer",
    "Hello",
    "HelloOk",
    "HelloRefused",
    "ForwardPublish",
    "ForwardPublishOk",
    "ForwardCacheOp",
    "ForwardCacheAnswer",
    "ForwardRefused",
    "PeerUnsupported",
    "MoveChunk",
    "MoveChunkOk",
    "MoveDone",
    "MoveDoneOk",
    "ReplicaShip",
    "ReplicaShipOk",
    "ReplicaShipRefused",
    "ReplicaFence",
    "ReplicaFenceOk",
    "ReplicaFenceRefused",
    "ReplicaReceived",
    "MoveCaughtUp",
    "MoveFinal",
    "ReplicaReadRound",
    "ReplicaReadAnswer",
    "ReplicaSnapshotRequest",
    "ReplicaSnapshot",
    "PeerMessage",
    "PEER_MESSAGE_CLASSES",
    "DIALER_TO_LISTENER",
    "LISTENER_TO_DIALER",
    "RECORD_CLASSES",
    "encode_peer_message",
    "decode_peer_message",
    "encode_record",
    "decode_member",
    "decode_assignment",
]

PEER_ALPN = "felix-peer/1"
"""The peer listener's ALPN: a peer connection offering anything else is refused."""
PEER_MAX_FRAME_BYTES = 67108864
"""payload cap of one peer frame (a forwarded publish carries the client's batch, base64-encoded: up to a 16 MiB client frame and its encoding overhead)"""
PEER_HELLO_MAX_FRAME_BYTES = 65536
"""payload cap until hello_ok: a peer that has not said who it is gets no more"""

_KEY_PART = re.compile(r"[^/]+")


def members_key(prefix: str, *, node_id: str) -> str:
    """`{prefix}/members/{node_id}`: attached to the broker's own lease: lease lost = member gone (value: Member)."""
    _check_part("node_id", node_id)
    return f"{prefix.rstrip('/')}/members/{node_id}"


def parse_members_key(prefix: str, key: str) -> tuple[str] | None:
    """The placeholders of a `members/{node_id}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 2)
    if parts is None:
        return None
    if parts[0] != "members":
        return None
    return (parts[1],)


def assignments_key(
    prefix: str, *, kind: str, tenant: str, namespace: str, name: str, shard: int
) -> str:
    """`{prefix}/assignments/{kind}/{tenant}/{namespace}/{name}/{shard}`: the generation is the key's mod_revision (store-assigned, strictly increasing, never reused); no generation field is stored (value: Assignment)."""
    _check_part("kind", kind)
    _check_part("tenant", tenant)
    _check_part("namespace", namespace)
    _check_part("name", name)
    return f"{prefix.rstrip('/')}/assignments/{kind}/{tenant}/{namespace}/{name}/{shard}"


def parse_assignments_key(prefix: str, key: str) -> tuple[str, str, str, str, int] | None:
    """The placeholders of a `assignments/{kind}/{tenant}/{namespace}/{name}/{shard}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 6)
    if parts is None:
        return None
    if parts[0] != "assignments":
        return None
    if not parts[5].isdigit():
        return None
    return (
        parts[1],
        parts[2],
        parts[3],
        parts[4],
        int(parts[5]),
    )


def placer_key(prefix: str) -> str:
    """`{prefix}/placer`: the placement holder's node or instance id (plain text), attached to its lease; created by a transaction comparing create_revision == 0."""
    return f"{prefix.rstrip('/')}/placer"


def parse_placer_key(prefix: str, key: str) -> tuple[()] | None:
    """The placeholders of a `placer` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 1)
    if parts is None:
        return None
    if parts[0] != "placer":
        return None
    return ()


def features_key(prefix: str, *, name: str) -> str:
    """`{prefix}/features/{name}`: a fleet feature the control plane finalized: created once by a transaction comparing create_revision == 0, never changed or deleted (finalizing is one-way); no lease (value: FinalizedFeature)."""
    _check_part("name", name)
    return f"{prefix.rstrip('/')}/features/{name}"


def parse_features_key(prefix: str, key: str) -> tuple[str] | None:
    """The placeholders of a `features/{name}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 2)
    if parts is None:
        return None
    if parts[0] != "features":
        return None
    return (parts[1],)


def move_progress_key(
    prefix: str, *, node_id: str, kind: str, tenant: str, namespace: str, name: str, shard: int
) -> str:
    """`{prefix}/progress/{node_id}/moves/{kind}/{tenant}/{namespace}/{name}/{shard}`: written by the successor of a move (node_id), attached to its own lease: it holds the shard's copy for the move at `generation`; the placer cuts over once it matches the moving assignment's generation (value: MoveCopied)."""
    _check_part("node_id", node_id)
    _check_part("kind", kind)
    _check_part("tenant", tenant)
    _check_part("namespace", namespace)
    _check_part("name", name)
    return (
        f"{prefix.rstrip('/')}/progress/{node_id}/moves/{kind}/{tenant}/{namespace}/{name}/{shard}"
    )


def parse_move_progress_key(prefix: str, key: str) -> tuple[str, str, str, str, str, int] | None:
    """The placeholders of a `progress/{node_id}/moves/{kind}/{tenant}/{namespace}/{name}/{shard}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 8)
    if parts is None:
        return None
    if parts[0] != "progress":
        return None
    if parts[2] != "moves":
        return None
    if not parts[7].isdigit():
        return None
    return (
        parts[1],
        parts[3],
        parts[4],
        parts[5],
        parts[6],
        int(parts[7]),
    )


def drain_request_key(prefix: str, *, node_id: str) -> str:
    """`{prefix}/progress/{node_id}/drain`: written by a broker told to stop (SIGTERM), attached to its own lease: it asks the placer to drain it (as drains/{node_id} does) and goes with its lease (value: Drain)."""
    _check_part("node_id", node_id)
    return f"{prefix.rstrip('/')}/progress/{node_id}/drain"


def parse_drain_request_key(prefix: str, key: str) -> tuple[str] | None:
    """The placeholders of a `progress/{node_id}/drain` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 3)
    if parts is None:
        return None
    if parts[0] != "progress":
        return None
    if parts[2] != "drain":
        return None
    return (parts[1],)


def promotion_refused_key(
    prefix: str, *, node_id: str, kind: str, tenant: str, namespace: str, name: str, shard: int
) -> str:
    """`{prefix}/progress/{node_id}/refused/{kind}/{tenant}/{namespace}/{name}/{shard}`: written by a replica (node_id) the placer promoted that found a fenced replica further ahead, attached to its own lease: it did not open at `generation`; the placer promotes one it names ahead (if live) at a new generation, or keeps the shard unavailable. Deleted by the replica once it holds a newer generation (value: PromotionRefusal)."""
    _check_part("node_id", node_id)
    _check_part("kind", kind)
    _check_part("tenant", tenant)
    _check_part("namespace", namespace)
    _check_part("name", name)
    return f"{prefix.rstrip('/')}/progress/{node_id}/refused/{kind}/{tenant}/{namespace}/{name}/{shard}"


def parse_promotion_refused_key(
    prefix: str, key: str
) -> tuple[str, str, str, str, str, int] | None:
    """The placeholders of a `progress/{node_id}/refused/{kind}/{tenant}/{namespace}/{name}/{shard}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 8)
    if parts is None:
        return None
    if parts[0] != "progress":
        return None
    if parts[2] != "refused":
        return None
    if not parts[7].isdigit():
        return None
    return (
        parts[1],
        parts[3],
        parts[4],
        parts[5],
        parts[6],
        int(parts[7]),
    )


def drains_key(prefix: str, *, node_id: str) -> str:
    """`{prefix}/drains/{node_id}`: written by the control plane: the broker is being drained; the placer moves every shard it leads elsewhere and places nothing new on it; deleted when the drain is cancelled or the broker leaves (value: Drain)."""
    _check_part("node_id", node_id)
    return f"{prefix.rstrip('/')}/drains/{node_id}"


def parse_drains_key(prefix: str, key: str) -> tuple[str] | None:
    """The placeholders of a `drains/{node_id}` key below `prefix`, or None when `key` is not one."""
    parts = _split(prefix, key, 2)
    if parts is None:
        return None
    if parts[0] != "drains":
        return None
    return (parts[1],)


def _check_part(name: str, value: str) -> None:
    if not _KEY_PART.fullmatch(value):
        raise ValueError(f"{name} {value!r} cannot be a key part (empty, or holds '/')")


def _split(prefix: str, key: str, count: int) -> list[str] | None:
    head = prefix.rstrip("/") + "/"
    if not key.startswith(head):
        return None
    parts = key[len(head) :].split("/")
    if len(parts) != count or not all(parts):
        return None
    return parts


class AssignmentState(enum.StrEnum):
    """active: the leader serves it; unavailable: nobody does (reason says why); draining: the leader hands it over; moving: fenced for a move, writes are held"""

    ACTIVE = "active"
    UNAVAILABLE = "unavailable"
    DRAINING = "draining"
    MOVING = "moving"


class AssignmentKind(enum.StrEnum):
    STREAM = "stream"
    CACHE = "cache"


class ForwardAck(enum.StrEnum):
    """when the owner answers a forwarded publish: once it is queued on the owner, or after it is written (with its first offset on a durable stream)"""

    ENQUEUED = "enqueued"
    WRITTEN = "written"


class ShipRefusal(enum.StrEnum):
    """why a follower refused a ship: fenced (it holds a newer generation, named in the refusal) or resume (it lacks the record before the ship: resume at resume_at)"""

    FENCED = "fenced"
    RESUME = "resume"


class CacheOpKind(enum.StrEnum):
    """what a replicated cache op does; expire is the leader's TTL delete (applied only while the key still holds the version that expired)"""

    PUT = "put"
    DELETE = "delete"
    PUT_IF = "put_if"
    DELETE_IF = "delete_if"
    COUNTER_ADD = "counter_add"
    EXPIRE = "expire"


class GroupChangeKind(enum.StrEnum):
    """one durable change of a consumer group (the group log's record kinds, felix_broker/groups/records.py): cursor moved, dead-lettered, discarded, redriven, a redriven record settled, group deleted, seek, acked above the cursor"""

    CURSOR = "cursor"
    DEAD = "dead"
    DISCARD = "discard"
    REDRIVE = "redrive"
    SETTLED = "settled"
    DELETE = "delete"
    SEEK = "seek"
    ACKED = "acked"


class Member(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A live broker's registration."""

    node_id: str
    client_addr: str
    """host:port clients use; empty when the broker has none to give (FELIX_CLIENT_ADVERTISE_ADDR unset)"""
    peer_addr: str
    """host:port of its broker-to-broker listener"""
    features: list[str]
    """fleet features this broker implements (an open set of words)"""
    incarnation: U64
    """a number the broker picks anew at each start, higher than any it used before: tells a restarted broker from its old registration"""
    ops_addr: str | None = None
    """host:port of its plain-HTTP ops listener (/backup/offsets, /metrics); absent when it binds a wildcard address and FELIX_OPS_ADVERTISE_ADDR is unset"""

    def __post_init__(self) -> None:
        _check_u64(self, ("incarnation",), ())


class Assignment(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One shard's assignment (its generation is the key's mod_revision)."""

    leader: str | None = None
    """node id; kept while unavailable/owner_unavailable so the same broker takes the shard back"""
    replicas: list[str]
    """node ids (empty until replication exists)"""
    state: AssignmentState
    reason: str | None = None
    """a shard_unavailable reason when not served (owner_unavailable, not_assigned, ...)"""
    successor: str | None = None
    """during a move: the node taking over"""


class FinalizedFeature(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A fleet feature every live broker supported when the control plane finalized it; brokers act on it from then on, and a broker without it may not join."""

    name: str
    """the feature's word, as brokers list it in Member.features"""
    finalized_at_ms: U64
    """the control plane's clock when it finalized, milliseconds since the Unix epoch"""
    by: str
    """the control-plane instance that finalized it"""
    members: list[str]
    """the node ids that were live (and supported it) at that moment"""

    def __post_init__(self) -> None:
        _check_u64(self, ("finalized_at_ms",), ())


class MoveCopied(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A successor's report: it holds the shard's storage as it was at the fence."""

    generation: U64
    """the generation of the moving assignment the copy was made for"""
    files: U32
    """how many files the copy installed (0 for an in-memory shard)"""
    bytes: U64
    """how many bytes they hold"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "bytes",
            ),
            (),
        )


class PromotionRefusal(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A promoted replica did not open: a replica it fenced holds a log further ahead."""

    generation: U64
    """the generation of the assignment it refused (the key's mod_revision the placer wrote)"""
    ahead: list[str]
    """the replicas whose logs are further ahead (promote one of those)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class Drain(msgspec.Struct, omit_defaults=True, kw_only=True):
    """An operator's (or the broker's own) request to move every shard a broker leads elsewhere."""

    requested_by: str
    """who asked: an operator, or the broker itself at shutdown"""


class LeaderHint(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Who leads a shard, as the answering broker holds it."""

    node_id: str
    addr: str | None = None
    """the leader's client address; absent when it has none"""
    generation: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class StaleRoute(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The forwarder's generation is ahead of the owner's: the owner is the one behind and must not write."""

    generation: U64
    """the generation the owner holds"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class PeerError(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A refusal the client sees as an error with this code, class and detail."""

    code: str
    retry: str
    message: str
    detail: ErrorDetail | None = None


class ForwardRefusal(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Why a forwarded request was not served, externally tagged: exactly one key is present. Nothing was applied, except where an error's retry class says outcome_unknown."""

    error: PeerError | None = None
    not_leader: LeaderHint | None = None
    """the forwarder is behind: this broker does not lead the shard"""
    stale_route: StaleRoute | None = None

    def __post_init__(self) -> None:
        present = [
            name
            for name in (
                "error",
                "not_leader",
                "stale_route",
            )
            if getattr(self, name) is not None
        ]
        if len(present) != 1:
            raise ValueError(
                f"exactly one of error, not_leader, stale_route must be present, got {present or 'none'}"
            )


class ReplicationHalt(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A replica that stopped replicating: a leader's ship conflicted with a record below the mark it knew (a correct fleet never does this). It serves nothing and takes no ships until an operator acts; it clears when the replica is removed or rebuilt."""

    shard: ReplicaShard
    node: str
    """this broker's node id"""
    generation: U64
    """the ballot it held when it halted"""
    progress: U64
    """the offset of the conflicting record (what it holds below is committed)"""
    reason: str
    """below_commit (an open set of words)"""
    suggested_action: str

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "progress",
            ),
            (),
        )


class ReplicaShard(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The shard a replication message is about (its assignment key's parts)."""

    kind: AssignmentKind
    tenant: str
    namespace: str
    name: str
    shard: U32


class ReplicaEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One log record as the replicas hold it: the generation that wrote it (kept when shipped), its bytes (the stored record whole: offset, append time, publisher and producer marks, so a follower's record is the leader's byte for byte), and whether it is a generation-start record (takes an offset, never delivered)."""

    generation: U64
    payload: bytes
    start: bool = False

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ReplicatedBatch(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The payload of a stream shard's ReplicaEntry: one publish batch as the leader stored it. Every replica applies committed batches in log order to the shard's stream log, so offsets (assigned in that order), append times, publishers and marks are the leader's on every replica."""

    timestamp_us: U64
    """the leader's append time (one per batch)"""
    publisher: str | None = None
    """the stored publisher principal (record_publishers on)"""
    payloads: list[bytes]
    """non-empty"""
    producer_id: U64 | None = None
    """the idempotent producer mark, when the batch is one"""
    sequence: U64 | None = None
    digest: U64 | None = None
    expected_offset: U64 | None = None
    """publish_if, or commit with expected_offset: the batch is applied only if the shard's stream log ends exactly here when the batch's turn comes in the log (checked by every replica at the batch's place, so every replica decides the same); otherwise nothing of it is written (decision quorum-guarded-writes)"""
    commit: ReplicatedCommit | None = None
    """commit: the entity's state changes, stored with the batch (its one payload is the event) and applied to the state view with it"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "timestamp_us",
                "producer_id",
                "sequence",
                "digest",
                "expected_offset",
            ),
            (),
        )


class ReplicatedStateChange(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One state change of a replicated commit: a put (value present) or a delete (value absent)."""

    key: str
    value: bytes | None = None
    """absent: the key is deleted"""


class ReplicatedCommit(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A commit's entity and state changes, as the leader admitted them (the event is the batch's one payload)."""

    entity_key: bytes
    changes: list[ReplicatedStateChange]
    """may be empty"""


class MoveFile(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One file of a moving shard's storage as the old leader holds it once the shard is closed: the successor's staged copy must hold exactly these bytes."""

    area: str
    """streams, groups or cache"""
    path: str
    """the file's name inside the shard's folder of that area (one path segment)"""
    size: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("size",), ())


class ReplicatedCacheOp(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The payload of a cache shard's ReplicaEntry: one write as the leader admitted it. Every replica applies committed ops in log order to its cache shard, with the leader's clock (now_ms), so entries, versions (cache log offsets), TTLs and counter sums are the leader's on every replica. A condition is checked when the op is applied (at its place in the log), not when it was admitted."""

    op: CacheOpKind
    key: str
    now_ms: U64
    """the leader's wall clock when it admitted the op (TTL deadlines and expiry checks)"""
    value: bytes | None = None
    """put and put_if"""
    ttl_ms: U64 | None = None
    """put and put_if; absent or 0: no expiry"""
    version: U64 | None = None
    """put_if: the version the key must hold (absent: the key must be absent); delete_if and expire: the version the key must hold"""
    delta: I64 | None = None
    """counter_add"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "now_ms",
                "ttl_ms",
                "version",
            ),
            (),
        )


class CacheSnapshotEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One live entry of a cache shard in a CacheSnapshot."""

    key: str
    value: bytes
    version: U64
    """the offset of the put that wrote it in the replica's cache shard log"""
    expires_at_ms: U64 = 0
    """the leader's wall clock deadline; 0: never"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "version",
                "expires_at_ms",
            ),
            (),
        )


class CacheSnapshotCounter(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One counter of a cache shard in a CacheSnapshot."""

    key: str
    total: I64


class CacheSnapshot(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A Quorum cache shard's state once every entry of its replication log below `offset` is applied (and nothing above): what a replica rebuilds from instead of the records below `offset`, which its replication log may then drop. Deterministic given the log, so the same at one offset on every replica."""

    offset: U64
    """replication log offset: the entries below it are applied"""
    generation: U64
    """the generation of the replication log's record at offset - 1 (0 at 0)"""
    tail: U64
    """the cache shard log's next offset (the version the next put gets)"""
    entries: list[CacheSnapshotEntry]
    """in recency order, the next to evict first"""
    counters: list[CacheSnapshotCounter]

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "generation",
                "tail",
            ),
            (),
        )


class ReplicatedGroupChange(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One durable change of one consumer group of a Quorum stream shard, as the leader's group state made it."""

    kind: GroupChangeKind
    group: str
    offset: U64 = 0
    """a stream offset of the shard (0 for delete)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("offset",), ())


class ReplicatedGroupChanges(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The payload of a Quorum stream shard's ReplicaEntry that carries group changes rather than a publish batch (it rides the stream's own replication log, after the records it settles). Its msgpack map has this one field, so its first byte is 0x81, which a ReplicatedBatch (two required fields) never has: that byte tells the two apart. Every replica applies committed changes in log order to its group log; a settle is acknowledged once a majority holds it."""

    group_changes: list[ReplicatedGroupChange]
    """non-empty; the changes of one settle (or of one loop pass's settles), in the order the state made them"""


class ReplicatedRetention(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The payload of a Quorum stream shard's ReplicaEntry that carries the leader's retention cut (decision quorum-retention-cut): every replica, applying it in log order, forgets the producer table's batches below `retain_from`, and its own retention never removes stream records at or above the last cut it applied. Its msgpack map has this one field, so its first byte is 0x81 like a ReplicatedGroupChanges; the field name that follows (retain_from) tells the two apart."""

    retain_from: U64
    """a stream offset of the shard: producer batches below it are forgotten, on every replica at this place in the log"""

    def __post_init__(self) -> None:
        _check_u64(self, ("retain_from",), ())


CacheOp = Union[
    CacheGet,
    CachePut,
    CacheDelete,
    CachePutIf,
    CacheDeleteIf,
    CounterAdd,
    CounterGet,
]
"""A client cache or counter request, carried whole."""


CacheOpAnswer = Union[
    CacheValue,
    CacheOk,
    CacheConditionResult,
    CounterValue,
    Error,
    Unsupported,
]
"""The answer the client gets, already shaped for what the client negotiated."""


class Hello(msgspec.Struct, tag_field="type", tag="hello", omit_defaults=True, kw_only=True):
    """The first frame of every peer stream: who is dialing.

    Direction: dialer_to_listener.
    Answered by: hello_ok, hello_refused.
    """

    node_id: str
    """must equal the DNS SAN of the dialer's certificate"""
    features: list[str]
    """fleet features the dialer implements"""


class HelloOk(msgspec.Struct, tag_field="type", tag="hello_ok", omit_defaults=True, kw_only=True):
    """The listener accepts the dialer.

    Direction: listener_to_dialer.
    """

    node_id: str
    features: list[str]


class HelloRefused(
    msgspec.Struct, tag_field="type", tag="hello_refused", omit_defaults=True, kw_only=True
):
    """The listener refuses the dialer (identity mismatch, unknown member); the stream ends.

    Direction: listener_to_dialer.
    """

    message: str


class ForwardPublish(
    msgspec.Struct, tag_field="type", tag="forward_publish", omit_defaults=True, kw_only=True
):
    """A client's publish batch, forwarded by the broker it reached to the shard's owner.

    Direction: dialer_to_listener.
    Answered by: forward_publish_ok, forward_refused.
    """

    request_id: U64
    """the forwarder's correlation id (not the client's)"""
    token: str
    """the client's bearer token, re-verified by the owner (stream.publish)"""
    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    """the shard the forwarder resolved the key to; the owner writes there"""
    generation: U64
    """the generation of the forwarder's route"""
    key: bytes | None = None
    """the routing key; absent for an unkeyed publish"""
    payloads: list[bytes]
    """non-empty"""
    ack: ForwardAck

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "generation",
            ),
            (),
        )


class ForwardPublishOk(
    msgspec.Struct, tag_field="type", tag="forward_publish_ok", omit_defaults=True, kw_only=True
):
    """The owner accepted the batch.

    Direction: listener_to_dialer.
    """

    request_id: U64
    offset: U64 | None = None
    """the first record's offset (ack written, durable stream)"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "offset",
            ),
            (),
        )


class ForwardCacheOp(
    msgspec.Struct, tag_field="type", tag="forward_cache_op", omit_defaults=True, kw_only=True
):
    """A client's cache or counter request, forwarded to the owner of the key's shard.

    Direction: dialer_to_listener.
    Answered by: forward_cache_answer, forward_refused.
    """

    request_id: U64
    token: str
    """the client's bearer token, re-verified by the owner (cache.read or cache.write)"""
    client_flags: U16
    """the frame flags the client offered"""
    client_features: U64
    """the features the client offered (both words)"""
    shard: U32
    generation: U64
    op: CacheOp

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "client_features",
                "generation",
            ),
            (),
        )


class ForwardCacheAnswer(
    msgspec.Struct, tag_field="type", tag="forward_cache_answer", omit_defaults=True, kw_only=True
):
    """The owner's answer to the client, shaped for the client's offer; the forwarder writes it as is.

    Direction: listener_to_dialer.
    """

    request_id: U64
    answer: CacheOpAnswer

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ForwardRefused(
    msgspec.Struct, tag_field="type", tag="forward_refused", omit_defaults=True, kw_only=True
):
    """A forwarded request the owner did not serve.

    Direction: listener_to_dialer.
    """

    request_id: U64
    refusal: ForwardRefusal

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class PeerUnsupported(
    msgspec.Struct, tag_field="type", tag="peer_unsupported", omit_defaults=True, kw_only=True
):
    """A peer request type this broker does not know.

    Direction: listener_to_dialer.
    """

    request_type: str
    request_id: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class MoveChunk(
    msgspec.Struct, tag_field="type", tag="move_chunk", omit_defaults=True, kw_only=True
):
    """A piece of one file of a moving shard's storage, from the old leader to the successor. The old leader sends the chunks of a move one after the other, then move_done.

    Direction: dialer_to_listener.
    Answered by: move_chunk_ok, forward_refused.
    """

    request_id: U64
    kind: AssignmentKind
    tenant_id: str
    namespace: str
    name: str
    shard: U32
    generation: U64
    """the moving assignment's generation (the fence)"""
    area: str
    """the storage area the file belongs to: streams, groups or cache"""
    path: str
    """the file's name inside the shard's folder of that area (one path segment)"""
    position: U64
    """where in the file this piece starts"""
    data: bytes
    """at most 1 MiB"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "generation",
                "position",
            ),
            (),
        )


class MoveChunkOk(
    msgspec.Struct, tag_field="type", tag="move_chunk_ok", omit_defaults=True, kw_only=True
):
    """The successor staged the piece.

    Direction: listener_to_dialer.
    """

    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class MoveDone(msgspec.Struct, tag_field="type", tag="move_done", omit_defaults=True, kw_only=True):
    """Every file of the moving shard was sent: the successor installs the staged copy in place and reports it in etcd (move_progress).

    Direction: dialer_to_listener.
    Answered by: move_done_ok, forward_refused.
    """

    request_id: U64
    kind: AssignmentKind
    tenant_id: str
    namespace: str
    name: str
    shard: U32
    generation: U64
    files: U32
    """how many files were sent (the successor checks it staged as many)"""
    bytes: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "generation",
                "bytes",
            ),
            (),
        )


class MoveDoneOk(
    msgspec.Struct, tag_field="type", tag="move_done_ok", omit_defaults=True, kw_only=True
):
    """The successor installed the copy and reported it.

    Direction: listener_to_dialer.
    """

    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ReplicaShip(
    msgspec.Struct, tag_field="type", tag="replica_ship", omit_defaults=True, kw_only=True
):
    """Leader to follower: records from offset; prev_generation labels the record at offset - 1 (0 when offset is 0); commit is the leader's quorum mark.

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    leader: str
    offset: U64
    prev_generation: U64
    entries: list[ReplicaEntry]
    """may be empty (a heartbeat carrying the mark)"""
    commit: U64
    compacted: U64 = 0
    """every replica holds the records below this offset, committed and applied: a follower may drop them from its replication log file"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "offset",
                "prev_generation",
                "commit",
                "compacted",
            ),
            (),
        )


class ReplicaShipOk(
    msgspec.Struct, tag_field="type", tag="replica_ship_ok", omit_defaults=True, kw_only=True
):
    """Follower to leader: it holds the leader's log up to matched, and durably (fsynced) up to durable (never more than matched).

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    sender: str
    durable: U64
    matched: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "durable",
                "matched",
            ),
            (),
        )


class ReplicaShipRefused(
    msgspec.Struct, tag_field="type", tag="replica_ship_refused", omit_defaults=True, kw_only=True
):
    """Follower to leader: the ship was not taken (refusal says why).

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    """the follower's generation (newer than the leader's when fenced)"""
    sender: str
    refusal: ShipRefusal
    resume_at: U64 = 0

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "resume_at",
            ),
            (),
        )


class ReplicaFence(
    msgspec.Struct, tag_field="type", tag="replica_fence", omit_defaults=True, kw_only=True
):
    """A candidate at generation asks a replica to persist the ballot and refuse older leaders.

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    candidate: str

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ReplicaFenceOk(
    msgspec.Struct, tag_field="type", tag="replica_fence_ok", omit_defaults=True, kw_only=True
):
    """The replica persisted the ballot; its log's last record generation and length (how far ahead it is).

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    sender: str
    last_generation: U64
    length: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "last_generation",
                "length",
            ),
            (),
        )


class ReplicaFenceRefused(
    msgspec.Struct, tag_field="type", tag="replica_fence_refused", omit_defaults=True, kw_only=True
):
    """The replica holds a newer generation (or this one under another leader).

    Direction: dialer_to_listener.
    Answered by: replica_received.
    """

    shard: ReplicaShard
    generation: U64
    """the generation the replica holds"""
    sender: str

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ReplicaReceived(
    msgspec.Struct, tag_field="type", tag="replica_received", omit_defaults=True, kw_only=True
):
    """The receiver fed the replication message to its replica of the shard, or has none (held false: it does not replicate that shard, and the message was dropped).

    Direction: listener_to_dialer.
    """

    held: bool


class MoveCaughtUp(
    msgspec.Struct, tag_field="type", tag="move_caught_up", omit_defaults=True, kw_only=True
):
    """The old leader's catch-up passes (move_chunk at the catch-up generation, sent while it still accepts writes) are done: the successor keeps what it staged and reports it in etcd (move_progress at this generation), so the placer fences the shard.

    Direction: dialer_to_listener.
    Answered by: move_done_ok, forward_refused.
    """

    request_id: U64
    kind: AssignmentKind
    tenant_id: str
    namespace: str
    name: str
    shard: U32
    generation: U64
    """the catch-up assignment's generation (active, with the successor named)"""
    passes: U32
    """how many passes were copied"""
    bytes: U64
    """how many bytes the passes sent"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "generation",
                "bytes",
            ),
            (),
        )


class MoveFinal(
    msgspec.Struct, tag_field="type", tag="move_final", omit_defaults=True, kw_only=True
):
    """After the fence the old leader sent the last delta (move_chunk at the fence's generation): the successor drops staged files not listed, checks every listed file holds exactly its size, installs the copy and reports it (move_progress). A mismatch is refused; the old leader then sends the whole shard again.

    Direction: dialer_to_listener.
    Answered by: move_done_ok, forward_refused.
    """

    request_id: U64
    kind: AssignmentKind
    tenant_id: str
    namespace: str
    name: str
    shard: U32
    generation: U64
    """the fence's generation (moving)"""
    files: list[MoveFile]
    """every file of the shard"""
    bytes: U64
    """how many bytes were sent after the fence (the final delta)"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "generation",
                "bytes",
            ),
            (),
        )


class ReplicaReadRound(
    msgspec.Struct, tag_field="type", tag="replica_read_round", omit_defaults=True, kw_only=True
):
    """A leader about to answer a read of a Quorum shard (FELIX_QUORUM_READS=majority, lease_free_reads finalized) asks a replica whether it still holds the leader's generation. Read-only on the replica: nothing is persisted. The read is answered once a majority of the replica set (the leader included) confirmed; one answer naming a newer generation fails it as leadership_lost.

    Direction: dialer_to_listener.
    Answered by: replica_read_answer.
    """

    shard: ReplicaShard
    generation: U64
    """the leader's generation"""
    leader: str
    """the asking leader's node id (checked against its peer certificate)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ReplicaReadAnswer(
    msgspec.Struct, tag_field="type", tag="replica_read_answer", omit_defaults=True, kw_only=True
):
    """The replica's ballot for the shard. It confirms the round when held is true and generation is at most the leader's (and, at the leader's own generation, it follows no other leader: confirmed says so); held false: it holds no replica of the shard (no vote).

    Direction: listener_to_dialer.
    """

    held: bool
    generation: U64 = 0
    """the newest generation the replica accepted"""
    confirmed: bool = False
    """the replica confirms the asking leader at its generation"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ReplicaSnapshotRequest(
    msgspec.Struct,
    tag_field="type",
    tag="replica_snapshot_request",
    omit_defaults=True,
    kw_only=True,
):
    """A follower of a Quorum cache shard shipped records past its log's end while the leader says every replica holds the records below `compacted` (its log lost them: a replaced disk) asks the leader for its snapshot to rebuild from (felix_broker/replication/cache.py). Read-only on the leader.

    Direction: dialer_to_listener.
    Answered by: replica_snapshot.
    """

    shard: ReplicaShard
    sender: str
    """the asking replica's node id (checked against its peer certificate)"""


class ReplicaSnapshot(
    msgspec.Struct, tag_field="type", tag="replica_snapshot", omit_defaults=True, kw_only=True
):
    """The leader's cache shard as applied now (its state at `snapshot.offset`, a committed offset at or above its compacted point). held false: this broker is not the shard's open leader here, or its keys and values pass 32 MiB (refused: too_large; a peer frame carries at most max_frame_bytes of JSON).

    Direction: listener_to_dialer.
    """

    held: bool
    generation: U64 = 0
    """the leader's generation"""
    snapshot: CacheSnapshot | None = None
    refused: str | None = None
    """not_leader or too_large (an open set of words)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


PeerMessage = Union[
    Hello,
    HelloOk,
    HelloRefused,
    ForwardPublish,
    ForwardPublishOk,
    ForwardCacheOp,
    ForwardCacheAnswer,
    ForwardRefused,
    PeerUnsupported,
    MoveChunk,
    MoveChunkOk,
    MoveDone,
    MoveDoneOk,
    ReplicaShip,
    ReplicaShipOk,
    ReplicaShipRefused,
    ReplicaFence,
    ReplicaFenceOk,
    ReplicaFenceRefused,
    ReplicaReceived,
    MoveCaughtUp,
    MoveFinal,
    ReplicaReadRound,
    ReplicaReadAnswer,
    ReplicaSnapshotRequest,
    ReplicaSnapshot,
]
"""Any known peer message."""

PEER_MESSAGE_CLASSES: Mapping[str, type[PeerMessage]] = MappingProxyType(
    {
        "hello": Hello,
        "hello_ok": HelloOk,
        "hello_refused": HelloRefused,
        "forward_publish": ForwardPublish,
        "forward_publish_ok": ForwardPublishOk,
        "forward_cache_op": ForwardCacheOp,
        "forward_cache_answer": ForwardCacheAnswer,
        "forward_refused": ForwardRefused,
        "peer_unsupported": PeerUnsupported,
        "move_chunk": MoveChunk,
        "move_chunk_ok": MoveChunkOk,
        "move_done": MoveDone,
        "move_done_ok": MoveDoneOk,
        "replica_ship": ReplicaShip,
        "replica_ship_ok": ReplicaShipOk,
        "replica_ship_refused": ReplicaShipRefused,
        "replica_fence": ReplicaFence,
        "replica_fence_ok": ReplicaFenceOk,
        "replica_fence_refused": ReplicaFenceRefused,
        "replica_received": ReplicaReceived,
        "move_caught_up": MoveCaughtUp,
        "move_final": MoveFinal,
        "replica_read_round": ReplicaReadRound,
        "replica_read_answer": ReplicaReadAnswer,
        "replica_snapshot_request": ReplicaSnapshotRequest,
        "replica_snapshot": ReplicaSnapshot,
    }
)
DIALER_TO_LISTENER = frozenset(
    {
        "hello",
        "forward_publish",
        "forward_cache_op",
        "move_chunk",
        "move_done",
        "replica_ship",
        "replica_ship_ok",
        "replica_ship_refused",
        "replica_fence",
        "replica_fence_ok",
        "replica_fence_refused",
        "move_caught_up",
        "move_final",
        "replica_read_round",
        "replica_snapshot_request",
    }
)
LISTENER_TO_DIALER = frozenset(
    {
        "hello_ok",
        "hello_refused",
        "forward_publish_ok",
        "forward_cache_answer",
        "forward_refused",
        "peer_unsupported",
        "move_chunk_ok",
        "move_done_ok",
        "replica_received",
        "replica_read_answer",
        "replica_snapshot",
    }
)
RECORD_CLASSES: Mapping[str, type[msgspec.Struct]] = MappingProxyType(
    {
        "Member": Member,
        "Assignment": Assignment,
        "FinalizedFeature": FinalizedFeature,
        "MoveCopied": MoveCopied,
        "PromotionRefusal": PromotionRefusal,
        "Drain": Drain,
    }
)

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(PeerMessage)
_ANY_DECODER = msgspec.json.Decoder(Any)
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_RECORD_DECODERS = {name: msgspec.json.Decoder(kind) for name, kind in RECORD_CLASSES.items()}


def encode_peer_message(message: PeerMessage) -> bytes:
    """The JSON payload of a peer message: compact, "type" first."""
    return _ENCODER.encode(message)


def decode_peer_message(payload: bytes | bytearray | memoryview) -> PeerMessage | Unknown:
    """Decode a peer frame's payload; an unknown "type" is `Unknown`, not an error.
    Raises MalformedJsonError or MessageFieldError."""
    try:
        return _DECODER.decode(payload)
    except msgspec.ValidationError as exc:
        return _explain(payload, exc)
    except msgspec.DecodeError as exc:
        raise MalformedJsonError("json", None, None, str(exc)) from None


def _explain(payload: bytes | bytearray | memoryview, exc: msgspec.ValidationError) -> Unknown:
    try:
        raw = _ANY_DECODER.decode(payload)
    except msgspec.DecodeError as decode_exc:
        raise MalformedJsonError("json", None, None, str(decode_exc)) from None
    if not isinstance(raw, dict):
        raise MalformedJsonError("json", None, None, "payload is not a JSON object") from None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise MalformedJsonError("json", "type", None, 'missing or non-string "type"') from None
    if kind not in PEER_MESSAGE_CLASSES:
        request_id = raw.get("request_id")
        if not (
            isinstance(request_id, int)
            and not isinstance(request_id, bool)
            and 0 <= request_id < 2**64
        ):
            request_id = None
        return Unknown(kind, raw, request_id)
    text = str(exc)
    match = _PATH.search(text)
    field = match.group(1) if match else None
    raise MessageFieldError(kind, field or None, None, _PATH.sub("", text)) from None


def encode_record(
    record: Member | Assignment | FinalizedFeature | MoveCopied | PromotionRefusal | Drain,
) -> bytes:
    """An etcd value: the record's compact JSON."""
    return _ENCODER.encode(record)


def _decode_record(name: str, value: bytes | bytearray | memoryview) -> Any:
    try:
        return _RECORD_DECODERS[name].decode(value)
    except msgspec.ValidationError as exc:
        match = _PATH.search(str(exc))
        field = match.group(1) if match else None
        raise MessageFieldError(name, field or None, None, _PATH.sub("", str(exc))) from None
    except msgspec.DecodeError as exc:
        raise MalformedJsonError("json", None, None, str(exc)) from None


def decode_member(value: bytes | bytearray | memoryview) -> Member:
    """A `Member` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: Member = _decode_record("Member", value)
    return record


def decode_assignment(value: bytes | bytearray | memoryview) -> Assignment:
    """A `Assignment` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: Assignment = _decode_record("Assignment", value)
    return record


def decode_finalizedfeature(value: bytes | bytearray | memoryview) -> FinalizedFeature:
    """A `FinalizedFeature` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: FinalizedFeature = _decode_record("FinalizedFeature", value)
    return record


def decode_movecopied(value: bytes | bytearray | memoryview) -> MoveCopied:
    """A `MoveCopied` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: MoveCopied = _decode_record("MoveCopied", value)
    return record


def decode_promotionrefusal(value: bytes | bytearray | memoryview) -> PromotionRefusal:
    """A `PromotionRefusal` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: PromotionRefusal = _decode_record("PromotionRefusal", value)
    return record


def decode_drain(value: bytes | bytearray | memoryview) -> Drain:
    """A `Drain` etcd value. Raises MalformedJsonError or MessageFieldError."""
    record: Drain = _decode_record("Drain", value)
    return record
