# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Hypothesis strategies for every message and every legal binary flag value.

Derived from the catalogue (hypothesis' `from_type` ignores msgspec.Meta bounds),
so generated values respect the wire ranges and the presence rules. Needs the
`hypothesis` package (a test dependency); nothing at run time imports this module.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Callable, Mapping

from hypothesis import strategies as st

from . import binary as _b
from . import messages as _m
from . import names as _names
from .errors import RetryClass

__all__ = [
    "MESSAGE_STRATEGIES",
    "SHAPE_STRATEGIES",
    "BINARY_STRATEGIES",
    "message",
    "binary_frame",
    "valid_names",
    "hostile_names",
]

_U8 = st.integers(0, 255)
_U16 = st.integers(0, 65535)
_U32 = st.integers(0, 4294967295)
_U64 = st.integers(0, 18446744073709551615)
_I64 = st.integers(-9223372036854775808, 9223372036854775807)
_TEXT = st.text(max_size=12)
_BLOB = st.binary(max_size=24)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)

SHAPE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {}
SHAPE_STRATEGIES["StartOffset"] = st.builds(
    _m.StartOffset,
    offset=_U64,
)
SHAPE_STRATEGIES["StartPosition"] = st.sampled_from(("latest", "earliest")) | st.deferred(
    lambda: SHAPE_STRATEGIES["StartOffset"]
)
SHAPE_STRATEGIES["VersionCondition"] = st.builds(
    _m.VersionCondition,
    version=_U64,
)
SHAPE_STRATEGIES["CacheCondition"] = st.sampled_from(("absent",)) | st.deferred(
    lambda: SHAPE_STRATEGIES["VersionCondition"]
)
SHAPE_STRATEGIES["SequenceGap"] = st.builds(
    _m.SequenceGap,
    expected=_U64,
)
SHAPE_STRATEGIES["OffsetMismatch"] = st.builds(
    _m.OffsetMismatch,
    tail=_U64,
)
SHAPE_STRATEGIES["NotLeaderHint"] = st.builds(
    _m.NotLeaderHint,
    node_id=_TEXT,
    addr=(st.none() | _TEXT),
)
SHAPE_STRATEGIES["PublishRefusal"] = st.one_of(
    st.builds(_m.PublishRefusal, sequence_gap=st.deferred(lambda: SHAPE_STRATEGIES["SequenceGap"])),
    st.builds(
        _m.PublishRefusal, offset_mismatch=st.deferred(lambda: SHAPE_STRATEGIES["OffsetMismatch"])
    ),
    st.builds(_m.PublishRefusal, not_leader=st.deferred(lambda: SHAPE_STRATEGIES["NotLeaderHint"])),
)
SHAPE_STRATEGIES["PublishRefusalReason"] = st.sampled_from(
    ("unknown_producer", "sequence_expired", "sequence_reused")
) | st.deferred(lambda: SHAPE_STRATEGIES["PublishRefusal"])
SHAPE_STRATEGIES["StateChangePut"] = st.builds(
    _m.StateChangePut,
    key=_TEXT,
    value=_BLOB,
)
SHAPE_STRATEGIES["StateChangeDelete"] = st.builds(
    _m.StateChangeDelete,
    key=_TEXT,
)
SHAPE_STRATEGIES["StateChange"] = st.one_of(
    st.deferred(lambda: SHAPE_STRATEGIES["StateChangePut"]),
    st.deferred(lambda: SHAPE_STRATEGIES["StateChangeDelete"]),
)
SHAPE_STRATEGIES["ErrorDetail"] = st.builds(
    _m.ErrorDetail,
    reason=(st.none() | _TEXT),
    retry_after_ms=(st.none() | _U64),
)
SHAPE_STRATEGIES["BrokerEndpoint"] = st.builds(
    _m.BrokerEndpoint,
    node_id=_TEXT,
    addr=_TEXT,
)
SHAPE_STRATEGIES["ShardOwner"] = st.builds(
    _m.ShardOwner,
    shard=_U32,
    node_id=(st.none() | _TEXT),
    addr=(st.none() | _TEXT),
    generation=_U64,
    unavailable=(st.none() | _TEXT),
)
SHAPE_STRATEGIES["GroupRecord"] = st.builds(
    _m.GroupRecord,
    offset=_U64,
    payload=_BLOB,
    attempts=_U32,
    skipped_before=_U64,
    publisher=(st.none() | _TEXT),
    timestamp_micros=(st.none() | _U64),
)
SHAPE_STRATEGIES["StreamRecord"] = st.builds(
    _m.StreamRecord,
    offset=_U64,
    payload=_BLOB,
    publisher=(st.none() | _TEXT),
    timestamp_micros=_U64,
)
SHAPE_STRATEGIES["ShardAssignment"] = st.builds(
    _m.ShardAssignment,
    generation=_U64,
    leader=_TEXT,
    replicas=st.lists(_TEXT, max_size=3),
    draining=st.booleans(),
    successor=(st.none() | _TEXT),
)
SHAPE_STRATEGIES["ShardFence"] = st.builds(
    _m.ShardFence,
    took=st.lists(_TEXT, max_size=3),
    pending=st.lists(_TEXT, max_size=3),
    attempts=_U32,
    retry_in_ms=(st.none() | _U64),
)
SHAPE_STRATEGIES["ShardLease"] = st.builds(
    _m.ShardLease,
    held=st.booleans(),
    remaining_ms=_U64,
)
SHAPE_STRATEGIES["ReplicaView"] = st.builds(
    _m.ReplicaView,
    node_id=_TEXT,
    role=_TEXT,
    next_offset=(st.none() | _U64),
    lag=(st.none() | _U64),
    fence=(st.none() | st.booleans()),
    state=_TEXT,
    halted=(st.none() | _TEXT),
    matched=(st.none() | _U64),
    durable=(st.none() | _U64),
)
SHAPE_STRATEGIES["ShardInspection"] = st.builds(
    _m.ShardInspection,
    node_id=_TEXT,
    shards=_U32,
    role=_TEXT,
    phase=_TEXT,
    serving=st.booleans(),
    reason=(st.none() | _TEXT),
    detail=(st.none() | _TEXT),
    generation=(st.none() | _U64),
    assignment=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["ShardAssignment"])),
    fence=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["ShardFence"])),
    lease=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["ShardLease"])),
    tail=(st.none() | _U64),
    committed=(st.none() | _U64),
    accepted_generation=(st.none() | _U64),
    replicas=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["ReplicaView"]), max_size=3),
    replica_state=(st.none() | _TEXT),
    replication_tail=(st.none() | _U64),
    replication_durable=(st.none() | _U64),
    replication_mark=(st.none() | _U64),
)
SHAPE_STRATEGIES["SubscriptionFilter"] = st.builds(
    _m.SubscriptionFilter,
    tenant_id=(st.none() | _TEXT),
    namespace=(st.none() | _TEXT),
    stream=(st.none() | _TEXT),
    shard=(st.none() | _U32),
    principal=(st.none() | _TEXT),
    dropping=st.booleans(),
)
SHAPE_STRATEGIES["SubscriptionCursor"] = st.builds(
    _m.SubscriptionCursor,
    tenant_id=_TEXT,
    namespace=_TEXT,
    stream=_TEXT,
    shard=_U32,
    subscriber_id=_U64,
)
SHAPE_STRATEGIES["InspectedSubscription"] = st.builds(
    _m.InspectedSubscription,
    tenant_id=_TEXT,
    namespace=_TEXT,
    stream=_TEXT,
    shard=_U32,
    subscriber_id=_U64,
    subscription_id=(st.none() | _U64),
    connection=(st.none() | _U64),
    peer=(st.none() | _TEXT),
    principal=(st.none() | _TEXT),
    policy=_TEXT,
    depth=_U64,
    capacity=_U64,
    dropped=_U64,
    position=(st.none() | _U64),
    tail=_U64,
    age_ms=_U64,
)

