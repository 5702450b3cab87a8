# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Every JSON message of the protocol (frames with flags 0) as a msgspec Struct.

Messages are internally tagged by "type" and encoded compactly, "type" first,
then fields in the reference encoder's order. Presence rules of the catalogue:
- required: always written; missing on decode is an error;
- optional: omitted when None, never written as null; null reads as None;
- optional_null / nullable: always written, null when None;
- default: omitted when equal to the default, unless the catalogue says the
  reference encoder always emits it.
Unknown fields are ignored on decode. An unknown "type" decodes to `Unknown`
(carrying the raw object) rather than failing.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal, Mapping, Union
from types import MappingProxyType

import msgspec

from .frame import MAX_JSON_DEPTH
from .wire_errors import MalformedJsonError, MessageFieldError

__all__ = [
    "U8",
    "U16",
    "U32",
    "U64",
    "I64",
    "AckMode",
    "CursorErrorReason",
    "ShardKind",
    "ShardRouting",
    "StartOffset",
    "StartPosition",
    "VersionCondition",
    "CacheCondition",
    "SequenceGap",
    "OffsetMismatch",
    "NotLeaderHint",
    "PublishRefusal",
    "PublishRefusalReason",
    "StateChangePut",
    "StateChangeDelete",
    "StateChange",
    "ErrorDetail",
    "BrokerEndpoint",
    "ShardOwner",
    "GroupRecord",
    "StreamRecord",
    "ShardAssignment",
    "ShardFence",
    "ShardLease",
    "ReplicaView",
    "ShardInspection",
    "SubscriptionFilter",
    "SubscriptionCursor",
    "InspectedSubscription",
    "Auth",
    "AuthOk",
    "Ok",
    "Error",
    "Unsupported",
    "Extension",
    "Publish",
    "PublishBatch",
    "PublishOk",
    "PublishError",
    "ProducerInit",
    "ProducerInitOk",
    "PublishIdempotent",
    "PublishIf",
    "PublishRefused",
    "PublishWidth",
    "Subscribe",
    "Subscribed",
    "SubscribeCursorError",
    "EventStreamHello",
    "Event",
    "EventBatch",
    "ShardMoved",
    "SubscriptionLagged",
    "StreamDeleted",
    "CachePut",
    "CacheGet",
    "CacheDelete",
    "CacheValue",
    "CacheOk",
    "CachePutIf",
    "CacheDeleteIf",
    "CacheConditionResult",
    "CacheWatch",
    "CacheWatchStarted",
    "CacheEvent",
    "CacheWatchLagged",
    "CounterAdd",
    "CounterGet",
    "CounterValue",
    "Commit",
    "CommitOk",
    "StateGet",
    "StateValue",
    "OffsetForTime",
    "OffsetValue",
    "StreamRead",
    "StreamRecords",
    "GroupPoll",
    "GroupRecords",
    "GroupAck",
    "GroupNack",
    "GroupExtend",
    "GroupExtended",
    "GroupDeadLetter",
    "GroupDeadLetters",
    "GroupDeadLetterList",
    "GroupDiscard",
    "GroupRedrive",
    "GroupSeek",
    "GroupPosition",
    "GroupDescribe",
    "GroupInfo",
    "GroupDelete",
    "GroupDeleted",
    "Topology",
    "TopologyView",
    "StreamShards",
    "StreamShardsView",
    "CacheShards",
    "CacheShardsView",
    "ShardOwners",
    "ShardOwnersView",
    "ShardInspect",
    "ShardInspectInfo",
    "SubscriptionsList",
    "SubscriptionsListInfo",
    "NotLeader",
    "Message",
    "Unknown",
    "MESSAGE_CLASSES",
    "CLIENT_TO_BROKER",
    "BROKER_TO_CLIENT",
    "encode_message",
    "decode_message",
    "json_too_deep",
]

U8 = Annotated[int, msgspec.Meta(ge=0, le=255)]
U16 = Annotated[int, msgspec.Meta(ge=0, le=65535)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=4294967295)]
# msgspec bounds integers only within int64: the u64 ceiling is checked by the
# structs' __post_init__ (which runs on decode and on construction).
U64 = Annotated[int, msgspec.Meta(ge=0)]
I64 = Annotated[int, msgspec.Meta(ge=-9223372036854775808, le=9223372036854775807)]
_U64_MAX = 18446744073709551615


def _check_u64(obj: Any, scalars: tuple[str, ...], lists: tuple[str, ...]) -> None:
    for name in scalars:
        value = getattr(obj, name)
        if value is not None and value > _U64_MAX:
            raise ValueError(f"`{name}` = {value} does not fit in u64")
    for name in lists:
        for value in getattr(obj, name) or ():
            if value > _U64_MAX:
                raise ValueError(f"`{name}` item {value} does not fit in u64")


# Default factories: a field whose default comes from a factory other than the
# builtin containers is always written, which is how "always emitted" is expressed.
def _none() -> None:
    return None


def _false() -> bool:
    return False


def _zero() -> int:
    return 0


def _empty_list() -> list[Any]:
    return []


class AckMode(enum.StrEnum):
    NONE = "none"
    PER_MESSAGE = "per_message"
    PER_BATCH = "per_batch"


class CursorErrorReason(enum.StrEnum):
    TOO_OLD = "too_old"
    IN_FUTURE = "in_future"


class ShardKind(enum.StrEnum):
    STREAM = "stream"
    CACHE = "cache"


class ShardRouting(enum.StrEnum):
    """brokers only ever send jump_hash; absent = modulo"""

    MODULO = "modulo"
    JUMP_HASH = "jump_hash"


class StartOffset(msgspec.Struct, omit_defaults=True, kw_only=True):
    """StartOffset"""

    offset: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("offset",), ())


class VersionCondition(msgspec.Struct, omit_defaults=True, kw_only=True):
    """VersionCondition"""

    version: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("version",), ())


class SequenceGap(msgspec.Struct, omit_defaults=True, kw_only=True):
    """SequenceGap"""

    expected: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("expected",), ())


class OffsetMismatch(msgspec.Struct, omit_defaults=True, kw_only=True):
    """OffsetMismatch"""

    tail: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("tail",), ())


class NotLeaderHint(msgspec.Struct, omit_defaults=True, kw_only=True):
    """NotLeaderHint"""

    node_id: str
    addr: str | None = None


class PublishRefusal(msgspec.Struct, omit_defaults=True, kw_only=True):
    """the data-carrying refusal reasons, externally tagged: exactly one key is present"""

    sequence_gap: SequenceGap | None = None
    offset_mismatch: OffsetMismatch | None = None
    """only for conditional writes; tail = the shard's next offset as checked"""
    not_leader: NotLeaderHint | None = None

    def __post_init__(self) -> None:
        present = [
            name
            for name in (
                "sequence_gap",
                "offset_mismatch",
                "not_leader",
            )
            if getattr(self, name) is not None
        ]
        if len(present) != 1:
            raise ValueError(
                f"exactly one of sequence_gap, offset_mismatch, not_leader must be present, got {present or 'none'}"
            )


