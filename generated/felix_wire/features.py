# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Feature bits: which requests and messages exist between two peers.

A feature bit says a request or message EXISTS; a frame flag says how a payload
is LAID OUT. Features live in one 64-bit set here: bits 0-31 travel in the
`*_features` word, bits 32-63 in the `*_features_hi` word.

Marker rules (FEATURE_EXTENDED, bit 31):
- A peer sets the marker and sends its _hi word only when that word is non-zero; a client offers every extended bit it knows, so setting the marker also means 'I read server_features_hi'.
- A broker sends server_features_hi (with the marker in server_features) only to a client that set the marker, and only if it serves an extended feature.
- A reader counts a _hi word only when the first word carries the marker; a _hi word without the marker is ignored. Absent _hi = none.
- Why a second field: an old broker decodes client_features as u32 and a larger number would fail the whole auth.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from .flags import ORIGINAL_V1_FLAGS

__all__ = [
    "Feature",
    "FeatureInfo",
    "FEATURE_INFO",
    "FEATURE_EXTENDED",
    "KNOWN_FEATURES_LO",
    "KNOWN_FEATURES_HI",
    "UNNEGOTIABLE",
    "Capabilities",
    "feature_words",
    "features_from_words",
]

FEATURE_EXTENDED = 1 << 31
"""Not a feature: marks that a `_hi` word follows (see the module docstring)."""

UNNEGOTIABLE = 1 << 64
"""A feature-mask bit no peer can have: gates on features without a known bit value."""


class Feature(enum.IntFlag):
    FEATURE_TOPOLOGY = 1 << 0
    """topology -> topology_view"""
    FEATURE_REDIRECT = 1 << 1
    """the broker may send not_leader; otherwise it sends error (code not_leader)"""
    FEATURE_CACHE_DELETE = 1 << 2
    """cache_delete"""
    FEATURE_CONSUMER_GROUP = 1 << 3
    """group_poll, group_ack, group_nack"""
    FEATURE_GROUP_DEAD_LETTERS = 1 << 4
    """group_dead_letters, group_discard, group_redrive"""
    FEATURE_STREAM_SHARDS = 1 << 5
    """stream_shards"""
    FEATURE_CACHE_WATCH = 1 << 6
    """cache_watch"""
    FEATURE_CACHE_WATCH_RETAINED = 1 << 7
    """retained on cache_watch"""
    FEATURE_COUNTERS = 1 << 8
    """counter_add, counter_get"""
    FEATURE_IDEMPOTENT_PRODUCER = 1 << 9
    """producer_init, publish_idempotent; refusals as publish_refused. A client offers it to say it decodes publish_refused."""
    FEATURE_CACHE_SHARDS = 1 << 10
    """cache_shards"""
    FEATURE_ERROR_CODES = 1 << 11
    """code / retry / detail on error and publish_error"""
    FEATURE_SHARD_MOVED = 1 << 12
    """shard_moved as the last frame of an event stream"""
    FEATURE_UNSUPPORTED = 1 << 13
    """the broker answers unknown requests with unsupported (only if the client offered it too); extension requests"""
    FEATURE_SEQUENCE_REUSED = 1 << 14
    """publish_refused reason sequence_reused"""
    FEATURE_PUBLISH_PIPELINE = 1 << 15
    """auth_ok.publish_window; in-order answers to acked publishes per stream"""
    FEATURE_ATOMIC_COMMIT = 1 << 16
    """commit, state_get"""
    FEATURE_STREAM_PUBLISH_WINDOW = 1 << 17
    """the publish window is per stream (otherwise per connection)"""
    FEATURE_SHARD_OWNERS = 1 << 18
    """shard_owners"""
    FEATURE_ACK_ON_COMMIT = 1 << 19
    """this connection's acked publishes are answered after the write, with offsets"""
    FEATURE_GROUP_CONSUMER = 1 << 20
    """consumer, reclaim on group_poll"""
    FEATURE_SUBSCRIPTION_LAGGED = 1 << 21
    """subscription_lagged as the last frame (also needs flag EVENT_BATCH_OFFSETS)"""
    FEATURE_GROUP_SKIPPED = 1 << 22
    """skipped_before on group records"""
    FEATURE_GROUP_PUBLISHER = 1 << 23
    """publisher on group records"""
    FEATURE_GROUP_ADMIN = 1 << 24
    """group_seek, group_describe, group_delete"""
    FEATURE_CACHE_CONDITIONAL = 1 << 25
    """cache_put_if, cache_delete_if; a client offers it to get version on cache_value"""
    FEATURE_RECORD_TIMESTAMPS = 1 << 26
    """offset_for_time; a client offers it to get timestamp_micros on group records"""
    FEATURE_GROUP_CLAIM_CONTROL = 1 << 27
    """group_extend, group_dead_letter; delay_ms / attempts on group_nack; visibility_ms on group_poll"""
    FEATURE_PUBLISH_CONDITIONAL = 1 << 28
    """publish_if; expected_offset on commit"""
    FEATURE_STREAM_READ = 1 << 29
    """stream_read -> stream_records"""
    FEATURE_SUBSCRIBE_QUEUE = 1 << 30
    """queue_capacity on subscribe / subscribed"""
    FEATURE_INSPECT = 1 << 32
    """shard_inspect, subscriptions_list"""
    FEATURE_EXTENDED_BIT_33 = 1 << 33
    """nothing known"""
    FEATURE_PUBLISH_WIDTH = 1 << 34
    """publish_width"""
    FEATURE_EXTENDED_BIT_35 = 1 << 35
    """nothing known"""


