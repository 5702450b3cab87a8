# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Frame flag bits: which payload layout a frame uses and how it is modified.

A receiver rejects a frame carrying any bit it does not know; it never masks
unknown bits off. `layout_of` is the one check every receiver runs on a header's
flags before decoding a payload.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from .wire_errors import IllegalFlagCombinationError, UnknownFlagsError

__all__ = [
    "Flag",
    "FlagInfo",
    "FLAG_INFO",
    "KNOWN_FLAGS",
    "LAYOUT_FLAGS",
    "ORIGINAL_V1_FLAGS",
    "LEGAL_FLAGS",
    "LAYOUT_BY_FLAG",
    "layout_of",
    "explain_flags",
]


class Flag(enum.IntFlag):
    BINARY_PUBLISH_BATCH = 0x0001
    """binary publish batch"""
    BINARY_EVENT_BATCH = 0x0002
    """legacy per-subscriber event batch carrying a u64 subscription_id"""
    BINARY_EVENT_BATCH_SHARED = 0x0004
    """encode-once event batch without a subscription id"""
    BINARY_PUBLISH_ACKED = 0x0008
    """request_id + ack_mode prefix; answered with a binary ack"""
    BINARY_PUBLISH_ACK = 0x0010
    """binary publish ack"""
    EVENT_BATCH_OFFSETS = 0x0020
    """base_offset on every batch; also what makes start_offset/live_offset and resumable subscribes possible"""
    BINARY_PUBLISH_KEYED = 0x0040
    """routing key prefix"""
    BINARY_PUBLISH_ACK_OWNER = 0x0080
    """owner node id, address and generation of a forwarded batch"""
    BINARY_PUBLISH_IDEMPOTENT = 0x0100
    """producer_id + sequence prefix; answered in JSON (publish_ok / publish_error / publish_refused)"""
    BINARY_PUBLISH_ACK_CODE = 0x0200
    """u16 error code + u8 retry class on a failed ack"""
    BINARY_PUBLISH_ACK_DETAIL = 0x0400
    """reason + retry_after_ms on a failed ack"""
    EVENT_BATCH_SKIPPED = 0x0800
    """skipped_before: offsets directly below base_offset that hold no event"""
    BINARY_PUBLISH_ACK_OFFSET = 0x1000
    """offset of the batch's first record on a successful ack; offered by a client it also enables offset on JSON publish_ok"""
    EVENT_BATCH_PUBLISHER = 0x2000
    """the principal (token sub) that published the batch"""
    EVENT_BATCH_TIMESTAMPS = 0x4000
    """per-event append time in microseconds since the Unix epoch"""


@dataclass(frozen=True)
class FlagInfo:
    flag: Flag
    kind: str  # "layout" selects a payload layout; "modifier" changes one
    layout: str | None
    modifies: tuple[Flag, ...]
    requires: tuple[Flag, ...]
    excludes: tuple[Flag, ...]
    direction: str  # which way frames carrying the bit travel
    advertised_by: str  # whose advertisement a sender must have seen first