class StateChangePut(msgspec.Struct, omit_defaults=True, kw_only=True, tag_field="op", tag="put"):
    """StateChangePut"""

    key: str
    value: bytes


class StateChangeDelete(
    msgspec.Struct, omit_defaults=True, kw_only=True, tag_field="op", tag="delete"
):
    """StateChangeDelete"""

    key: str


class ErrorDetail(msgspec.Struct, omit_defaults=True, kw_only=True):
    """every field optional; unknown fields ignored"""

    reason: str | None = None
    retry_after_ms: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("retry_after_ms",), ())


class BrokerEndpoint(msgspec.Struct, omit_defaults=True, kw_only=True):
    """BrokerEndpoint"""

    node_id: str
    addr: str
    """host:port"""


class ShardOwner(msgspec.Struct, omit_defaults=True, kw_only=True):
    """ShardOwner"""

    shard: U32
    node_id: str | None = None
    addr: str | None = None
    generation: U64
    unavailable: str | None = None
    """same words as shard_unavailable reasons"""

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class GroupRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """GroupRecord"""

    offset: U64
    payload: bytes
    attempts: U32 = msgspec.field(default_factory=_zero)
    """deliveries including this one; 0/missing = not reported, not 'first'"""
    skipped_before: U64 = 0
    """[gate: FEATURE_GROUP_SKIPPED]"""
    publisher: str | None = None
    """[gate: FEATURE_GROUP_PUBLISHER]"""
    timestamp_micros: U64 | None = None
    """[gate: FEATURE_RECORD_TIMESTAMPS]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "skipped_before",
                "timestamp_micros",
            ),
            (),
        )


class StreamRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """StreamRecord"""

    offset: U64
    payload: bytes
    publisher: str | None = None
    timestamp_micros: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "timestamp_micros",
            ),
            (),
        )


class ShardAssignment(msgspec.Struct, omit_defaults=True, kw_only=True):
    """ShardAssignment"""

    generation: U64
    leader: str
    replicas: list[str]
    draining: bool = False
    successor: str | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


class ShardFence(msgspec.Struct, omit_defaults=True, kw_only=True):
    """ShardFence"""

    took: list[str]
    pending: list[str]
    attempts: U32
    retry_in_ms: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("retry_in_ms",), ())


class ShardLease(msgspec.Struct, omit_defaults=True, kw_only=True):
    """ShardLease"""

    held: bool
    remaining_ms: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("remaining_ms",), ())


class ReplicaView(msgspec.Struct, omit_defaults=True, kw_only=True):
    """ReplicaView"""

    node_id: str
    role: str
    """follower | learner"""
    next_offset: U64 | None = None
    lag: U64 | None = None
    fence: bool | None = None
    state: str
    """shipping, stalled, copying, rebuilding, halted, fencing (open set)"""
    halted: str | None = None
    matched: U64 | None = None
    """the prefix of the leader's replication log this replica holds, verified at this generation (next_offset, lag, matched and durable are replication-log offsets)"""
    durable: U64 | None = None
    """of which fsynced (what the quorum mark counts)"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "next_offset",
                "lag",
                "matched",
                "durable",
            ),
            (),
        )


class ShardInspection(msgspec.Struct, omit_defaults=True, kw_only=True):
    """word-valued fields are free strings: a reader accepts unknown words"""

    node_id: str
    """answering broker; empty outside a cluster"""
    shards: U32
    role: str
    """leader | follower | none (open set)"""
    phase: str
    """unassigned, opening, fencing, active, draining, closed, failed (open set)"""
    serving: bool
    reason: str | None = None
    detail: str | None = None
    generation: U64 | None = None
    assignment: ShardAssignment | None = None
    fence: ShardFence | None = None
    lease: ShardLease | None = None
    tail: U64 | None = None
    committed: U64 | None = None
    accepted_generation: U64 | None = None
    replicas: list[ReplicaView] = msgspec.field(default_factory=list)
    """omitted when empty"""
    replica_state: str | None = None
    """the replication core's state here: leader, settling (led, no mark yet), fencing (a candidate), follower, halted (open set)"""
    replication_tail: U64 | None = None
    """the replication log's length here (replication-log offsets, like every replica_ and replicas field; a generation-start record takes one)"""
    replication_durable: U64 | None = None
    """of which fsynced here"""
    replication_mark: U64 | None = None
    """the quorum mark this replica knows (it only grows)"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "generation",
                "tail",
                "committed",
                "accepted_generation",
                "replication_tail",
                "replication_durable",
                "replication_mark",
            ),
            (),
        )


class SubscriptionFilter(msgspec.Struct, omit_defaults=True, kw_only=True):
    """SubscriptionFilter"""

    tenant_id: str | None = None
    namespace: str | None = None
    stream: str | None = None
    shard: U32 | None = None
    principal: str | None = None
    """matches the token sub"""
    dropping: bool = False


class SubscriptionCursor(msgspec.Struct, omit_defaults=True, kw_only=True):
    """SubscriptionCursor"""

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    subscriber_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("subscriber_id",), ())


class InspectedSubscription(msgspec.Struct, omit_defaults=True, kw_only=True):
    """InspectedSubscription"""

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    subscriber_id: U64
    """shard-local, never reused"""
    subscription_id: U64 | None = None
    """the id on event_stream_hello"""
    connection: U64 | None = None
    peer: str | None = None
    """ip:port"""
    principal: str | None = None
    policy: str
    """block | drop_new | drop_old"""
    depth: U64
    capacity: U64
    dropped: U64
    position: U64 | None = None
    tail: U64
    age_ms: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "subscriber_id",
                "subscription_id",
                "connection",
                "depth",
                "capacity",
                "dropped",
                "position",
                "tail",
                "age_ms",
            ),
            (),
        )


StartPosition = Literal["latest", "earliest"] | StartOffset
"""subscribe.start and group_seek.start"""
CacheCondition = Literal["absent"] | VersionCondition
"""CacheCondition"""
PublishRefusalReason = (
    Literal["unknown_producer", "sequence_expired", "sequence_reused"] | PublishRefusal
)
"""PublishRefusalReason (sequence_reused only to clients that offered FEATURE_SEQUENCE_REUSED)"""
StateChange = StateChangePut | StateChangeDelete
"""StateChange"""


class Auth(msgspec.Struct, tag_field="type", tag="auth", omit_defaults=True, kw_only=True):
    """First frame on every client stream: names the tenant, presents the token, offers frame flags and features.

    Direction: client_to_broker; streams: control, publish_uni.
    Answered by: auth_ok, ok, error.
    """

    tenant_id: str
    token: str
    client_flags: U16 | None = None
    """presence ⇒ broker answers auth_ok"""
    client_features: U32 | None = None
    client_features_hi: U32 | None = None
    """only with FEATURE_EXTENDED in client_features, only if ≠0"""


class AuthOk(msgspec.Struct, tag_field="type", tag="auth_ok", omit_defaults=True, kw_only=True):
    """Successful answer to an auth that carried client_flags: the broker's own flag set and features.

    Direction: broker_to_client; streams: control.
    """

    server_flags: U16
    server_features: U32 | None = None
    server_features_hi: U32 | None = None
    """[gate: FEATURE_EXTENDED]"""
    listener_ports: list[U16] | None = None
    """only if >1 listener port"""
    publish_window: U32 | None = None
    """only when granted [gate: FEATURE_PUBLISH_PIPELINE]"""


class Ok(msgspec.Struct, tag_field="type", tag="ok", omit_defaults=True, kw_only=True):
    """Generic success without fields: the answer to an auth without client_flags (legacy flows only).

    Direction: broker_to_client; streams: control.
    """

    pass


class Error(msgspec.Struct, tag_field="type", tag="error", omit_defaults=True, kw_only=True):
    """A refused request; code, retry and detail only to clients that offered FEATURE_ERROR_CODES.

    Direction: broker_to_client; streams: control.
    """

    message: str
    code: str | None = None
    """[gate: FEATURE_ERROR_CODES]"""
    retry: str | None = None
    """[gate: FEATURE_ERROR_CODES]"""
    detail: ErrorDetail | None = None
    """{reason?, retry_after_ms?} [gate: FEATURE_ERROR_CODES] (decision publish-error-detail-null)"""


class Unsupported(
    msgspec.Struct, tag_field="type", tag="unsupported", omit_defaults=True, kw_only=True
):
    """Answer to a request type the broker does not know, or to any extension, when both sides negotiated FEATURE_UNSUPPORTED.

    Direction: broker_to_client; streams: control.
    Gate: FEATURE_UNSUPPORTED (offered by the client).
    """

    request_type: str
    extension: str | None = None
    """extension name"""
    request_id: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class Extension(
    msgspec.Struct, tag_field="type", tag="extension", omit_defaults=True, kw_only=True
):
    """A request area named by string; current brokers answer every one with unsupported.

    Direction: client_to_broker; streams: control.
    Answered by: unsupported.
    Gate: FEATURE_UNSUPPORTED (advertised by the broker).
    """

    name: str
    request_id: U64 | None = None
    body: Any | None = None
    """omitted when null"""

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class Publish(msgspec.Struct, tag_field="type", tag="publish", omit_defaults=True, kw_only=True):
    """JSON single-message publish (compatibility path; current clients publish binary frames).

    Direction: client_to_broker; streams: control, publish_uni.
    Answered by: publish_ok, publish_error.
    """

    tenant_id: str
    namespace: str
    stream: str
    payload: bytes
    key: bytes | None = None
    """routing key"""
    request_id: U64 | None = None
    """needed when acked"""
    ack: AckMode | None = None
    """absent = none (decision ack-default)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class PublishBatch(
    msgspec.Struct, tag_field="type", tag="publish_batch", omit_defaults=True, kw_only=True
):
    """JSON batch publish (compatibility path); one key and one answer for the whole batch.

    Direction: client_to_broker; streams: control, publish_uni.
    Answered by: publish_ok, publish_error.
    """

    tenant_id: str
    namespace: str
    stream: str
    payloads: list[bytes]
    key: bytes | None = None
    request_id: U64 | None = None
    ack: AckMode | None = None
    """absent = none (decision ack-default)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class PublishOk(
    msgspec.Struct, tag_field="type", tag="publish_ok", omit_defaults=True, kw_only=True
):
    """Acknowledges an acked publish; offset of the first record when answered after the write.

    Direction: broker_to_client; streams: control.
    """

    request_id: U64
    offset: U64 | None = None
    """first record offset [gate: BINARY_PUBLISH_ACK_OFFSET]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "offset",
            ),
            (),
        )


