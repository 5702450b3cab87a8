# Generated from spec/fleet.yaml (with spec/messages.yaml) by codegen - DO NOT EDIT.
# spec sha256: 01b2197a06fb92940e875012e0053afb405241902e71a7c479c5cf6f330ac44f
"""Hypothesis strategies for every peer message and etcd record of the fleet catalogue.

Needs the `hypothesis` package (a test dependency); nothing at run time imports it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from hypothesis import strategies as st

from . import fleet as _f
from . import messages as _m
from .strategies import MESSAGE_STRATEGIES as _CLIENT_MESSAGES
from .strategies import SHAPE_STRATEGIES as _CLIENT_SHAPES

__all__ = ["PEER_MESSAGE_STRATEGIES", "RECORD_STRATEGIES", "FLEET_SHAPE_STRATEGIES"]

_U8 = st.integers(0, 255)
_U16 = st.integers(0, 65535)
_U32 = st.integers(0, 4294967295)
_U64 = st.integers(0, 18446744073709551615)
_I64 = st.integers(-9223372036854775808, 9223372036854775807)
_TEXT = st.text(max_size=12)
_BLOB = st.binary(max_size=24)

FLEET_SHAPE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {}
FLEET_SHAPE_STRATEGIES["Member"] = st.builds(
    _f.Member,
    node_id=_TEXT,
    client_addr=_TEXT,
    peer_addr=_TEXT,
    features=st.lists(_TEXT, max_size=3),
    incarnation=_U64,
    ops_addr=(st.none() | _TEXT),
)
FLEET_SHAPE_STRATEGIES["Assignment"] = st.builds(
    _f.Assignment,
    leader=(st.none() | _TEXT),
    replicas=st.lists(_TEXT, max_size=3),
    state=st.sampled_from(_f.AssignmentState),
    reason=(st.none() | _TEXT),
    successor=(st.none() | _TEXT),
)
FLEET_SHAPE_STRATEGIES["FinalizedFeature"] = st.builds(
    _f.FinalizedFeature,
    name=_TEXT,
    finalized_at_ms=_U64,
    by=_TEXT,
    members=st.lists(_TEXT, max_size=3),
)
FLEET_SHAPE_STRATEGIES["MoveCopied"] = st.builds(
    _f.MoveCopied,
    generation=_U64,
    files=_U32,
    bytes=_U64,
)
FLEET_SHAPE_STRATEGIES["PromotionRefusal"] = st.builds(
    _f.PromotionRefusal,
    generation=_U64,
    ahead=st.lists(_TEXT, max_size=3),
)
FLEET_SHAPE_STRATEGIES["Drain"] = st.builds(
    _f.Drain,
    requested_by=_TEXT,
)
FLEET_SHAPE_STRATEGIES["LeaderHint"] = st.builds(
    _f.LeaderHint,
    node_id=_TEXT,
    addr=(st.none() | _TEXT),
    generation=_U64,
)
FLEET_SHAPE_STRATEGIES["StaleRoute"] = st.builds(
    _f.StaleRoute,
    generation=_U64,
)
FLEET_SHAPE_STRATEGIES["PeerError"] = st.builds(
    _f.PeerError,
    code=(
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
    ),
    retry=(
        st.sampled_from(("retry", "retry_after", "redirect", "outcome_unknown", "fatal")) | _TEXT
    ),
    message=_TEXT,
    detail=(st.none() | st.deferred(lambda: _CLIENT_SHAPES["ErrorDetail"])),
)
FLEET_SHAPE_STRATEGIES["ForwardRefusal"] = st.one_of(
    st.builds(_f.ForwardRefusal, error=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["PeerError"])),
    st.builds(
        _f.ForwardRefusal, not_leader=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["LeaderHint"])
    ),
    st.builds(
        _f.ForwardRefusal, stale_route=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["StaleRoute"])
    ),
)
FLEET_SHAPE_STRATEGIES["ReplicationHalt"] = st.builds(
    _f.ReplicationHalt,
    shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
    node=_TEXT,
    generation=_U64,
    progress=_U64,
    reason=_TEXT,
    suggested_action=_TEXT,
)
FLEET_SHAPE_STRATEGIES["ReplicaShard"] = st.builds(
    _f.ReplicaShard,
    kind=st.sampled_from(_f.AssignmentKind),
    tenant=_TEXT,
    namespace=_TEXT,
    name=_TEXT,
    shard=_U32,
)
FLEET_SHAPE_STRATEGIES["ReplicaEntry"] = st.builds(
    _f.ReplicaEntry,
    generation=_U64,
    payload=_BLOB,
    start=st.booleans(),
)
FLEET_SHAPE_STRATEGIES["ReplicatedBatch"] = st.builds(
    _f.ReplicatedBatch,
    timestamp_us=_U64,
    publisher=(st.none() | _TEXT),
    payloads=st.lists(_BLOB, max_size=3),
    producer_id=(st.none() | _U64),
    sequence=(st.none() | _U64),
    digest=(st.none() | _U64),
    expected_offset=(st.none() | _U64),
    commit=(st.none() | st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicatedCommit"])),
)
FLEET_SHAPE_STRATEGIES["ReplicatedStateChange"] = st.builds(
    _f.ReplicatedStateChange,
    key=_TEXT,
    value=(st.none() | _BLOB),
)
FLEET_SHAPE_STRATEGIES["ReplicatedCommit"] = st.builds(
    _f.ReplicatedCommit,
    entity_key=_BLOB,
    changes=st.lists(
        st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicatedStateChange"]), max_size=3
    ),
)
FLEET_SHAPE_STRATEGIES["MoveFile"] = st.builds(
    _f.MoveFile,
    area=_TEXT,
    path=_TEXT,
    size=_U64,
)
FLEET_SHAPE_STRATEGIES["ReplicatedCacheOp"] = st.builds(
    _f.ReplicatedCacheOp,
    op=st.sampled_from(_f.CacheOpKind),
    key=_TEXT,
    now_ms=_U64,
    value=(st.none() | _BLOB),
    ttl_ms=(st.none() | _U64),
    version=(st.none() | _U64),
    delta=(st.none() | _I64),
)
FLEET_SHAPE_STRATEGIES["CacheSnapshotEntry"] = st.builds(
    _f.CacheSnapshotEntry,
    key=_TEXT,
    value=_BLOB,
    version=_U64,
    expires_at_ms=_U64,
)
FLEET_SHAPE_STRATEGIES["CacheSnapshotCounter"] = st.builds(
    _f.CacheSnapshotCounter,
    key=_TEXT,
    total=_I64,
)
FLEET_SHAPE_STRATEGIES["CacheSnapshot"] = st.builds(
    _f.CacheSnapshot,
    offset=_U64,
    generation=_U64,
    tail=_U64,
    entries=st.lists(st.deferred(lambda: FLEET_SHAPE_STRATEGIES["CacheSnapshotEntry"]), max_size=3),
    counters=st.lists(
        st.deferred(lambda: FLEET_SHAPE_STRATEGIES["CacheSnapshotCounter"]), max_size=3
    ),
)
FLEET_SHAPE_STRATEGIES["ReplicatedGroupChange"] = st.builds(
    _f.ReplicatedGroupChange,
    kind=st.sampled_from(_f.GroupChangeKind),
    group=_TEXT,
    offset=_U64,
)
FLEET_SHAPE_STRATEGIES["ReplicatedGroupChanges"] = st.builds(
    _f.ReplicatedGroupChanges,
    group_changes=st.lists(
        st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicatedGroupChange"]), max_size=3
    ),
)
FLEET_SHAPE_STRATEGIES["ReplicatedRetention"] = st.builds(
    _f.ReplicatedRetention,
    retain_from=_U64,
)
FLEET_SHAPE_STRATEGIES["CacheOp"] = st.one_of(
    _CLIENT_MESSAGES["cache_get"],
    _CLIENT_MESSAGES["cache_put"],
    _CLIENT_MESSAGES["cache_delete"],
    _CLIENT_MESSAGES["cache_put_if"],
    _CLIENT_MESSAGES["cache_delete_if"],
    _CLIENT_MESSAGES["counter_add"],
    _CLIENT_MESSAGES["counter_get"],
)
FLEET_SHAPE_STRATEGIES["CacheOpAnswer"] = st.one_of(
    _CLIENT_MESSAGES["cache_value"],
    _CLIENT_MESSAGES["cache_ok"],
    _CLIENT_MESSAGES["cache_condition_result"],
    _CLIENT_MESSAGES["counter_value"],
    _CLIENT_MESSAGES["error"],
    _CLIENT_MESSAGES["unsupported"],
)

PEER_MESSAGE_STRATEGIES: Mapping[str, st.SearchStrategy[Any]] = MappingProxyType(
    {
        "hello": st.builds(
            _f.Hello,
            node_id=_TEXT,
            features=st.lists(_TEXT, max_size=3),
        ),
        "hello_ok": st.builds(
            _f.HelloOk,
            node_id=_TEXT,
            features=st.lists(_TEXT, max_size=3),
        ),
        "hello_refused": st.builds(
            _f.HelloRefused,
            message=_TEXT,
        ),
        "forward_publish": st.builds(
            _f.ForwardPublish,
            request_id=_U64,
            token=_TEXT,
            tenant_id=_TEXT,
            namespace=_TEXT,
            stream=_TEXT,
            shard=_U32,
            generation=_U64,
            key=(st.none() | _BLOB),
            payloads=st.lists(_BLOB, max_size=3),
            ack=st.sampled_from(_f.ForwardAck),
        ),
        "forward_publish_ok": st.builds(
            _f.ForwardPublishOk,
            request_id=_U64,
            offset=(st.none() | _U64),
        ),
        "forward_cache_op": st.builds(
            _f.ForwardCacheOp,
            request_id=_U64,
            token=_TEXT,
            client_flags=_U16,
            client_features=_U64,
            shard=_U32,
            generation=_U64,
            op=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["CacheOp"]),
        ),
        "forward_cache_answer": st.builds(
            _f.ForwardCacheAnswer,
            request_id=_U64,
            answer=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["CacheOpAnswer"]),
        ),
        "forward_refused": st.builds(
            _f.ForwardRefused,
            request_id=_U64,
            refusal=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ForwardRefusal"]),
        ),
        "peer_unsupported": st.builds(
            _f.PeerUnsupported,
            request_type=_TEXT,
            request_id=(st.none() | _U64),
        ),
        "move_chunk": st.builds(
            _f.MoveChunk,
            request_id=_U64,
            kind=st.sampled_from(_f.AssignmentKind),
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            shard=_U32,
            generation=_U64,
            area=_TEXT,
            path=_TEXT,
            position=_U64,
            data=_BLOB,
        ),
        "move_chunk_ok": st.builds(
            _f.MoveChunkOk,
            request_id=_U64,
        ),
        "move_done": st.builds(
            _f.MoveDone,
            request_id=_U64,
            kind=st.sampled_from(_f.AssignmentKind),
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            shard=_U32,
            generation=_U64,
            files=_U32,
            bytes=_U64,
        ),
        "move_done_ok": st.builds(
            _f.MoveDoneOk,
            request_id=_U64,
        ),
        "replica_ship": st.builds(
            _f.ReplicaShip,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            leader=_TEXT,
            offset=_U64,
            prev_generation=_U64,
            entries=st.lists(
                st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaEntry"]), max_size=3
            ),
            commit=_U64,
            compacted=_U64,
        ),
        "replica_ship_ok": st.builds(
            _f.ReplicaShipOk,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            sender=_TEXT,
            durable=_U64,
            matched=_U64,
        ),
        "replica_ship_refused": st.builds(
            _f.ReplicaShipRefused,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            sender=_TEXT,
            refusal=st.sampled_from(_f.ShipRefusal),
            resume_at=_U64,
        ),
        "replica_fence": st.builds(
            _f.ReplicaFence,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            candidate=_TEXT,
        ),
        "replica_fence_ok": st.builds(
            _f.ReplicaFenceOk,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            sender=_TEXT,
            last_generation=_U64,
            length=_U64,
        ),
        "replica_fence_refused": st.builds(
            _f.ReplicaFenceRefused,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            sender=_TEXT,
        ),
        "replica_received": st.builds(
            _f.ReplicaReceived,
            held=st.booleans(),
        ),
        "move_caught_up": st.builds(
            _f.MoveCaughtUp,
            request_id=_U64,
            kind=st.sampled_from(_f.AssignmentKind),
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            shard=_U32,
            generation=_U64,
            passes=_U32,
            bytes=_U64,
        ),
        "move_final": st.builds(
            _f.MoveFinal,
            request_id=_U64,
            kind=st.sampled_from(_f.AssignmentKind),
            tenant_id=_TEXT,
            namespace=_TEXT,
            name=_TEXT,
            shard=_U32,
            generation=_U64,
            files=st.lists(st.deferred(lambda: FLEET_SHAPE_STRATEGIES["MoveFile"]), max_size=3),
            bytes=_U64,
        ),
        "replica_read_round": st.builds(
            _f.ReplicaReadRound,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            generation=_U64,
            leader=_TEXT,
        ),
        "replica_read_answer": st.builds(
            _f.ReplicaReadAnswer,
            held=st.booleans(),
            generation=_U64,
            confirmed=st.booleans(),
        ),
        "replica_snapshot_request": st.builds(
            _f.ReplicaSnapshotRequest,
            shard=st.deferred(lambda: FLEET_SHAPE_STRATEGIES["ReplicaShard"]),
            sender=_TEXT,
        ),
        "replica_snapshot": st.builds(
            _f.ReplicaSnapshot,
            held=st.booleans(),
            generation=_U64,
            snapshot=(st.none() | st.deferred(lambda: FLEET_SHAPE_STRATEGIES["CacheSnapshot"])),
            refused=(st.none() | _TEXT),
        ),
    }
)
RECORD_STRATEGIES: Mapping[str, st.SearchStrategy[Any]] = MappingProxyType(
    {
        "Member": FLEET_SHAPE_STRATEGIES["Member"],
        "Assignment": FLEET_SHAPE_STRATEGIES["Assignment"],
        "FinalizedFeature": FLEET_SHAPE_STRATEGIES["FinalizedFeature"],
        "MoveCopied": FLEET_SHAPE_STRATEGIES["MoveCopied"],
        "PromotionRefusal": FLEET_SHAPE_STRATEGIES["PromotionRefusal"],
        "Drain": FLEET_SHAPE_STRATEGIES["Drain"],
    }
)