FLAG_INFO: Mapping[Flag, FlagInfo] = MappingProxyType(
    {
        Flag.BINARY_PUBLISH_BATCH: FlagInfo(
            Flag.BINARY_PUBLISH_BATCH,
            "layout",
            "publish_batch",
            (),
            (),
            (),
            "client_to_broker",
            "broker",
        ),
        Flag.BINARY_EVENT_BATCH: FlagInfo(
            Flag.BINARY_EVENT_BATCH,
            "layout",
            "event_batch_legacy",
            (),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_EVENT_BATCH_SHARED: FlagInfo(
            Flag.BINARY_EVENT_BATCH_SHARED,
            "layout",
            "event_batch_shared",
            (),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_PUBLISH_ACKED: FlagInfo(
            Flag.BINARY_PUBLISH_ACKED,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_BATCH,),
            (),
            (),
            "client_to_broker",
            "broker",
        ),
        Flag.BINARY_PUBLISH_ACK: FlagInfo(
            Flag.BINARY_PUBLISH_ACK,
            "layout",
            "publish_ack",
            (),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.EVENT_BATCH_OFFSETS: FlagInfo(
            Flag.EVENT_BATCH_OFFSETS,
            "modifier",
            None,
            (
                Flag.BINARY_EVENT_BATCH,
                Flag.BINARY_EVENT_BATCH_SHARED,
            ),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_PUBLISH_KEYED: FlagInfo(
            Flag.BINARY_PUBLISH_KEYED,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_BATCH,),
            (),
            (),
            "client_to_broker",
            "broker",
        ),
        Flag.BINARY_PUBLISH_ACK_OWNER: FlagInfo(
            Flag.BINARY_PUBLISH_ACK_OWNER,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_ACK,),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_PUBLISH_IDEMPOTENT: FlagInfo(
            Flag.BINARY_PUBLISH_IDEMPOTENT,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_BATCH,),
            (Flag.BINARY_PUBLISH_ACKED,),
            (),
            "client_to_broker",
            "broker",
        ),
        Flag.BINARY_PUBLISH_ACK_CODE: FlagInfo(
            Flag.BINARY_PUBLISH_ACK_CODE,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_ACK,),
            (),
            (Flag.BINARY_PUBLISH_ACK_OFFSET,),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_PUBLISH_ACK_DETAIL: FlagInfo(
            Flag.BINARY_PUBLISH_ACK_DETAIL,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_ACK,),
            (Flag.BINARY_PUBLISH_ACK_CODE,),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.EVENT_BATCH_SKIPPED: FlagInfo(
            Flag.EVENT_BATCH_SKIPPED,
            "modifier",
            None,
            (
                Flag.BINARY_EVENT_BATCH,
                Flag.BINARY_EVENT_BATCH_SHARED,
            ),
            (Flag.EVENT_BATCH_OFFSETS,),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.BINARY_PUBLISH_ACK_OFFSET: FlagInfo(
            Flag.BINARY_PUBLISH_ACK_OFFSET,
            "modifier",
            None,
            (Flag.BINARY_PUBLISH_ACK,),
            (),
            (Flag.BINARY_PUBLISH_ACK_CODE,),
            "broker_to_client",
            "client",
        ),
        Flag.EVENT_BATCH_PUBLISHER: FlagInfo(
            Flag.EVENT_BATCH_PUBLISHER,
            "modifier",
            None,
            (
                Flag.BINARY_EVENT_BATCH,
                Flag.BINARY_EVENT_BATCH_SHARED,
            ),
            (),
            (),
            "broker_to_client",
            "client",
        ),
        Flag.EVENT_BATCH_TIMESTAMPS: FlagInfo(
            Flag.EVENT_BATCH_TIMESTAMPS,
            "modifier",
            None,
            (
                Flag.BINARY_EVENT_BATCH,
                Flag.BINARY_EVENT_BATCH_SHARED,
            ),
            (),
            (),
            "broker_to_client",
            "client",
        ),
    }
)

KNOWN_FLAGS = 0x7FFF
LAYOUT_FLAGS = 0x0017
ORIGINAL_V1_FLAGS = (
    Flag.BINARY_PUBLISH_BATCH | Flag.BINARY_EVENT_BATCH | Flag.BINARY_EVENT_BATCH_SHARED
)

# Every flag value a frame may carry, per layout, as the flag rules allow.
LAYOUT_BY_FLAG: Mapping[int, str] = MappingProxyType(
    {
        0x0001: "publish_batch",
        0x0009: "publish_batch",
        0x0041: "publish_batch",
        0x0049: "publish_batch",
        0x0109: "publish_batch",
        0x0149: "publish_batch",
        0x0010: "publish_ack",
        0x0090: "publish_ack",
        0x0210: "publish_ack",
        0x0290: "publish_ack",
        0x0610: "publish_ack",
        0x0690: "publish_ack",
        0x1010: "publish_ack",
        0x1090: "publish_ack",
        0x0002: "event_batch_legacy",
        0x0022: "event_batch_legacy",
        0x0822: "event_batch_legacy",
        0x2002: "event_batch_legacy",
        0x2022: "event_batch_legacy",
        0x2822: "event_batch_legacy",
        0x4002: "event_batch_legacy",
        0x4022: "event_batch_legacy",
        0x4822: "event_batch_legacy",
        0x6002: "event_batch_legacy",
        0x6022: "event_batch_legacy",
        0x6822: "event_batch_legacy",
        0x0004: "event_batch_shared",
        0x0024: "event_batch_shared",
        0x0824: "event_batch_shared",
        0x2004: "event_batch_shared",
        0x2024: "event_batch_shared",
        0x2824: "event_batch_shared",
        0x4004: "event_batch_shared",
        0x4024: "event_batch_shared",
        0x4824: "event_batch_shared",
        0x6004: "event_batch_shared",
        0x6024: "event_batch_shared",
        0x6824: "event_batch_shared",
    }
)
LEGAL_FLAGS = frozenset(LAYOUT_BY_FLAG)


def layout_of(flags: int) -> str | None:
    """The payload layout a frame's flags select: None for a JSON message (flags 0).

    Raises UnknownFlagsError for an unknown bit and IllegalFlagCombinationError for
    known bits that describe no legal layout.
    """
    if flags == 0:
        return None
    layout = LAYOUT_BY_FLAG.get(flags)
    if layout is not None:
        return layout
    unknown = flags & ~KNOWN_FLAGS
    if unknown:
        raise UnknownFlagsError(flags, unknown)
    raise IllegalFlagCombinationError(flags, explain_flags(flags))


def explain_flags(flags: int) -> str:
    """Why a combination of known bits is illegal (for error messages)."""
    present = [f for f in Flag if flags & f]
    layouts = [f for f in present if FLAG_INFO[f].kind == "layout"]
    if not layouts:
        return "no layout bit is set"
    if len(layouts) > 1:
        return "more than one layout bit: " + ", ".join(str(f.name) for f in layouts)
    layout = layouts[0]
    for f in present:
        info = FLAG_INFO[f]
        if info.kind != "modifier":
            continue
        if layout not in info.modifies:
            return f"{f.name} does not modify {layout.name}"
        for needed in info.requires:
            if not flags & needed:
                return f"{f.name} requires {needed.name}"
        for other in info.excludes:
            if flags & other:
                return f"{f.name} excludes {other.name}"
    return "not a legal combination"