class PublishError(
    msgspec.Struct, tag_field="type", tag="publish_error", omit_defaults=True, kw_only=True
):
    """Refuses an acked publish, correlated by request_id.

    Direction: broker_to_client; streams: control.
    """

    request_id: U64
    message: str
    code: str | None = None
    """[gate: FEATURE_ERROR_CODES]"""
    retry: str | None = None
    """[gate: FEATURE_ERROR_CODES]"""
    detail: ErrorDetail | None = None
    """{reason?, retry_after_ms?} [gate: FEATURE_ERROR_CODES] (decision publish-error-detail-null)"""

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ProducerInit(
    msgspec.Struct, tag_field="type", tag="producer_init", omit_defaults=True, kw_only=True
):
    """Asks for an idempotent producer id.

    Direction: client_to_broker; streams: control.
    Answered by: producer_init_ok.
    Gate: FEATURE_IDEMPOTENT_PRODUCER (advertised by the broker).
    """

    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ProducerInitOk(
    msgspec.Struct, tag_field="type", tag="producer_init_ok", omit_defaults=True, kw_only=True
):
    """Grants an idempotent producer id (64 random bits).

    Direction: broker_to_client; streams: control.
    """

    request_id: U64
    producer_id: U64
    """64 random bits"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "producer_id",
            ),
            (),
        )


class PublishIdempotent(
    msgspec.Struct, tag_field="type", tag="publish_idempotent", omit_defaults=True, kw_only=True
):
    """Publishes a numbered batch that lands once when re-sent.

    Direction: client_to_broker; streams: control.
    Answered by: publish_ok, publish_error, publish_refused.
    Gate: FEATURE_IDEMPOTENT_PRODUCER (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    payloads: list[bytes]
    key: bytes | None = None
    request_id: U64
    producer_id: U64
    sequence: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "producer_id",
                "sequence",
            ),
            (),
        )