@dataclass(frozen=True)
class FeatureInfo:
    name: str
    value: int | None  # None: no bit value is known, so it can never be negotiated
    direction: str  # "broker" advertises / "client" offers / "both"
    gates: str
    also_advertised_by_broker: bool
    also_offered_by_client: bool
    availability: str | None
    note: str | None


FEATURE_INFO: Mapping[str, FeatureInfo] = MappingProxyType(
    {
        "FEATURE_TOPOLOGY": FeatureInfo(
            "FEATURE_TOPOLOGY",
            1,
            "broker",
            "topology -> topology_view",
            False,
            False,
            "cluster only; a standalone broker does not advertise it",
            None,
        ),
        "FEATURE_REDIRECT": FeatureInfo(
            "FEATURE_REDIRECT",
            2,
            "client",
            "the broker may send not_leader; otherwise it sends error (code not_leader)",
            True,
            False,
            "brokers advertise it in a cluster only",
            None,
        ),
        "FEATURE_CACHE_DELETE": FeatureInfo(
            "FEATURE_CACHE_DELETE",
            4,
            "broker",
            "cache_delete",
            False,
            False,
            "standalone and cluster",
            None,
        ),
        "FEATURE_CONSUMER_GROUP": FeatureInfo(
            "FEATURE_CONSUMER_GROUP",
            8,
            "broker",
            "group_poll, group_ack, group_nack",
            False,
            False,
            "needs durable storage",
            None,
        ),
        "FEATURE_GROUP_DEAD_LETTERS": FeatureInfo(
            "FEATURE_GROUP_DEAD_LETTERS",
            16,
            "broker",
            "group_dead_letters, group_discard, group_redrive",
            False,
            False,
            "needs durable storage",
            None,
        ),
        "FEATURE_STREAM_SHARDS": FeatureInfo(
            "FEATURE_STREAM_SHARDS",
            32,
            "broker",
            "stream_shards",
            False,
            False,
            "standalone and cluster",
            None,
        ),
        "FEATURE_CACHE_WATCH": FeatureInfo(
            "FEATURE_CACHE_WATCH",
            64,
            "broker",
            "cache_watch",
            False,
            False,
            "log-backed cache only",
            None,
        ),
        "FEATURE_CACHE_WATCH_RETAINED": FeatureInfo(
            "FEATURE_CACHE_WATCH_RETAINED",
            128,
            "broker",
            "retained on cache_watch",
            False,
            False,
            "travels with FEATURE_CACHE_WATCH",
            None,
        ),
        "FEATURE_COUNTERS": FeatureInfo(
            "FEATURE_COUNTERS",
            256,
            "broker",
            "counter_add, counter_get",
            False,
            False,
            "needs durable storage",
            None,
        ),
        "FEATURE_IDEMPOTENT_PRODUCER": FeatureInfo(
            "FEATURE_IDEMPOTENT_PRODUCER",
            512,
            "broker",
            "producer_init, publish_idempotent; refusals as publish_refused. A client offers it to say it decodes publish_refused.",
            False,
            True,
            None,
            None,
        ),
        "FEATURE_CACHE_SHARDS": FeatureInfo(
            "FEATURE_CACHE_SHARDS",
            1024,
            "broker",
            "cache_shards",
            False,
            False,
            "standalone and cluster",
            None,
        ),
        "FEATURE_ERROR_CODES": FeatureInfo(
            "FEATURE_ERROR_CODES",
            2048,
            "client",
            "code / retry / detail on error and publish_error",
            True,
            False,
            "a broker advertises it so a client can tell 'no code' from 'old broker'",
            None,
        ),
        "FEATURE_SHARD_MOVED": FeatureInfo(
            "FEATURE_SHARD_MOVED",
            4096,
            "client",
            "shard_moved as the last frame of an event stream",
            True,
            False,
            None,
            None,
        ),
        "FEATURE_UNSUPPORTED": FeatureInfo(
            "FEATURE_UNSUPPORTED",
            8192,
            "both",
            "the broker answers unknown requests with unsupported (only if the client offered it too); extension requests",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_SEQUENCE_REUSED": FeatureInfo(
            "FEATURE_SEQUENCE_REUSED",
            16384,
            "client",
            "publish_refused reason sequence_reused",
            True,
            False,
            None,
            None,
        ),
        "FEATURE_PUBLISH_PIPELINE": FeatureInfo(
            "FEATURE_PUBLISH_PIPELINE",
            32768,
            "client",
            "auth_ok.publish_window; in-order answers to acked publishes per stream",
            True,
            False,
            "not advertised when the broker's window is 0",
            None,
        ),
        "FEATURE_ATOMIC_COMMIT": FeatureInfo(
            "FEATURE_ATOMIC_COMMIT",
            65536,
            "broker",
            "commit, state_get",
            False,
            False,
            "advertised even before the fleet enables atomic_commit (commits are then refused with an error)",
            None,
        ),
        "FEATURE_STREAM_PUBLISH_WINDOW": FeatureInfo(
            "FEATURE_STREAM_PUBLISH_WINDOW",
            131072,
            "broker",
            "the publish window is per stream (otherwise per connection)",
            False,
            False,
            "with FEATURE_PUBLISH_PIPELINE",
            None,
        ),
        "FEATURE_SHARD_OWNERS": FeatureInfo(
            "FEATURE_SHARD_OWNERS",
            262144,
            "broker",
            "shard_owners",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_ACK_ON_COMMIT": FeatureInfo(
            "FEATURE_ACK_ON_COMMIT",
            524288,
            "client",
            "this connection's acked publishes are answered after the write, with offsets",
            True,
            False,
            "a client offers it only when the application asks; a broker advertises it if it honours it",
            None,
        ),
        "FEATURE_GROUP_CONSUMER": FeatureInfo(
            "FEATURE_GROUP_CONSUMER",
            1048576,
            "broker",
            "consumer, reclaim on group_poll",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_SUBSCRIPTION_LAGGED": FeatureInfo(
            "FEATURE_SUBSCRIPTION_LAGGED",
            2097152,
            "client",
            "subscription_lagged as the last frame (also needs flag EVENT_BATCH_OFFSETS)",
            False,
            False,
            None,
            "whether brokers also advertise it is unspecified (U5); we do not",
        ),
        "FEATURE_GROUP_SKIPPED": FeatureInfo(
            "FEATURE_GROUP_SKIPPED",
            4194304,
            "client",
            "skipped_before on group records",
            True,
            False,
            "brokers with groups advertise it",
            "one historical reference revision put this at bit 20; the protocol document (followed) puts it at 22",
        ),
        "FEATURE_GROUP_PUBLISHER": FeatureInfo(
            "FEATURE_GROUP_PUBLISHER",
            8388608,
            "client",
            "publisher on group records",
            True,
            False,
            "brokers with groups advertise it",
            None,
        ),
        "FEATURE_GROUP_ADMIN": FeatureInfo(
            "FEATURE_GROUP_ADMIN",
            16777216,
            "broker",
            "group_seek, group_describe, group_delete",
            False,
            False,
            "needs durable storage",
            None,
        ),
        "FEATURE_CACHE_CONDITIONAL": FeatureInfo(
            "FEATURE_CACHE_CONDITIONAL",
            33554432,
            "broker",
            "cache_put_if, cache_delete_if; a client offers it to get version on cache_value",
            False,
            True,
            None,
            None,
        ),
        "FEATURE_RECORD_TIMESTAMPS": FeatureInfo(
            "FEATURE_RECORD_TIMESTAMPS",
            67108864,
            "broker",
            "offset_for_time; a client offers it to get timestamp_micros on group records",
            False,
            True,
            None,
            None,
        ),
        "FEATURE_GROUP_CLAIM_CONTROL": FeatureInfo(
            "FEATURE_GROUP_CLAIM_CONTROL",
            134217728,
            "broker",
            "group_extend, group_dead_letter; delay_ms / attempts on group_nack; visibility_ms on group_poll",
            False,
            False,
            "needs durable storage",
            None,
        ),
        "FEATURE_PUBLISH_CONDITIONAL": FeatureInfo(
            "FEATURE_PUBLISH_CONDITIONAL",
            268435456,
            "broker",
            "publish_if; expected_offset on commit",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_STREAM_READ": FeatureInfo(
            "FEATURE_STREAM_READ",
            536870912,
            "broker",
            "stream_read -> stream_records",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_SUBSCRIBE_QUEUE": FeatureInfo(
            "FEATURE_SUBSCRIBE_QUEUE",
            1073741824,
            "broker",
            "queue_capacity on subscribe / subscribed",
            False,
            False,
            None,
            None,
        ),
        "FEATURE_INSPECT": FeatureInfo(
            "FEATURE_INSPECT",
            4294967296,
            "broker",
            "shard_inspect, subscriptions_list",
            False,
            False,
            "needs the token grant node.view:cluster:* (exactly)",
            None,
        ),
        "FEATURE_EXTENDED_BIT_33": FeatureInfo(
            "FEATURE_EXTENDED_BIT_33",
            8589934592,
            "client",
            "nothing known",
            False,
            False,
            None,
            "decision pending-feature-words: offered by the official client 0.6.2 (hi 0x2); meaning unknown; never advertised",
        ),
        "FEATURE_PUBLISH_WIDTH": FeatureInfo(
            "FEATURE_PUBLISH_WIDTH",
            17179869184,
            "broker",
            "publish_width",
            False,
            False,
            None,
            "decision publish-width: the seed names the feature without a value; the official client 0.6.2 sends publish_width only when the broker sets EXTENDED and hi bit 0x4, so bit 34 is our reading of it",
        ),
        "FEATURE_EXTENDED_BIT_35": FeatureInfo(
            "FEATURE_EXTENDED_BIT_35",
            34359738368,
            "client",
            "nothing known",
            False,
            False,
            None,
            "decision pending-feature-words: offered by the official client 0.6.2 (hi 0x8); meaning unknown; never advertised",
        ),
        "FEATURE_STREAM_DELETED": FeatureInfo(
            "FEATURE_STREAM_DELETED",
            None,
            "broker",
            "stream_deleted",
            False,
            False,
            None,
            "decision stream-deleted: seed only; no bit value is known, so it is never advertised, never offered, and stream_deleted is never sent",
        ),
    }
)