MESSAGE_STRATEGIES: Mapping[str, st.SearchStrategy[Any]] = MappingProxyType(
    {
        "auth": st.builds(
            _m.Auth,
            tenant_id=_TEXT,
            token=_TEXT,
            client_flags=(st.none() | _U16),
            client_features=(st.none() | _U32),
            client_features_hi=(st.none() | _U32),
        ),
        "auth_ok": st.builds(
            _m.AuthOk,
            server_flags=_U16,
            server_features=(st.none() | _U32),
            server_features_hi=(st.none() | _U32),
            listener_ports=(st.none() | st.lists(_U16, max_size=3)),
            publish_window=(st.none() | _U32),
        ),
        "ok": st.builds(
            _m.Ok,
        ),
        "error": st.builds(
            _m.Error,
            message=_TEXT,
            code=(
                st.none()
                | (
                    st.sampled_from(
                        (
                            "unauthenticated",
                            "forbidden",
                            "not_found",
                            "invalid_request",
                            "shard_unavailable",
                            "not_leader",
                            "quorum_timeout",
                            "leadership_lost",
                            "unacknowledged",
                            "overloaded",
                            "limit_exceeded",
                            "draining",
                            "internal",
                            "storage",
                            "stale_claim",
                            "revoked",
                            "stale_width",
                        )
                    )
                    | _TEXT
                )
            ),
            retry=(
                st.none()
                | (
                    st.sampled_from(
                        ("retry", "retry_after", "redirect", "outcome_unknown", "fatal")
                    )
                    | _TEXT
                )
            ),
            detail=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["ErrorDetail"])),
        ),
        "unsupported": st.builds(
            _m.Unsupported,
            request_type=_TEXT,
            extension=(st.none() | _TEXT),
            request_id=(st.none() | _U64),
        ),
        "extension": st.builds(
            _m.Extension,
            name=_TEXT,
            request_id=(st.none() | _U64),
            body=(st.none() | _JSON),
        ),
        "publish": st.builds(
            _m.Publish,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payload=_BLOB,
            key=(st.none() | _BLOB),
            request_id=(st.none() | _U64),
            ack=(st.none() | st.sampled_from(_m.AckMode)),
        ),
        "publish_batch": st.builds(
            _m.PublishBatch,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payloads=st.lists(_BLOB, max_size=3),
            key=(st.none() | _BLOB),
            request_id=(st.none() | _U64),
            ack=(st.none() | st.sampled_from(_m.AckMode)),
        ),
        "publish_ok": st.builds(
            _m.PublishOk,
            request_id=_U64,
            offset=(st.none() | _U64),
        ),
        "publish_error": st.builds(
            _m.PublishError,
            request_id=_U64,
            message=_TEXT,
            code=(
                st.none()
                | (
                    st.sampled_from(
                        (
                            "unauthenticated",
                            "forbidden",
                            "not_found",
                            "invalid_request",
                            "shard_unavailable",
                            "not_leader",
                            "quorum_timeout",
                            "leadership_lost",
                            "unacknowledged",
                            "overloaded",
                            "limit_exceeded",
                            "draining",
                            "internal",
                            "storage",
                            "stale_claim",
                            "revoked",
                            "stale_width",
                        )
                    )
                    | _TEXT
                )
            ),
            retry=(
                st.none()
                | (
                    st.sampled_from(
                        ("retry", "retry_after", "redirect", "outcome_unknown", "fatal")
                    )
                    | _TEXT
                )
            ),
            detail=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["ErrorDetail"])),
        ),
        "producer_init": st.builds(
            _m.ProducerInit,
            request_id=_U64,
        ),
        "producer_init_ok": st.builds(
            _m.ProducerInitOk,
            request_id=_U64,
            producer_id=_U64,
        ),
        "publish_idempotent": st.builds(
            _m.PublishIdempotent,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payloads=st.lists(_BLOB, max_size=3),
            key=(st.none() | _BLOB),
            request_id=_U64,
            producer_id=_U64,
            sequence=_U64,
        ),
        "publish_if": st.builds(
            _m.PublishIf,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payloads=st.lists(_BLOB, max_size=3),
            key=(st.none() | _BLOB),
            expected_offset=_U64,
            request_id=_U64,
        ),
        "publish_refused": st.builds(
            _m.PublishRefused,
            request_id=_U64,
            reason=st.deferred(lambda: SHAPE_STRATEGIES["PublishRefusalReason"]),
            message=_TEXT,
        ),
        "publish_width": st.builds(
            _m.PublishWidth,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shards=_U32,
        ),
        "subscribe": st.builds(
            _m.Subscribe,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            subscription_id=(st.none() | _U64),
            start=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["StartPosition"])),
            shard=(st.none() | _U32),
            queue_capacity=(st.none() | _U32),
        ),
        "subscribed": st.builds(
            _m.Subscribed,
            subscription_id=_U64,
            start_offset=(st.none() | _U64),
            live_offset=(st.none() | _U64),
            queue_capacity=(st.none() | _U32),
        ),
        "subscribe_cursor_error": st.builds(
            _m.SubscribeCursorError,
            reason=st.sampled_from(_m.CursorErrorReason),
            requested=_U64,
            available=_U64,
        ),
        "event_stream_hello": st.builds(
            _m.EventStreamHello,
            subscription_id=_U64,
        ),
        "event": st.builds(
            _m.Event,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payload=_BLOB,
            offset=(st.none() | _U64),
        ),
        "event_batch": st.builds(
            _m.EventBatch,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            payloads=st.lists(_BLOB, max_size=3),
            base_offset=(st.none() | _U64),
        ),
        "shard_moved": st.builds(
            _m.ShardMoved,
            subscription_id=_U64,
            resume_from=(st.none() | _U64),
            node_id=(st.none() | _TEXT),
            addr=(st.none() | _TEXT),
            generation=_U64,
        ),
        "subscription_lagged": st.builds(
            _m.SubscriptionLagged,
            subscription_id=_U64,
            resume_from=_U64,
        ),
        "stream_deleted": st.builds(
            _m.StreamDeleted,
            subscription_id=_U64,
        ),
        "cache_put": st.builds(
            _m.CachePut,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            value=_BLOB,
            request_id=(st.none() | _U64),
            ttl_ms=(st.none() | _U64),
        ),
        "cache_get": st.builds(
            _m.CacheGet,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            request_id=(st.none() | _U64),
        ),
        "cache_delete": st.builds(
            _m.CacheDelete,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            request_id=(st.none() | _U64),
        ),
        "cache_value": st.builds(
            _m.CacheValue,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            value=(st.none() | _BLOB),
            request_id=(st.none() | _U64),
            version=(st.none() | _U64),
        ),
        "cache_ok": st.builds(
            _m.CacheOk,
            request_id=_U64,
        ),
        "cache_put_if": st.builds(
            _m.CachePutIf,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            value=_BLOB,
            ttl_ms=(st.none() | _U64),
            condition=st.deferred(lambda: SHAPE_STRATEGIES["CacheCondition"]),
            request_id=_U64,
        ),
        "cache_delete_if": st.builds(
            _m.CacheDeleteIf,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            version=_U64,
            request_id=_U64,
        ),
        "cache_condition_result": st.builds(
            _m.CacheConditionResult,
            applied=st.booleans(),
            version=(st.none() | _U64),
            request_id=_U64,
        ),
        "cache_watch": st.builds(
            _m.CacheWatch,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=(st.none() | _TEXT),
            prefix=(st.none() | _TEXT),
            shard=(st.none() | _U32),
            from_offset=(st.none() | _U64),
            retained=st.booleans(),
            subscription_id=(st.none() | _U64),
        ),
        "cache_watch_started": st.builds(
            _m.CacheWatchStarted,
            subscription_id=_U64,
            resume_offset=_U64,
            resnapshot=st.booleans(),
            retained_count=(st.none() | _U64),
        ),
        "cache_event": st.builds(
            _m.CacheEvent,
            key=_TEXT,
            value=(st.none() | _BLOB),
            offset=_U64,
            expires_at_millis=_U64,
        ),
        "cache_watch_lagged": st.builds(
            _m.CacheWatchLagged,
            resume_from=_U64,
        ),
        "counter_add": st.builds(
            _m.CounterAdd,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            delta=_I64,
            request_id=_U64,
        ),
        "counter_get": st.builds(
            _m.CounterGet,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            key=_TEXT,
            request_id=_U64,
        ),
        "counter_value": st.builds(
            _m.CounterValue,
            value=(st.none() | _I64),
            request_id=_U64,
        ),
        "commit": st.builds(
            _m.Commit,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            entity_key=_BLOB,
            event=_BLOB,
            changes=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["StateChange"]), max_size=3),
            request_id=_U64,
            expected_offset=(st.none() | _U64),
        ),
        "commit_ok": st.builds(
            _m.CommitOk,
            request_id=_U64,
            offset=_U64,
        ),
        "state_get": st.builds(
            _m.StateGet,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            entity_key=_BLOB,
            key=_TEXT,
            request_id=_U64,
        ),
        "state_value": st.builds(
            _m.StateValue,
            value=(st.none() | _BLOB),
            version=(st.none() | _U64),
            as_of=(st.none() | _U64),
            request_id=_U64,
        ),
        "offset_for_time": st.builds(
            _m.OffsetForTime,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            at_micros=_U64,
            request_id=_U64,
        ),
        "offset_value": st.builds(
            _m.OffsetValue,
            offset=(st.none() | _U64),
            request_id=_U64,
        ),
        "stream_read": st.builds(
            _m.StreamRead,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            from_=_U64,
            end=(st.none() | _U64),
            max_records=(st.none() | _U32),
            max_bytes=(st.none() | _U64),
            request_id=_U64,
        ),
        "stream_records": st.builds(
            _m.StreamRecords,
            records=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["StreamRecord"]), max_size=3),
            next_offset=_U64,
            request_id=_U64,
        ),
        "group_poll": st.builds(
            _m.GroupPoll,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            max_records=_U32,
            wait_ms=_U64,
            request_id=_U64,
            consumer=(st.none() | _TEXT),
            reclaim=st.booleans(),
            visibility_ms=_U64,
        ),
        "group_records": st.builds(
            _m.GroupRecords,
            records=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["GroupRecord"]), max_size=3),
            request_id=_U64,
        ),
        "group_ack": st.builds(
            _m.GroupAck,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            request_id=_U64,
        ),
        "group_nack": st.builds(
            _m.GroupNack,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            request_id=_U64,
            delay_ms=_U64,
            attempts=_U32,
        ),
        "group_extend": st.builds(
            _m.GroupExtend,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            attempts=_U32,
            extend_ms=_U64,
            request_id=_U64,
        ),
        "group_extended": st.builds(
            _m.GroupExtended,
            visible_ms=_U64,
            request_id=_U64,
        ),
        "group_dead_letter": st.builds(
            _m.GroupDeadLetter,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            request_id=_U64,
        ),
        "group_dead_letters": st.builds(
            _m.GroupDeadLetters,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            request_id=_U64,
        ),
        "group_dead_letter_list": st.builds(
            _m.GroupDeadLetterList,
            offsets=st.lists(_U64, max_size=3),
            request_id=_U64,
        ),
        "group_discard": st.builds(
            _m.GroupDiscard,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            request_id=_U64,
        ),
        "group_redrive": st.builds(
            _m.GroupRedrive,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            offset=_U64,
            request_id=_U64,
        ),
        "group_seek": st.builds(
            _m.GroupSeek,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            start=st.deferred(lambda: SHAPE_STRATEGIES["StartPosition"]),
            if_new=st.booleans(),
            request_id=_U64,
        ),
        "group_position": st.builds(
            _m.GroupPosition,
            offset=_U64,
            moved=st.booleans(),
            request_id=_U64,
        ),
        "group_describe": st.builds(
            _m.GroupDescribe,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            request_id=_U64,
        ),
        "group_info": st.builds(
            _m.GroupInfo,
            committed=(st.none() | _U64),
            tail=_U64,
            in_flight=_U64,
            owed=_U64,
            dead_letters=_U64,
            request_id=_U64,
        ),
        "group_delete": st.builds(
            _m.GroupDelete,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            group=_TEXT,
            request_id=_U64,
        ),
        "group_deleted": st.builds(
            _m.GroupDeleted,
            existed=st.booleans(),
            request_id=_U64,
        ),
        "topology": st.builds(
            _m.Topology,
        ),
        "topology_view": st.builds(
            _m.TopologyView,
            brokers=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["BrokerEndpoint"]), max_size=3),
        ),
        "stream_shards": st.builds(
            _m.StreamShards,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            request_id=_U64,
        ),
        "stream_shards_view": st.builds(
            _m.StreamShardsView,
            shards=_U32,
            request_id=_U64,
            routing=(st.none() | st.sampled_from(_m.ShardRouting)),
        ),
        "cache_shards": st.builds(
            _m.CacheShards,
            tenant_id=_TEXT,
            namespace=_TEXT,
            cache=_TEXT,
            request_id=_U64,
        ),
        "cache_shards_view": st.builds(
            _m.CacheShardsView,
            shards=_U32,
            request_id=_U64,
        ),
        "shard_owners": st.builds(
            _m.ShardOwners,
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            kind=st.sampled_from(_m.ShardKind),
            request_id=_U64,
        ),
        "shard_owners_view": st.builds(
            _m.ShardOwnersView,
            owners=st.lists(st.deferred(lambda: SHAPE_STRATEGIES["ShardOwner"]), max_size=3),
            request_id=_U64,
        ),
        "shard_inspect": st.builds(
            _m.ShardInspect,
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            kind=st.sampled_from(_m.ShardKind),
            shard=_U32,
            request_id=_U64,
        ),
        "shard_inspect_info": st.builds(
            _m.ShardInspectInfo,
            view=st.deferred(lambda: SHAPE_STRATEGIES["ShardInspection"]),
            request_id=_U64,
        ),
        "subscriptions_list": st.builds(
            _m.SubscriptionsList,
            filter=st.deferred(lambda: SHAPE_STRATEGIES["SubscriptionFilter"]),
            limit=(st.none() | _U32),
            cursor=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["SubscriptionCursor"])),
            request_id=_U64,
        ),
        "subscriptions_list_info": st.builds(
            _m.SubscriptionsListInfo,
            node_id=_TEXT,
            subscriptions=st.lists(
                st.deferred(lambda: SHAPE_STRATEGIES["InspectedSubscription"]), max_size=3
            ),
            next_cursor=(st.none() | st.deferred(lambda: SHAPE_STRATEGIES["SubscriptionCursor"])),
            request_id=_U64,
        ),
        "not_leader": st.builds(
            _m.NotLeader,
            node_id=_TEXT,
            addr=(st.none() | _TEXT),
            generation=_U64,
        ),
    }
)


