# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Feature gating and negotiation, as tables generated from the catalogue.

- MESSAGE_GATES: which flags/features the *receiving* peer must have announced
  before a message may be sent to it (the broker's advertisement for requests,
  the client's offer for broker messages).
- FIELD_GATES: optional fields that may be sent only to a peer that announced
  something; `shape_for_peer` drops them (resets them to absent/default) and
  refuses a message whose own gate is not met, so nothing un-negotiated leaves.
- The negotiation rules of features.yaml: `auth_answer` (auth_ok only to a
  client that offered client_flags; the extended word rules; publish_window),
  `client_capabilities` / `server_capabilities`, and `client_auth`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, NamedTuple, Sequence

import msgspec

from .features import UNNEGOTIABLE, Capabilities, Feature, feature_words, features_from_words
from .flags import ORIGINAL_V1_FLAGS
from .messages import Auth, AuthOk, Message, Ok
from .wire_errors import NotNegotiatedError

__all__ = [
    "Gate",
    "FieldGate",
    "MESSAGE_GATES",
    "FIELD_GATES",
    "SHAPE_FIELD_GATES",
    "NESTED_SHAPES",
    "MESSAGE_DIRECTIONS",
    "REQUEST_ANSWERS",
    "check_sendable",
    "shape_for_peer",
    "client_capabilities",
    "server_capabilities",
    "auth_answer",
    "client_auth",
]


class Gate(NamedTuple):
    flags: int
    features: int
    names: tuple[str, ...]


class FieldGate(NamedTuple):
    attr: str
    flags: int
    features: int
    names: tuple[str, ...]
    absent: Any  # the value the field takes when it may not be sent


MESSAGE_GATES: Mapping[str, Gate] = MappingProxyType(
    {
        "unsupported": Gate(0x0000, 0x2000, ("FEATURE_UNSUPPORTED",)),
        "extension": Gate(0x0000, 0x2000, ("FEATURE_UNSUPPORTED",)),
        "producer_init": Gate(0x0000, 0x200, ("FEATURE_IDEMPOTENT_PRODUCER",)),
        "publish_idempotent": Gate(0x0000, 0x200, ("FEATURE_IDEMPOTENT_PRODUCER",)),
        "publish_if": Gate(0x0000, 0x10000000, ("FEATURE_PUBLISH_CONDITIONAL",)),
        "publish_width": Gate(0x0000, 0x400000000, ("FEATURE_PUBLISH_WIDTH",)),
        "shard_moved": Gate(0x0000, 0x1000, ("FEATURE_SHARD_MOVED",)),
        "subscription_lagged": Gate(
            0x0020,
            0x200000,
            (
                "FEATURE_SUBSCRIPTION_LAGGED",
                "EVENT_BATCH_OFFSETS",
            ),
        ),
        "stream_deleted": Gate(0x0000, UNNEGOTIABLE, ("FEATURE_STREAM_DELETED",)),
        "cache_delete": Gate(0x0000, 0x4, ("FEATURE_CACHE_DELETE",)),
        "cache_put_if": Gate(0x0000, 0x2000000, ("FEATURE_CACHE_CONDITIONAL",)),
        "cache_delete_if": Gate(0x0000, 0x2000000, ("FEATURE_CACHE_CONDITIONAL",)),
        "cache_watch": Gate(0x0000, 0x40, ("FEATURE_CACHE_WATCH",)),
        "counter_add": Gate(0x0000, 0x100, ("FEATURE_COUNTERS",)),
        "counter_get": Gate(0x0000, 0x100, ("FEATURE_COUNTERS",)),
        "commit": Gate(0x0000, 0x10000, ("FEATURE_ATOMIC_COMMIT",)),
        "state_get": Gate(0x0000, 0x10000, ("FEATURE_ATOMIC_COMMIT",)),
        "offset_for_time": Gate(0x0000, 0x4000000, ("FEATURE_RECORD_TIMESTAMPS",)),
        "stream_read": Gate(0x0000, 0x20000000, ("FEATURE_STREAM_READ",)),
        "group_poll": Gate(0x0000, 0x8, ("FEATURE_CONSUMER_GROUP",)),
        "group_ack": Gate(0x0000, 0x8, ("FEATURE_CONSUMER_GROUP",)),
        "group_nack": Gate(0x0000, 0x8, ("FEATURE_CONSUMER_GROUP",)),
        "group_extend": Gate(0x0000, 0x8000000, ("FEATURE_GROUP_CLAIM_CONTROL",)),
        "group_dead_letter": Gate(0x0000, 0x8000000, ("FEATURE_GROUP_CLAIM_CONTROL",)),
        "group_dead_letters": Gate(0x0000, 0x10, ("FEATURE_GROUP_DEAD_LETTERS",)),
        "group_discard": Gate(0x0000, 0x10, ("FEATURE_GROUP_DEAD_LETTERS",)),
        "group_redrive": Gate(0x0000, 0x10, ("FEATURE_GROUP_DEAD_LETTERS",)),
        "group_seek": Gate(0x0000, 0x1000000, ("FEATURE_GROUP_ADMIN",)),
        "group_describe": Gate(0x0000, 0x1000000, ("FEATURE_GROUP_ADMIN",)),
        "group_delete": Gate(0x0000, 0x1000000, ("FEATURE_GROUP_ADMIN",)),
        "topology": Gate(0x0000, 0x1, ("FEATURE_TOPOLOGY",)),
        "stream_shards": Gate(0x0000, 0x20, ("FEATURE_STREAM_SHARDS",)),
        "cache_shards": Gate(0x0000, 0x400, ("FEATURE_CACHE_SHARDS",)),
        "shard_owners": Gate(0x0000, 0x40000, ("FEATURE_SHARD_OWNERS",)),
        "shard_inspect": Gate(0x0000, 0x100000000, ("FEATURE_INSPECT",)),
        "subscriptions_list": Gate(0x0000, 0x100000000, ("FEATURE_INSPECT",)),
        "not_leader": Gate(0x0000, 0x2, ("FEATURE_REDIRECT",)),
    }
)

FIELD_GATES: Mapping[str, tuple[FieldGate, ...]] = MappingProxyType(
    {
        "auth_ok": (
            FieldGate("server_features_hi", 0x0000, 0x80000000, ("FEATURE_EXTENDED",), absent=None),
            FieldGate("publish_window", 0x0000, 0x8000, ("FEATURE_PUBLISH_PIPELINE",), absent=None),
        ),
        "error": (
            FieldGate("code", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
            FieldGate("retry", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
            FieldGate("detail", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
        ),
        "publish_ok": (
            FieldGate("offset", 0x1000, 0x0, ("BINARY_PUBLISH_ACK_OFFSET",), absent=None),
        ),
        "publish_error": (
            FieldGate("code", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
            FieldGate("retry", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
            FieldGate("detail", 0x0000, 0x800, ("FEATURE_ERROR_CODES",), absent=None),
        ),
        "subscribe": (
            FieldGate(
                "queue_capacity", 0x0000, 0x40000000, ("FEATURE_SUBSCRIBE_QUEUE",), absent=None
            ),
        ),
        "subscribed": (
            FieldGate("start_offset", 0x0020, 0x0, ("EVENT_BATCH_OFFSETS",), absent=None),
            FieldGate("live_offset", 0x0020, 0x0, ("EVENT_BATCH_OFFSETS",), absent=None),
        ),
        "cache_value": (
            FieldGate("version", 0x0000, 0x2000000, ("FEATURE_CACHE_CONDITIONAL",), absent=None),
        ),
        "cache_watch": (
            FieldGate("retained", 0x0000, 0x80, ("FEATURE_CACHE_WATCH_RETAINED",), absent=False),
        ),
        "commit": (
            FieldGate(
                "expected_offset", 0x0000, 0x10000000, ("FEATURE_PUBLISH_CONDITIONAL",), absent=None
            ),
        ),
        "group_poll": (
            FieldGate("consumer", 0x0000, 0x100000, ("FEATURE_GROUP_CONSUMER",), absent=None),
            FieldGate("reclaim", 0x0000, 0x100000, ("FEATURE_GROUP_CONSUMER",), absent=False),
            FieldGate(
                "visibility_ms", 0x0000, 0x8000000, ("FEATURE_GROUP_CLAIM_CONTROL",), absent=0
            ),
        ),
        "group_nack": (
            FieldGate("delay_ms", 0x0000, 0x8000000, ("FEATURE_GROUP_CLAIM_CONTROL",), absent=0),
            FieldGate("attempts", 0x0000, 0x8000000, ("FEATURE_GROUP_CLAIM_CONTROL",), absent=0),
        ),
    }
)

SHAPE_FIELD_GATES: Mapping[str, tuple[FieldGate, ...]] = MappingProxyType(
    {
        "GroupRecord": (
            FieldGate("skipped_before", 0x0000, 0x400000, ("FEATURE_GROUP_SKIPPED",), absent=0),
            FieldGate("publisher", 0x0000, 0x800000, ("FEATURE_GROUP_PUBLISHER",), absent=None),
            FieldGate(
                "timestamp_micros", 0x0000, 0x4000000, ("FEATURE_RECORD_TIMESTAMPS",), absent=None
            ),
        ),
    }
)

# Message fields holding a shape with gated fields: (attribute, shape, is_list).
NESTED_SHAPES: Mapping[str, tuple[tuple[str, str, bool], ...]] = MappingProxyType(
    {
        "group_records": (("records", "GroupRecord", True),),
    }
)

MESSAGE_DIRECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "auth": "client_to_broker",
        "auth_ok": "broker_to_client",
        "ok": "broker_to_client",
        "error": "broker_to_client",
        "unsupported": "broker_to_client",
        "extension": "client_to_broker",
        "publish": "client_to_broker",
        "publish_batch": "client_to_broker",
        "publish_ok": "broker_to_client",
        "publish_error": "broker_to_client",
        "producer_init": "client_to_broker",
        "producer_init_ok": "broker_to_client",
        "publish_idempotent": "client_to_broker",
        "publish_if": "client_to_broker",
        "publish_refused": "broker_to_client",
        "publish_width": "client_to_broker",
        "subscribe": "client_to_broker",
        "subscribed": "broker_to_client",
        "subscribe_cursor_error": "broker_to_client",
        "event_stream_hello": "broker_to_client",
        "event": "broker_to_client",
        "event_batch": "broker_to_client",
        "shard_moved": "broker_to_client",
        "subscription_lagged": "broker_to_client",
        "stream_deleted": "broker_to_client",
        "cache_put": "client_to_broker",
        "cache_get": "client_to_broker",
        "cache_delete": "client_to_broker",
        "cache_value": "broker_to_client",
        "cache_ok": "broker_to_client",
        "cache_put_if": "client_to_broker",
        "cache_delete_if": "client_to_broker",
        "cache_condition_result": "broker_to_client",
        "cache_watch": "client_to_broker",
        "cache_watch_started": "broker_to_client",
        "cache_event": "broker_to_client",
        "cache_watch_lagged": "broker_to_client",
        "counter_add": "client_to_broker",
        "counter_get": "client_to_broker",
        "counter_value": "broker_to_client",
        "commit": "client_to_broker",
        "commit_ok": "broker_to_client",
        "state_get": "client_to_broker",
        "state_value": "broker_to_client",
        "offset_for_time": "client_to_broker",
        "offset_value": "broker_to_client",
        "stream_read": "client_to_broker",
        "stream_records": "broker_to_client",
        "group_poll": "client_to_broker",
        "group_records": "broker_to_client",
        "group_ack": "client_to_broker",
        "group_nack": "client_to_broker",
        "group_extend": "client_to_broker",
        "group_extended": "broker_to_client",
        "group_dead_letter": "client_to_broker",
        "group_dead_letters": "client_to_broker",
        "group_dead_letter_list": "broker_to_client",
        "group_discard": "client_to_broker",
        "group_redrive": "client_to_broker",
        "group_seek": "client_to_broker",
        "group_position": "broker_to_client",
        "group_describe": "client_to_broker",
        "group_info": "broker_to_client",
        "group_delete": "client_to_broker",
        "group_deleted": "broker_to_client",
        "topology": "client_to_broker",
        "topology_view": "broker_to_client",
        "stream_shards": "client_to_broker",
        "stream_shards_view": "broker_to_client",
        "cache_shards": "client_to_broker",
        "cache_shards_view": "broker_to_client",
        "shard_owners": "client_to_broker",
        "shard_owners_view": "broker_to_client",
        "shard_inspect": "client_to_broker",
        "shard_inspect_info": "broker_to_client",
        "subscriptions_list": "client_to_broker",
        "subscriptions_list_info": "broker_to_client",
        "not_leader": "broker_to_client",
    }
)

REQUEST_ANSWERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "auth": (
            "auth_ok",
            "ok",
            "error",
        ),
        "extension": ("unsupported",),
        "publish": (
            "publish_ok",
            "publish_error",
        ),
        "publish_batch": (
            "publish_ok",
            "publish_error",
        ),
        "producer_init": ("producer_init_ok",),
        "publish_idempotent": (
            "publish_ok",
            "publish_error",
            "publish_refused",
        ),
        "publish_if": (
            "publish_ok",
            "publish_refused",
            "error",
            "not_leader",
        ),
        "subscribe": (
            "subscribed",
            "subscribe_cursor_error",
            "not_leader",
            "error",
        ),
        "cache_put": ("cache_ok",),
        "cache_get": ("cache_value",),
        "cache_delete": ("cache_value",),
        "cache_put_if": ("cache_condition_result",),
        "cache_delete_if": ("cache_condition_result",),
        "cache_watch": (
            "cache_watch_started",
            "subscribe_cursor_error",
            "not_leader",
            "error",
        ),
        "counter_add": ("counter_value",),
        "counter_get": ("counter_value",),
        "commit": (
            "commit_ok",
            "error",
            "not_leader",
            "publish_refused",
        ),
        "state_get": ("state_value",),
        "offset_for_time": (
            "offset_value",
            "not_leader",
            "error",
        ),
        "stream_read": (
            "stream_records",
            "subscribe_cursor_error",
            "not_leader",
            "error",
        ),
        "group_poll": ("group_records",),
        "group_ack": ("cache_ok",),
        "group_nack": ("cache_ok",),
        "group_extend": ("group_extended",),
        "group_dead_letter": ("cache_ok",),
        "group_dead_letters": ("group_dead_letter_list",),
        "group_discard": ("cache_ok",),
        "group_redrive": ("cache_ok",),
        "group_seek": ("group_position",),
        "group_describe": ("group_info",),
        "group_delete": ("group_deleted",),
        "topology": ("topology_view",),
        "stream_shards": ("stream_shards_view",),
        "cache_shards": ("cache_shards_view",),
        "shard_owners": ("shard_owners_view",),
        "shard_inspect": (
            "shard_inspect_info",
            "error",
        ),
        "subscriptions_list": (
            "subscriptions_list_info",
            "error",
        ),
    }
)


def _missing(peer: Capabilities, gate: Gate | FieldGate) -> list[str]:
    return [name for name in gate.names if not _has_named(peer, name)]


def _has_named(peer: Capabilities, name: str) -> bool:
    # Flags and features are separate numbering spaces: test the named bit in its own.
    if name.startswith("FEATURE_"):
        value = _FEATURE_VALUES.get(name, UNNEGOTIABLE)
        return peer.features & value == value
    value = _FLAG_VALUES[name]
    return peer.flags & value == value


_FEATURE_VALUES: Mapping[str, int] = MappingProxyType(
    {
        "FEATURE_TOPOLOGY": 0x1,
        "FEATURE_REDIRECT": 0x2,
        "FEATURE_CACHE_DELETE": 0x4,
        "FEATURE_CONSUMER_GROUP": 0x8,
        "FEATURE_GROUP_DEAD_LETTERS": 0x10,
        "FEATURE_STREAM_SHARDS": 0x20,
        "FEATURE_CACHE_WATCH": 0x40,
        "FEATURE_CACHE_WATCH_RETAINED": 0x80,
        "FEATURE_COUNTERS": 0x100,
        "FEATURE_IDEMPOTENT_PRODUCER": 0x200,
        "FEATURE_CACHE_SHARDS": 0x400,
        "FEATURE_ERROR_CODES": 0x800,
        "FEATURE_SHARD_MOVED": 0x1000,
        "FEATURE_UNSUPPORTED": 0x2000,
        "FEATURE_SEQUENCE_REUSED": 0x4000,
        "FEATURE_PUBLISH_PIPELINE": 0x8000,
        "FEATURE_ATOMIC_COMMIT": 0x10000,
        "FEATURE_STREAM_PUBLISH_WINDOW": 0x20000,
        "FEATURE_SHARD_OWNERS": 0x40000,
        "FEATURE_ACK_ON_COMMIT": 0x80000,
        "FEATURE_GROUP_CONSUMER": 0x100000,
        "FEATURE_SUBSCRIPTION_LAGGED": 0x200000,
        "FEATURE_GROUP_SKIPPED": 0x400000,
        "FEATURE_GROUP_PUBLISHER": 0x800000,
        "FEATURE_GROUP_ADMIN": 0x1000000,
        "FEATURE_CACHE_CONDITIONAL": 0x2000000,
        "FEATURE_RECORD_TIMESTAMPS": 0x4000000,
        "FEATURE_GROUP_CLAIM_CONTROL": 0x8000000,
        "FEATURE_PUBLISH_CONDITIONAL": 0x10000000,
        "FEATURE_STREAM_READ": 0x20000000,
        "FEATURE_SUBSCRIBE_QUEUE": 0x40000000,
        "FEATURE_INSPECT": 0x100000000,
        "FEATURE_EXTENDED_BIT_33": 0x200000000,
        "FEATURE_PUBLISH_WIDTH": 0x400000000,
        "FEATURE_EXTENDED_BIT_35": 0x800000000,
        "FEATURE_EXTENDED": 0x80000000,
    }
)
_FLAG_VALUES: Mapping[str, int] = MappingProxyType(
    {
        "BINARY_PUBLISH_BATCH": 0x0001,
        "BINARY_EVENT_BATCH": 0x0002,
        "BINARY_EVENT_BATCH_SHARED": 0x0004,
        "BINARY_PUBLISH_ACKED": 0x0008,
        "BINARY_PUBLISH_ACK": 0x0010,
        "EVENT_BATCH_OFFSETS": 0x0020,
        "BINARY_PUBLISH_KEYED": 0x0040,
        "BINARY_PUBLISH_ACK_OWNER": 0x0080,
        "BINARY_PUBLISH_IDEMPOTENT": 0x0100,
        "BINARY_PUBLISH_ACK_CODE": 0x0200,
        "BINARY_PUBLISH_ACK_DETAIL": 0x0400,
        "EVENT_BATCH_SKIPPED": 0x0800,
        "BINARY_PUBLISH_ACK_OFFSET": 0x1000,
        "EVENT_BATCH_PUBLISHER": 0x2000,
        "EVENT_BATCH_TIMESTAMPS": 0x4000,
    }
)


def check_sendable(message_type: str, peer: Capabilities) -> None:
    """Raise NotNegotiatedError unless the peer announced what `message_type` needs."""
    gate = MESSAGE_GATES.get(message_type)
    if gate is not None and not peer.has(gate.flags, gate.features):
        raise NotNegotiatedError(message_type, _missing(peer, gate))


def _shape_nested(value: Any, shape: str, peer: Capabilities) -> Any:
    changes = {
        g.attr: g.absent
        for g in SHAPE_FIELD_GATES[shape]
        if not peer.has(g.flags, g.features) and getattr(value, g.attr) != g.absent
    }
    return msgspec.structs.replace(value, **changes) if changes else value


def shape_for_peer(message: Message, peer: Capabilities) -> Message:
    """The message as it may be sent to `peer`: refused if its own gate is not met,
    otherwise with every gated optional field the peer did not announce removed."""
    message_type = type(message).__struct_config__.tag
    check_sendable(message_type, peer)
    changes: dict[str, Any] = {}
    for g in FIELD_GATES.get(message_type, ()):
        if not peer.has(g.flags, g.features) and getattr(message, g.attr) != g.absent:
            changes[g.attr] = g.absent
    for attr, shape, is_list in NESTED_SHAPES.get(message_type, ()):
        value = getattr(message, attr)
        if value is None:
            continue
        if is_list:
            shaped = [_shape_nested(item, shape, peer) for item in value]
            if any(a is not b for a, b in zip(shaped, value)):
                changes[attr] = shaped
        else:
            shaped_one = _shape_nested(value, shape, peer)
            if shaped_one is not value:
                changes[attr] = shaped_one
    return msgspec.structs.replace(message, **changes) if changes else message


def client_capabilities(auth: Auth) -> Capabilities:
    """What a client announced in its auth. Without client_flags the broker sends only
    what an original v1 peer parses."""
    flags = auth.client_flags if auth.client_flags is not None else int(ORIGINAL_V1_FLAGS)
    return Capabilities(flags, features_from_words(auth.client_features, auth.client_features_hi))


def server_capabilities(answer: AuthOk | Ok) -> Capabilities:
    """What a broker announced; a plain ok means ORIGINAL_V1_FLAGS and no features."""
    if isinstance(answer, Ok):
        return Capabilities(int(ORIGINAL_V1_FLAGS), 0)
    return Capabilities(
        answer.server_flags, features_from_words(answer.server_features, answer.server_features_hi)
    )


def auth_answer(
    auth: Auth,
    *,
    server_flags: int,
    server_features: int,
    publish_window: int = 0,
    listener_ports: Sequence[int] = (),
) -> AuthOk | Ok:
    """The answer to a successful auth, by the negotiation rules.

    - plain ok when the auth carried no client_flags;
    - server_flags is the broker's own set (not an intersection);
    - the publish-pipeline features are withdrawn when the window is 0, and the
      window is sent only to a client that offered FEATURE_PUBLISH_PIPELINE;
    - the extended word (with the marker) only to a client that set the marker,
      only when non-zero;
    - listener_ports only when the broker binds more than one port.
    """
    if auth.client_flags is None:
        return Ok()
    client = client_capabilities(auth)
    features = server_features
    if publish_window <= 0:
        features &= ~(Feature.FEATURE_PUBLISH_PIPELINE | Feature.FEATURE_STREAM_PUBLISH_WINDOW)
    lo, hi = feature_words(features, peer_reads_hi=client.reads_hi)
    window = None
    if publish_window > 0 and client.has_feature(Feature.FEATURE_PUBLISH_PIPELINE):
        window = publish_window
    return AuthOk(
        server_flags=server_flags,
        server_features=lo or None,
        server_features_hi=hi,
        listener_ports=list(listener_ports) if len(listener_ports) > 1 else None,
        publish_window=window,
    )


def client_auth(
    tenant_id: str, token: str, *, client_flags: int | None, client_features: int
) -> Auth:
    """A client's auth frame; the feature words follow the extended-word rules."""
    lo, hi = feature_words(client_features, peer_reads_hi=True)
    return Auth(
        tenant_id=tenant_id,
        token=token,
        client_flags=client_flags,
        client_features=lo or None,
        client_features_hi=hi,
    )