class PublishIf(
    msgspec.Struct, tag_field="type", tag="publish_if", omit_defaults=True, kw_only=True
):
    """Appends a batch only if it would start exactly at expected_offset; sent on its own stream.

    Direction: client_to_broker; streams: control.
    Answered by: publish_ok, publish_refused, error, not_leader.
    Gate: FEATURE_PUBLISH_CONDITIONAL (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    payloads: list[bytes]
    """non-empty"""
    key: bytes | None = None
    expected_offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "expected_offset",
                "request_id",
            ),
            (),
        )


class PublishRefused(
    msgspec.Struct, tag_field="type", tag="publish_refused", omit_defaults=True, kw_only=True
):
    """Typed refusal of an idempotent or conditional write; nothing was written.

    Direction: broker_to_client; streams: control.
    """

    request_id: U64
    reason: PublishRefusalReason
    """sequence_reused needs client FEATURE_SEQUENCE_REUSED"""
    message: str

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class PublishWidth(
    msgspec.Struct, tag_field="type", tag="publish_width", omit_defaults=True, kw_only=True
):
    """Tells the broker the shard width the keyed batches that follow were routed by; expects no answer.

    Direction: client_to_broker; streams: control.
    Gate: FEATURE_PUBLISH_WIDTH (advertised by the broker).
    Note: decision publish-width: fields observed from the official client 0.6.2; the seed gives none.
    """

    tenant_id: str
    namespace: str
    stream: str
    shards: U32
    """the width the client routed by"""


class Subscribe(
    msgspec.Struct, tag_field="type", tag="subscribe", omit_defaults=True, kw_only=True
):
    """Opens a subscription to one shard of a stream.

    Direction: client_to_broker; streams: control.
    Answered by: subscribed, subscribe_cursor_error, not_leader, error.
    """

    tenant_id: str
    namespace: str
    stream: str
    subscription_id: U64 | None = None
    """meaning unspecified (decision subscription-id-on-requests)"""
    start: StartPosition | None = None
    """absent = latest"""
    shard: U32 | None = None
    """absent = 0"""
    queue_capacity: U32 | None = None
    """[gate: FEATURE_SUBSCRIBE_QUEUE]"""

    def __post_init__(self) -> None:
        _check_u64(self, ("subscription_id",), ())


class Subscribed(
    msgspec.Struct, tag_field="type", tag="subscribed", omit_defaults=True, kw_only=True
):
    """Confirms a subscription on the control stream; its id opens the event stream.

    Direction: broker_to_client; streams: control.
    """

    subscription_id: U64
    start_offset: U64 | None = None
    """first offset delivered; durable streams only [gate: EVENT_BATCH_OFFSETS] (decision subscribed-offsets)"""
    live_offset: U64 | None = None
    """tail at registration; durable streams only [gate: EVENT_BATCH_OFFSETS] (decision subscribed-offsets)"""
    queue_capacity: U32 | None = None
    """only if requested"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "subscription_id",
                "start_offset",
                "live_offset",
            ),
            (),
        )


class SubscribeCursorError(
    msgspec.Struct, tag_field="type", tag="subscribe_cursor_error", omit_defaults=True, kw_only=True
):
    """Refuses a start offset the broker cannot serve (also for stream_read and cache_watch).

    Direction: broker_to_client; streams: control.
    """

    reason: CursorErrorReason
    requested: U64
    available: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "requested",
                "available",
            ),
            (),
        )


class EventStreamHello(
    msgspec.Struct, tag_field="type", tag="event_stream_hello", omit_defaults=True, kw_only=True
):
    """First frame of every broker-opened unidirectional stream; binds it to a subscription or watch.

    Direction: broker_to_client; streams: event.
    """

    subscription_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("subscription_id",), ())


class Event(msgspec.Struct, tag_field="type", tag="event", omit_defaults=True, kw_only=True):
    """One event as JSON (compatibility encoding).

    Direction: broker_to_client; streams: event.
    """

    tenant_id: str
    namespace: str
    stream: str
    payload: bytes
    offset: U64 | None = None
    """durable streams only"""

    def __post_init__(self) -> None:
        _check_u64(self, ("offset",), ())


class EventBatch(
    msgspec.Struct, tag_field="type", tag="event_batch", omit_defaults=True, kw_only=True
):
    """A batch of events as JSON (compatibility encoding).

    Direction: broker_to_client; streams: event.
    """

    tenant_id: str
    namespace: str
    stream: str
    payloads: list[bytes]
    base_offset: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("base_offset",), ())


class ShardMoved(
    msgspec.Struct, tag_field="type", tag="shard_moved", omit_defaults=True, kw_only=True
):
    """Last frame of an event stream whose shard moved, with where to resume.

    Direction: broker_to_client; streams: event.
    Gate: FEATURE_SHARD_MOVED (offered by the client).
    """

    subscription_id: U64
    resume_from: U64 | None = None
    node_id: str | None = None
    addr: str | None = None
    generation: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "subscription_id",
                "resume_from",
                "generation",
            ),
            (),
        )


class SubscriptionLagged(
    msgspec.Struct, tag_field="type", tag="subscription_lagged", omit_defaults=True, kw_only=True
):
    """Last frame of a durable subscription whose broker queue dropped records.

    Direction: broker_to_client; streams: event.
    Gate: FEATURE_SUBSCRIPTION_LAGGED, EVENT_BATCH_OFFSETS (offered by the client).
    """

    subscription_id: U64
    resume_from: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "subscription_id",
                "resume_from",
            ),
            (),
        )


class StreamDeleted(
    msgspec.Struct, tag_field="type", tag="stream_deleted", omit_defaults=True, kw_only=True
):
    """Last frame of a subscription's event stream when its stream was deleted.

    Direction: broker_to_client; streams: event.
    Gate: FEATURE_STREAM_DELETED (offered by the client).
    Note: decision stream-deleted: fields inferred by analogy with shard_moved and subscription_lagged.
    """

    subscription_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("subscription_id",), ())


class CachePut(msgspec.Struct, tag_field="type", tag="cache_put", omit_defaults=True, kw_only=True):
    """Stores a value under a key, with an optional TTL.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Note: decision cache-put-answer.
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    value: bytes
    request_id: U64 | None = None
    ttl_ms: U64 | None = msgspec.field(default_factory=_none)
    """null = no expiry"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "ttl_ms",
            ),
            (),
        )


class CacheGet(msgspec.Struct, tag_field="type", tag="cache_get", omit_defaults=True, kw_only=True):
    """Reads a key.

    Direction: client_to_broker; streams: control.
    Answered by: cache_value.
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    request_id: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CacheDelete(
    msgspec.Struct, tag_field="type", tag="cache_delete", omit_defaults=True, kw_only=True
):
    """Removes a key; answered with the removed value or null.

    Direction: client_to_broker; streams: control.
    Answered by: cache_value.
    Gate: FEATURE_CACHE_DELETE (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    request_id: U64 | None = None

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CacheValue(
    msgspec.Struct, tag_field="type", tag="cache_value", omit_defaults=True, kw_only=True
):
    """Answer to cache_get and cache_delete; value null on a miss.

    Direction: broker_to_client; streams: control.
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    value: bytes | None = msgspec.field(default_factory=_none)
    """null = miss / nothing removed"""
    request_id: U64 | None = None
    version: U64 | None = None
    """get hit only [gate: FEATURE_CACHE_CONDITIONAL]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "version",
            ),
            (),
        )


class CacheOk(msgspec.Struct, tag_field="type", tag="cache_ok", omit_defaults=True, kw_only=True):
    """Success answer carrying request_id: cache_put and group settles.

    Direction: broker_to_client; streams: control.
    """

    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CachePutIf(
    msgspec.Struct, tag_field="type", tag="cache_put_if", omit_defaults=True, kw_only=True
):
    """Conditional put: only if the key is absent or at a version.

    Direction: client_to_broker; streams: control.
    Answered by: cache_condition_result.
    Gate: FEATURE_CACHE_CONDITIONAL (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    value: bytes
    ttl_ms: U64 | None = None
    """absent = no expiry (decision cache-put-if-ttl)"""
    condition: CacheCondition
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "ttl_ms",
                "request_id",
            ),
            (),
        )


class CacheDeleteIf(
    msgspec.Struct, tag_field="type", tag="cache_delete_if", omit_defaults=True, kw_only=True
):
    """Conditional delete: only if the key is at a version.

    Direction: client_to_broker; streams: control.
    Answered by: cache_condition_result.
    Gate: FEATURE_CACHE_CONDITIONAL (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    version: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "version",
                "request_id",
            ),
            (),
        )