KNOWN_FEATURES_LO = 0x7FFFFFFF
KNOWN_FEATURES_HI = 0x0000000F
_LO_MASK = 0xFFFFFFFF & ~FEATURE_EXTENDED


def feature_words(features: int, *, peer_reads_hi: bool) -> tuple[int, int | None]:
    """Split a feature set into the (`*_features`, `*_features_hi`) words to send.

    The `_hi` word (and the marker) is sent only when it is non-zero and, for a
    broker, only to a client that set the marker (`peer_reads_hi`). A client always
    passes `peer_reads_hi=True`: it offers every extended bit it knows.
    """
    lo = features & _LO_MASK
    hi = (features >> 32) & 0xFFFFFFFF
    if hi and peer_reads_hi:
        return lo | FEATURE_EXTENDED, hi
    return lo, None


def features_from_words(lo: int | None, hi: int | None) -> int:
    """The feature set announced by a (`*_features`, `*_features_hi`) pair.

    Absent words mean none. The `_hi` word counts only when the first word carries
    the marker; the marker itself is kept in the result (bit 31) because
    it also says "this peer reads the `_hi` word".
    """
    value = (lo or 0) & 0xFFFFFFFF
    if value & FEATURE_EXTENDED and hi:
        value |= (hi & 0xFFFFFFFF) << 32
    return value


@dataclass(frozen=True)
class Capabilities:
    """What one peer announced on a stream: its frame flags and its features.

    Before `auth` succeeds a stream assumes ORIGINAL_V1_FLAGS and no features.
    """

    flags: int = int(ORIGINAL_V1_FLAGS)
    features: int = 0

    def has(self, flags: int = 0, features: int = 0) -> bool:
        return self.flags & flags == flags and self.features & features == features

    def has_feature(self, feature: int) -> bool:
        return self.features & feature == feature

    @property
    def reads_hi(self) -> bool:
        """The peer set the marker, so it reads a `_hi` word."""
        return bool(self.features & FEATURE_EXTENDED)