def message() -> st.SearchStrategy[Any]:
    """Any message."""
    return st.one_of(*MESSAGE_STRATEGIES.values())


@st.composite
def _publish_batch(
    draw: Callable[[st.SearchStrategy[Any]], Any], flags: int
) -> _b.PublishBatchFrame:
    values: dict[str, Any] = {}
    if flags & 0x0008:
        values["request_id"] = draw(st.integers(0, 18446744073709551615))
        values["ack_mode"] = draw(st.sampled_from(_b.BinaryAckMode))
    if flags & 0x0100:
        values["producer_id"] = draw(st.integers(0, 18446744073709551615))
        values["sequence"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x0040:
        values["key"] = draw(st.binary(max_size=24))
    values["tenant_id"] = draw(st.text(max_size=12))
    values["namespace"] = draw(st.text(max_size=12))
    values["stream"] = draw(st.text(max_size=12))
    payloads = draw(st.lists(st.binary(max_size=32), max_size=6))
    values["payloads"] = payloads
    return _b.PublishBatchFrame(**values)


@st.composite
def _publish_ack(draw: Callable[[st.SearchStrategy[Any]], Any], flags: int) -> _b.PublishAckFrame:
    values: dict[str, Any] = {}
    values["status"] = draw(st.sampled_from(_b.AckStatus))
    values["request_id"] = draw(st.integers(0, 18446744073709551615))
    values["message"] = draw(st.text(max_size=12))
    if flags & 0x0200:
        values["code"] = draw(st.integers(0, 65535))
        values["retry"] = draw(st.sampled_from(RetryClass))
    if flags & 0x0400:
        values["reason"] = draw(st.none() | st.text(min_size=1, max_size=12))
        values["retry_after_ms"] = draw(st.none() | st.integers(1, 18446744073709551615))
        if all(
            values[name] is None
            for name in (
                "reason",
                "retry_after_ms",
            )
        ):
            values["reason"] = draw(st.text(min_size=1, max_size=12))
    if flags & 0x0080:
        values["node_id"] = draw(st.text(max_size=12))
        values["addr"] = draw(st.none() | st.text(min_size=1, max_size=12))
        values["generation"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x1000:
        values["offset"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x0200:  # this group only travels with that status
        values["status"] = _b.AckStatus.ERROR
    if flags & 0x1000:  # this group only travels with that status
        values["status"] = _b.AckStatus.OK
    return _b.PublishAckFrame(**values)


@st.composite
def _event_batch_legacy(
    draw: Callable[[st.SearchStrategy[Any]], Any], flags: int
) -> _b.EventBatchLegacyFrame:
    values: dict[str, Any] = {}
    values["subscription_id"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x0020:
        values["base_offset"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x0800:
        values["skipped_before"] = draw(st.integers(1, 18446744073709551615))
    if flags & 0x2000:
        values["publisher"] = draw(st.text(max_size=12))
    payloads = draw(st.lists(st.binary(max_size=32), max_size=6))
    values["payloads"] = payloads
    if flags & 0x4000:
        values["timestamps"] = draw(
            st.lists(
                st.integers(0, 18446744073709551615), min_size=len(payloads), max_size=len(payloads)
            )
        )
    return _b.EventBatchLegacyFrame(**values)


@st.composite
def _event_batch_shared(
    draw: Callable[[st.SearchStrategy[Any]], Any], flags: int
) -> _b.EventBatchSharedFrame:
    values: dict[str, Any] = {}
    if flags & 0x0020:
        values["base_offset"] = draw(st.integers(0, 18446744073709551615))
    if flags & 0x0800:
        values["skipped_before"] = draw(st.integers(1, 18446744073709551615))
    if flags & 0x2000:
        values["publisher"] = draw(st.text(max_size=12))
    payloads = draw(st.lists(st.binary(max_size=32), max_size=6))
    values["payloads"] = payloads
    if flags & 0x4000:
        values["timestamps"] = draw(
            st.lists(
                st.integers(0, 18446744073709551615), min_size=len(payloads), max_size=len(payloads)
            )
        )
    return _b.EventBatchSharedFrame(**values)


BINARY_STRATEGIES: Mapping[str, Callable[[int], st.SearchStrategy[Any]]] = MappingProxyType(
    {
        "publish_batch": _publish_batch,
        "publish_ack": _publish_ack,
        "event_batch_legacy": _event_batch_legacy,
        "event_batch_shared": _event_batch_shared,
    }
)


def binary_frame(layout: str, flags: int) -> st.SearchStrategy[Any]:
    """Frames of `layout` that encode to exactly `flags` (a legal value for it)."""
    return BINARY_STRATEGIES[layout](flags)


_NAME_CHAR = re.compile("[A-Za-z0-9_.-]", re.ASCII)
_NAME_CHARS = st.sampled_from(sorted(c for c in map(chr, range(128)) if _NAME_CHAR.fullmatch(c)))
# Look-alikes and invisible characters a careless check might normalise into the
# alphabet (dot leaders, full-width dot and slashes, zero-width and bidi marks).
_TRICKS = (
    "\u2024",
    "\u2025",
    "\uff0e",
    "\u2215",
    "\u2044",
    "\uff0f",
    "\uff3c",
    "\u200b",
    "\u200d",
    "\u202e",
    "\ufeff",
    "\u0307",
    "\u00a0",
    "\uff41",
    "\u0430",
    "\udc80",
)
_PATH_LIKE = (
    "../x",
    "x/..",
    "./x",
    "x/.",
    "..\\x",
    "a/b",
    "/abs",
    "\\abs",
    "%2e%2e",
    "C:x",
    "x\x00",
    " ",
    "..\x00",
)


def valid_names(max_size: int = 24) -> st.SearchStrategy[str]:
    """Names the rule accepts (short by default; pass max_size up to the limit)."""
    size = min(max_size, _names.NAME_MAX_LENGTH)
    return st.text(_NAME_CHARS, min_size=_names.NAME_MIN_LENGTH, max_size=size).filter(
        _names.is_valid_name
    )


def _unsafe_char() -> st.SearchStrategy[str]:
    return (
        st.sampled_from(("/", "\\", "\x00", "\x7f", *_TRICKS))
        | st.characters(max_codepoint=0x1F)
        | st.characters().filter(lambda c: _NAME_CHAR.fullmatch(c) is None)
    )


def hostile_names() -> st.SearchStrategy[str]:
    """Names every entry point must refuse: reserved ones, empty, too long, and valid
    text around one path separator, NUL, control character or Unicode trick."""
    around = st.tuples(
        st.text(_NAME_CHARS, max_size=6), _unsafe_char(), st.text(_NAME_CHARS, max_size=6)
    )
    return st.one_of(
        st.sampled_from(sorted(_names.RESERVED_NAMES)),
        st.just(""),
        st.sampled_from(_PATH_LIKE),
        around.map("".join),
        st.integers(_names.NAME_MAX_LENGTH + 1, _names.NAME_MAX_LENGTH + 4096).map(
            lambda n: "a" * n
        ),
    ).filter(lambda name: not _names.is_valid_name(name))