class CacheConditionResult(
    msgspec.Struct, tag_field="type", tag="cache_condition_result", omit_defaults=True, kw_only=True
):
    """Answer to a conditional cache write.

    Direction: broker_to_client; streams: control.
    """

    applied: bool
    version: U64 | None = None
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "version",
                "request_id",
            ),
            (),
        )


class CacheWatch(
    msgspec.Struct, tag_field="type", tag="cache_watch", omit_defaults=True, kw_only=True
):
    """Watches a key or a prefix of one shard: optional replay or retained values, then every change.

    Direction: client_to_broker; streams: control.
    Answered by: cache_watch_started, subscribe_cursor_error, not_leader, error.
    Gate: FEATURE_CACHE_WATCH (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str | None = None
    """exactly one of key/prefix"""
    prefix: str | None = None
    shard: U32 | None = None
    """prefix watches"""
    from_offset: U64 | None = None
    retained: bool = False
    """[gate: FEATURE_CACHE_WATCH_RETAINED]"""
    subscription_id: U64 | None = None
    """meaning unspecified (decision subscription-id-on-requests)"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "from_offset",
                "subscription_id",
            ),
            (),
        )


class CacheWatchStarted(
    msgspec.Struct, tag_field="type", tag="cache_watch_started", omit_defaults=True, kw_only=True
):
    """Confirms a watch; its id opens the event stream.

    Direction: broker_to_client; streams: control.
    """

    subscription_id: U64
    resume_offset: U64
    resnapshot: bool = msgspec.field(default_factory=_false)
    retained_count: U64 | None = None
    """present iff retained asked"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "subscription_id",
                "resume_offset",
                "retained_count",
            ),
            (),
        )


class CacheEvent(
    msgspec.Struct, tag_field="type", tag="cache_event", omit_defaults=True, kw_only=True
):
    """One change on a watch's event stream; no value means deleted.

    Direction: broker_to_client; streams: event.
    """

    key: str
    value: bytes | None = None
    """absent = deleted"""
    offset: U64
    expires_at_millis: U64 = msgspec.field(default_factory=_zero)
    """0 = never"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "expires_at_millis",
            ),
            (),
        )


class CacheWatchLagged(
    msgspec.Struct, tag_field="type", tag="cache_watch_lagged", omit_defaults=True, kw_only=True
):
    """Last frame of a watch whose queue overflowed.

    Direction: broker_to_client; streams: event.
    """

    resume_from: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("resume_from",), ())


class CounterAdd(
    msgspec.Struct, tag_field="type", tag="counter_add", omit_defaults=True, kw_only=True
):
    """Adds a signed delta to a counter.

    Direction: client_to_broker; streams: control.
    Answered by: counter_value.
    Gate: FEATURE_COUNTERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    delta: I64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CounterGet(
    msgspec.Struct, tag_field="type", tag="counter_get", omit_defaults=True, kw_only=True
):
    """Reads a counter.

    Direction: client_to_broker; streams: control.
    Answered by: counter_value.
    Gate: FEATURE_COUNTERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    key: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CounterValue(
    msgspec.Struct, tag_field="type", tag="counter_value", omit_defaults=True, kw_only=True
):
    """A counter's sum; absent when never written.

    Direction: broker_to_client; streams: control.
    """

    value: I64 | None = None
    """absent = never written"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class Commit(msgspec.Struct, tag_field="type", tag="commit", omit_defaults=True, kw_only=True):
    """Appends an event and applies state changes atomically on one shard.

    Direction: client_to_broker; streams: control.
    Answered by: commit_ok, error, not_leader, publish_refused.
    Gate: FEATURE_ATOMIC_COMMIT (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    entity_key: bytes
    event: bytes
    changes: list[StateChange] = msgspec.field(default_factory=_empty_list)
    request_id: U64
    expected_offset: U64 | None = None
    """[gate: FEATURE_PUBLISH_CONDITIONAL]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "expected_offset",
            ),
            (),
        )


class CommitOk(msgspec.Struct, tag_field="type", tag="commit_ok", omit_defaults=True, kw_only=True):
    """A commit is durable at this offset.

    Direction: broker_to_client; streams: control.
    """

    request_id: U64
    offset: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "request_id",
                "offset",
            ),
            (),
        )


class StateGet(msgspec.Struct, tag_field="type", tag="state_get", omit_defaults=True, kw_only=True):
    """Reads a key of an entity's committed state.

    Direction: client_to_broker; streams: control.
    Answered by: state_value.
    Gate: FEATURE_ATOMIC_COMMIT (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    entity_key: bytes
    key: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class StateValue(
    msgspec.Struct, tag_field="type", tag="state_value", omit_defaults=True, kw_only=True
):
    """Answer to state_get.

    Direction: broker_to_client; streams: control.
    """

    value: bytes | None = msgspec.field(default_factory=_none)
    """null = never written/deleted"""
    version: U64 | None = None
    as_of: U64 | None = None
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "version",
                "as_of",
                "request_id",
            ),
            (),
        )


class OffsetForTime(
    msgspec.Struct, tag_field="type", tag="offset_for_time", omit_defaults=True, kw_only=True
):
    """Finds the first offset appended at or after a time.

    Direction: client_to_broker; streams: control.
    Answered by: offset_value, not_leader, error.
    Gate: FEATURE_RECORD_TIMESTAMPS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    at_micros: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "at_micros",
                "request_id",
            ),
            (),
        )


class OffsetValue(
    msgspec.Struct, tag_field="type", tag="offset_value", omit_defaults=True, kw_only=True
):
    """Answer to offset_for_time; absent offset means nothing that recent.

    Direction: broker_to_client; streams: control.
    """

    offset: U64 | None = None
    """absent = nothing that recent"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class StreamRead(
    msgspec.Struct, tag_field="type", tag="stream_read", omit_defaults=True, kw_only=True
):
    """Reads a bounded page of a durable stream without subscribing.

    Direction: client_to_broker; streams: control.
    Answered by: stream_records, subscribe_cursor_error, not_leader, error.
    Gate: FEATURE_STREAM_READ (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    from_: U64 = msgspec.field(name="from")
    end: U64 | None = None
    """exclusive"""
    max_records: U32 | None = None
    """0/absent = cap"""
    max_bytes: U64 | None = None
    """0/absent = cap"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "from_",
                "end",
                "max_bytes",
                "request_id",
            ),
            (),
        )


class StreamRecords(
    msgspec.Struct, tag_field="type", tag="stream_records", omit_defaults=True, kw_only=True
):
    """A page of records; read the next page from next_offset.

    Direction: broker_to_client; streams: control.
    """

    records: list[StreamRecord]
    next_offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "next_offset",
                "request_id",
            ),
            (),
        )


class GroupPoll(
    msgspec.Struct, tag_field="type", tag="group_poll", omit_defaults=True, kw_only=True
):
    """Claims up to max_records records for a consumer group, long-polling up to wait_ms.

    Direction: client_to_broker; streams: control.
    Answered by: group_records.
    Gate: FEATURE_CONSUMER_GROUP (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    max_records: U32
    wait_ms: U64 = msgspec.field(default_factory=_zero)
    """(decision group-poll-wait-ms)"""
    request_id: U64
    consumer: str | None = None
    """1–128 bytes [gate: FEATURE_GROUP_CONSUMER]"""
    reclaim: bool = False
    """[gate: FEATURE_GROUP_CONSUMER]"""
    visibility_ms: U64 = 0
    """[gate: FEATURE_GROUP_CLAIM_CONTROL]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "wait_ms",
                "request_id",
                "visibility_ms",
            ),
            (),
        )


class GroupRecords(
    msgspec.Struct, tag_field="type", tag="group_records", omit_defaults=True, kw_only=True
):
    """Records claimed by a poll; may be empty.

    Direction: broker_to_client; streams: control.
    """

    records: list[GroupRecord]
    """may be empty"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class GroupAck(msgspec.Struct, tag_field="type", tag="group_ack", omit_defaults=True, kw_only=True):
    """Finishes a claimed record.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Gate: FEATURE_CONSUMER_GROUP (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class GroupNack(
    msgspec.Struct, tag_field="type", tag="group_nack", omit_defaults=True, kw_only=True
):
    """Hands a claimed record back, now or after delay_ms.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Gate: FEATURE_CONSUMER_GROUP (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    request_id: U64
    delay_ms: U64 = 0
    """[gate: FEATURE_GROUP_CLAIM_CONTROL]"""
    attempts: U32 = 0
    """[gate: FEATURE_GROUP_CLAIM_CONTROL]"""

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
                "delay_ms",
            ),
            (),
        )


class GroupExtend(
    msgspec.Struct, tag_field="type", tag="group_extend", omit_defaults=True, kw_only=True
):
    """Keeps a standing claim alive.

    Direction: client_to_broker; streams: control.
    Answered by: group_extended.
    Gate: FEATURE_GROUP_CLAIM_CONTROL (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    attempts: U32
    extend_ms: U64
    """>0"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "extend_ms",
                "request_id",
            ),
            (),
        )


class GroupExtended(
    msgspec.Struct, tag_field="type", tag="group_extended", omit_defaults=True, kw_only=True
):
    """How long the extended claim now stands.

    Direction: broker_to_client; streams: control.
    """

    visible_ms: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "visible_ms",
                "request_id",
            ),
            (),
        )


class GroupDeadLetter(
    msgspec.Struct, tag_field="type", tag="group_dead_letter", omit_defaults=True, kw_only=True
):
    """Dead-letters a record by hand.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Gate: FEATURE_GROUP_CLAIM_CONTROL (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class GroupDeadLetters(
    msgspec.Struct, tag_field="type", tag="group_dead_letters", omit_defaults=True, kw_only=True
):
    """Lists a group's dead letters.

    Direction: client_to_broker; streams: control.
    Answered by: group_dead_letter_list.
    Gate: FEATURE_GROUP_DEAD_LETTERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class GroupDeadLetterList(
    msgspec.Struct, tag_field="type", tag="group_dead_letter_list", omit_defaults=True, kw_only=True
):
    """A group's dead-lettered offsets, ascending.

    Direction: broker_to_client; streams: control.
    """

    offsets: list[U64]
    """ascending"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ("offsets",))


class GroupDiscard(
    msgspec.Struct, tag_field="type", tag="group_discard", omit_defaults=True, kw_only=True
):
    """Drops a dead letter from the list.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Gate: FEATURE_GROUP_DEAD_LETTERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class GroupRedrive(
    msgspec.Struct, tag_field="type", tag="group_redrive", omit_defaults=True, kw_only=True
):
    """Puts a dead letter back in play.

    Direction: client_to_broker; streams: control.
    Answered by: cache_ok.
    Gate: FEATURE_GROUP_DEAD_LETTERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    offset: U64
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class GroupSeek(
    msgspec.Struct, tag_field="type", tag="group_seek", omit_defaults=True, kw_only=True
):
    """Moves a group's cursor on one shard.

    Direction: client_to_broker; streams: control.
    Answered by: group_position.
    Gate: FEATURE_GROUP_ADMIN (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    start: StartPosition
    if_new: bool = False
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class GroupPosition(
    msgspec.Struct, tag_field="type", tag="group_position", omit_defaults=True, kw_only=True
):
    """Where a seek left the group's cursor.

    Direction: broker_to_client; streams: control.
    """

    offset: U64
    moved: bool
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "offset",
                "request_id",
            ),
            (),
        )


class GroupDescribe(
    msgspec.Struct, tag_field="type", tag="group_describe", omit_defaults=True, kw_only=True
):
    """Asks for a group's state on one shard.

    Direction: client_to_broker; streams: control.
    Answered by: group_info.
    Gate: FEATURE_GROUP_ADMIN (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class GroupInfo(
    msgspec.Struct, tag_field="type", tag="group_info", omit_defaults=True, kw_only=True
):
    """A group's cursor, tail and counts.

    Direction: broker_to_client; streams: control.
    """

    committed: U64 | None = None
    """absent = no cursor"""
    tail: U64
    in_flight: U64
    """(decision group-info-widths)"""
    owed: U64
    """(decision group-info-widths)"""
    dead_letters: U64
    """(decision group-info-widths)"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(
            self,
            (
                "committed",
                "tail",
                "in_flight",
                "owed",
                "dead_letters",
                "request_id",
            ),
            (),
        )


class GroupDelete(
    msgspec.Struct, tag_field="type", tag="group_delete", omit_defaults=True, kw_only=True
):
    """Removes a group's cursor, dead letters and in-flight state.

    Direction: client_to_broker; streams: control.
    Answered by: group_deleted.
    Gate: FEATURE_GROUP_ADMIN (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    shard: U32
    group: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class GroupDeleted(
    msgspec.Struct, tag_field="type", tag="group_deleted", omit_defaults=True, kw_only=True
):
    """Whether the deleted group existed.

    Direction: broker_to_client; streams: control.
    """

    existed: bool
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class Topology(msgspec.Struct, tag_field="type", tag="topology", omit_defaults=True, kw_only=True):
    """Asks which brokers a client may connect to.

    Direction: client_to_broker; streams: control.
    Answered by: topology_view.
    Gate: FEATURE_TOPOLOGY (advertised by the broker).
    """

    pass


class TopologyView(
    msgspec.Struct, tag_field="type", tag="topology_view", omit_defaults=True, kw_only=True
):
    """Client-reachable brokers; empty is valid.

    Direction: broker_to_client; streams: control.
    """

    brokers: list[BrokerEndpoint]
    """may be empty"""


class StreamShards(
    msgspec.Struct, tag_field="type", tag="stream_shards", omit_defaults=True, kw_only=True
):
    """Asks how many shards a stream has and how keys map onto them.

    Direction: client_to_broker; streams: control.
    Answered by: stream_shards_view.
    Gate: FEATURE_STREAM_SHARDS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    stream: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class StreamShardsView(
    msgspec.Struct, tag_field="type", tag="stream_shards_view", omit_defaults=True, kw_only=True
):
    """A stream's shard count (0 = unknown) and routing.

    Direction: broker_to_client; streams: control.
    """

    shards: U32
    """0 = unknown"""
    request_id: U64
    routing: ShardRouting | None = None
    """only jump_hash sent"""

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CacheShards(
    msgspec.Struct, tag_field="type", tag="cache_shards", omit_defaults=True, kw_only=True
):
    """Asks how many shards a cache has.

    Direction: client_to_broker; streams: control.
    Answered by: cache_shards_view.
    Gate: FEATURE_CACHE_SHARDS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    cache: str
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class CacheShardsView(
    msgspec.Struct, tag_field="type", tag="cache_shards_view", omit_defaults=True, kw_only=True
):
    """A cache's shard count (0 = unknown).

    Direction: broker_to_client; streams: control.
    """

    shards: U32
    """0 = unknown"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ShardOwners(
    msgspec.Struct, tag_field="type", tag="shard_owners", omit_defaults=True, kw_only=True
):
    """Asks which broker owns each shard of a stream or cache.

    Direction: client_to_broker; streams: control.
    Answered by: shard_owners_view.
    Gate: FEATURE_SHARD_OWNERS (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    name: str
    kind: ShardKind
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ShardOwnersView(
    msgspec.Struct, tag_field="type", tag="shard_owners_view", omit_defaults=True, kw_only=True
):
    """One owner entry per shard.

    Direction: broker_to_client; streams: control.
    """

    owners: list[ShardOwner]
    """shard order"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ShardInspect(
    msgspec.Struct, tag_field="type", tag="shard_inspect", omit_defaults=True, kw_only=True
):
    """Operator inspection of one shard (needs node.view:cluster:*).

    Direction: client_to_broker; streams: control.
    Answered by: shard_inspect_info, error.
    Gate: FEATURE_INSPECT (advertised by the broker).
    """

    tenant_id: str
    namespace: str
    name: str
    kind: ShardKind
    shard: U32
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class ShardInspectInfo(
    msgspec.Struct, tag_field="type", tag="shard_inspect_info", omit_defaults=True, kw_only=True
):
    """What the answering broker knows of the shard.

    Direction: broker_to_client; streams: control.
    """

    view: ShardInspection
    """see §5.10"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class SubscriptionsList(
    msgspec.Struct, tag_field="type", tag="subscriptions_list", omit_defaults=True, kw_only=True
):
    """Operator listing of subscriptions, paged.

    Direction: client_to_broker; streams: control.
    Answered by: subscriptions_list_info, error.
    Gate: FEATURE_INSPECT (advertised by the broker).
    """

    filter: SubscriptionFilter = msgspec.field(default_factory=SubscriptionFilter)
    limit: U32 | None = None
    """default 100, cap 1000"""
    cursor: SubscriptionCursor | None = None
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class SubscriptionsListInfo(
    msgspec.Struct,
    tag_field="type",
    tag="subscriptions_list_info",
    omit_defaults=True,
    kw_only=True,
):
    """One page of subscriptions.

    Direction: broker_to_client; streams: control.
    """

    node_id: str
    subscriptions: list[InspectedSubscription]
    next_cursor: SubscriptionCursor | None = None
    """omitted on last page"""
    request_id: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("request_id",), ())


class NotLeader(
    msgspec.Struct, tag_field="type", tag="not_leader", omit_defaults=True, kw_only=True
):
    """Redirect: another broker owns the shard.

    Direction: broker_to_client; streams: control.
    Gate: FEATURE_REDIRECT (offered by the client).
    """

    node_id: str
    addr: str | None = None
    generation: U64

    def __post_init__(self) -> None:
        _check_u64(self, ("generation",), ())


Message = Union[
    Auth,
    AuthOk,
    Ok,
    Error,
    Unsupported,
    Extension,
    Publish,
    PublishBatch,
    PublishOk,
    PublishError,
    ProducerInit,
    ProducerInitOk,
    PublishIdempotent,
    PublishIf,
    PublishRefused,
    PublishWidth,
    Subscribe,
    Subscribed,
    SubscribeCursorError,
    EventStreamHello,
    Event,
    EventBatch,
    ShardMoved,
    SubscriptionLagged,
    StreamDeleted,
    CachePut,
    CacheGet,
    CacheDelete,
    CacheValue,
    CacheOk,
    CachePutIf,
    CacheDeleteIf,
    CacheConditionResult,
    CacheWatch,
    CacheWatchStarted,
    CacheEvent,
    CacheWatchLagged,
    CounterAdd,
    CounterGet,
    CounterValue,
    Commit,
    CommitOk,
    StateGet,
    StateValue,
    OffsetForTime,
    OffsetValue,
    StreamRead,
    StreamRecords,
    GroupPoll,
    GroupRecords,
    GroupAck,
    GroupNack,
    GroupExtend,
    GroupExtended,
    GroupDeadLetter,
    GroupDeadLetters,
    GroupDeadLetterList,
    GroupDiscard,
    GroupRedrive,
    GroupSeek,
    GroupPosition,
    GroupDescribe,
    GroupInfo,
    GroupDelete,
    GroupDeleted,
    Topology,
    TopologyView,
    StreamShards,
    StreamShardsView,
    CacheShards,
    CacheShardsView,
    ShardOwners,
    ShardOwnersView,
    ShardInspect,
    ShardInspectInfo,
    SubscriptionsList,
    SubscriptionsListInfo,
    NotLeader,
]
"""Any known message."""

MESSAGE_CLASSES: Mapping[str, type[Message]] = MappingProxyType(
    {
        "auth": Auth,
        "auth_ok": AuthOk,
        "ok": Ok,
        "error": Error,
        "unsupported": Unsupported,
        "extension": Extension,
        "publish": Publish,
        "publish_batch": PublishBatch,
        "publish_ok": PublishOk,
        "publish_error": PublishError,
        "producer_init": ProducerInit,
        "producer_init_ok": ProducerInitOk,
        "publish_idempotent": PublishIdempotent,
        "publish_if": PublishIf,
        "publish_refused": PublishRefused,
        "publish_width": PublishWidth,
        "subscribe": Subscribe,
        "subscribed": Subscribed,
        "subscribe_cursor_error": SubscribeCursorError,
        "event_stream_hello": EventStreamHello,
        "event": Event,
        "event_batch": EventBatch,
        "shard_moved": ShardMoved,
        "subscription_lagged": SubscriptionLagged,
        "stream_deleted": StreamDeleted,
        "cache_put": CachePut,
        "cache_get": CacheGet,
        "cache_delete": CacheDelete,
        "cache_value": CacheValue,
        "cache_ok": CacheOk,
        "cache_put_if": CachePutIf,
        "cache_delete_if": CacheDeleteIf,
        "cache_condition_result": CacheConditionResult,
        "cache_watch": CacheWatch,
        "cache_watch_started": CacheWatchStarted,
        "cache_event": CacheEvent,
        "cache_watch_lagged": CacheWatchLagged,
        "counter_add": CounterAdd,
        "counter_get": CounterGet,
        "counter_value": CounterValue,
        "commit": Commit,
        "commit_ok": CommitOk,
        "state_get": StateGet,
        "state_value": StateValue,
        "offset_for_time": OffsetForTime,
        "offset_value": OffsetValue,
        "stream_read": StreamRead,
        "stream_records": StreamRecords,
        "group_poll": GroupPoll,
        "group_records": GroupRecords,
        "group_ack": GroupAck,
        "group_nack": GroupNack,
        "group_extend": GroupExtend,
        "group_extended": GroupExtended,
        "group_dead_letter": GroupDeadLetter,
        "group_dead_letters": GroupDeadLetters,
        "group_dead_letter_list": GroupDeadLetterList,
        "group_discard": GroupDiscard,
        "group_redrive": GroupRedrive,
        "group_seek": GroupSeek,
        "group_position": GroupPosition,
        "group_describe": GroupDescribe,
        "group_info": GroupInfo,
        "group_delete": GroupDelete,
        "group_deleted": GroupDeleted,
        "topology": Topology,
        "topology_view": TopologyView,
        "stream_shards": StreamShards,
        "stream_shards_view": StreamShardsView,
        "cache_shards": CacheShards,
        "cache_shards_view": CacheShardsView,
        "shard_owners": ShardOwners,
        "shard_owners_view": ShardOwnersView,
        "shard_inspect": ShardInspect,
        "shard_inspect_info": ShardInspectInfo,
        "subscriptions_list": SubscriptionsList,
        "subscriptions_list_info": SubscriptionsListInfo,
        "not_leader": NotLeader,
    }
)
CLIENT_TO_BROKER = frozenset(
    {
        "auth",
        "extension",
        "publish",
        "publish_batch",
        "producer_init",
        "publish_idempotent",
        "publish_if",
        "publish_width",
        "subscribe",
        "cache_put",
        "cache_get",
        "cache_delete",
        "cache_put_if",
        "cache_delete_if",
        "cache_watch",
        "counter_add",
        "counter_get",
        "commit",
        "state_get",
        "offset_for_time",
        "stream_read",
        "group_poll",
        "group_ack",
        "group_nack",
        "group_extend",
        "group_dead_letter",
        "group_dead_letters",
        "group_discard",
        "group_redrive",
        "group_seek",
        "group_describe",
        "group_delete",
        "topology",
        "stream_shards",
        "cache_shards",
        "shard_owners",
        "shard_inspect",
        "subscriptions_list",
    }
)
BROKER_TO_CLIENT = frozenset(
    {
        "auth_ok",
        "ok",
        "error",
        "unsupported",
        "publish_ok",
        "publish_error",
        "producer_init_ok",
        "publish_refused",
        "subscribed",
        "subscribe_cursor_error",
        "event_stream_hello",
        "event",
        "event_batch",
        "shard_moved",
        "subscription_lagged",
        "stream_deleted",
        "cache_value",
        "cache_ok",
        "cache_condition_result",
        "cache_watch_started",
        "cache_event",
        "cache_watch_lagged",
        "counter_value",
        "commit_ok",
        "state_value",
        "offset_value",
        "stream_records",
        "group_records",
        "group_extended",
        "group_dead_letter_list",
        "group_position",
        "group_info",
        "group_deleted",
        "topology_view",
        "stream_shards_view",
        "cache_shards_view",
        "shard_owners_view",
        "shard_inspect_info",
        "subscriptions_list_info",
        "not_leader",
    }
)


class Unknown(msgspec.Struct, frozen=True):
    """A JSON object whose "type" this catalogue does not know: a decode outcome, never sent.

    `request_id` is read leniently (a non-numeric one reads as None) so a broker can
    answer `unsupported`.
    """

    type: str
    raw: dict[str, Any]
    request_id: int | None = None


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Message)
_ANY_DECODER = msgspec.json.Decoder(Any)
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_encode = _ENCODER.encode
_decode = _DECODER.decode


def encode_message(message: Message) -> bytes:
    """The JSON payload of a message: compact, "type" first."""
    return _encode(message)


# JSON string literals (escapes included) and the brackets left once they are gone.
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_too_deep(payload: bytes | bytearray | memoryview, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays and objects in `payload` nest deeper than `limit`.

    Runs before any decoder sees the bytes. A payload with at most `limit` opening
    brackets in all (nearly every message) is answered by two counts; otherwise
    strings are blanked out and the brackets walked. Malformed JSON is left for the
    decoder to refuse.
    """
    data = bytes(payload) if isinstance(payload, memoryview) else payload
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b"", data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif depth:
            depth -= 1
    return False


def decode_message(payload: bytes | bytearray | memoryview) -> Message | Unknown:
    """Decode a flags-0 payload. Raises MalformedJsonError or MessageFieldError.

    Nesting deeper than MAX_JSON_DEPTH is refused before decoding starts.
    """
    if json_too_deep(payload):
        raise MalformedJsonError(
            "json", None, None, f"nested deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    try:
        return _decode(payload)
    except msgspec.ValidationError as exc:
        return _explain(payload, exc)
    except msgspec.DecodeError as exc:
        raise MalformedJsonError("json", None, None, str(exc)) from None
    except RecursionError:
        # Unreachable after the depth check unless the caller is already deep in
        # its own stack; still a refusal, never an escaped exception.
        raise MalformedJsonError("json", None, None, "nested too deep to decode") from None


def _explain(payload: bytes | bytearray | memoryview, exc: msgspec.ValidationError) -> Unknown:
    """Slow path: tell an unknown type (not an error) from a bad known message."""
    try:
        raw = _ANY_DECODER.decode(payload)
    except msgspec.DecodeError as decode_exc:
        # The typed decode may fail on a field before it meets the bad bytes.
        raise MalformedJsonError("json", None, None, str(decode_exc)) from None
    if not isinstance(raw, dict):
        raise MalformedJsonError("json", None, None, "payload is not a JSON object") from None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise MalformedJsonError("json", "type", None, 'missing or non-string "type"') from None
    if kind not in MESSAGE_CLASSES:
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
    problem = _PATH.sub("", text)
    raise MessageFieldError(kind, field or None, None, problem) from None
