"""Frames to send and frames received, both through the generated layer.

Nothing here knows a header layout, a flag value or a field name: messages are
built with `felix_wire.messages` classes, binary frames with `felix_wire.binary`
classes, raw bytes with `felix_wire.frame.encode_header`, and everything
received is decoded by `felix_wire.codec.decode_payload` into builtins (byte
fields as base64, like the JSON wire) before it is compared.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from felix_wire.binary import BINARY_CLASSES
from felix_wire.codec import decode_payload, encode_frame, layout_name
from felix_wire.frame import encode_header
from felix_wire.messages import MESSAGE_CLASSES, Unknown
from felix_wire.wire_errors import WireError

from .matching import match, substitute
from .model import FrameSpec, parse_int
from .schema import TranscriptError

__all__ = [
    "MAX_FILL",
    "Received",
    "build_frame",
    "decode_received",
    "encoding_problems",
    "match_frame",
    "spec_of",
]


@dataclass(frozen=True)
class Received:
    """One whole frame as read from a stream, decoded as far as it goes."""

    flags: int
    payload: bytes
    kind: str  # "message" | "unknown" (a type the catalogue lacks) | "binary" | "undecodable"
    name: str  # message type, binary layout, or "" when undecodable
    fields: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def describe(self) -> str:
        if self.kind == "undecodable":
            head = self.payload[:64].hex()
            return f"undecodable frame flags={self.flags:#06x} ({self.error}) {head}"
        body = msgspec.json.encode(self.fields).decode()
        if len(body) > 400:
            body = body[:397] + "..."
        if self.kind == "binary":
            return f"{self.name} flags={self.flags:#06x} {body}"
        return body


def decode_received(flags: int, payload: bytes) -> Received:
    try:
        decoded = decode_payload(flags, payload)
    except WireError as exc:
        return Received(flags, payload, "undecodable", "", error=str(exc))
    if isinstance(decoded, Unknown):
        return Received(flags, payload, "unknown", decoded.type, dict(decoded.raw))
    builtins = msgspec.to_builtins(decoded)
    if flags == 0:
        return Received(flags, payload, "message", str(builtins["type"]), builtins)
    # A binary layout's optional groups are present exactly when set: None = absent.
    present = {k: v for k, v in builtins.items() if v is not None}
    return Received(flags, payload, "binary", layout_name(flags), present)


MAX_FILL = 1 << 20  # the largest `{$fill: N}` a transcript may ask for


def _filled(value: Any) -> Any:
    """`value` with every `{$fill: N}` replaced by N filler bytes (as base64, the
    form of every byte field): a large payload without a page of base64."""
    if isinstance(value, list):
        return [_filled(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"$fill"}:
        size = value["$fill"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILL:
            raise TranscriptError("send", f"$fill takes a byte count from 0 to {MAX_FILL}")
        return base64.b64encode(b"z" * size).decode()
    return {k: _filled(v) for k, v in value.items()}


def build_frame(spec: FrameSpec, variables: Mapping[str, Any]) -> bytes:
    """The bytes of a frame a transcript sends."""
    body = _filled(substitute(spec.body, variables))
    if spec.kind == "message":
        cls = MESSAGE_CLASSES.get(body["type"])
        if cls is None:
            raise TranscriptError(
                "send", f"unknown message type {body['type']!r}: use raw.json for unknown types"
            )
        fields = {k: v for k, v in body.items() if k != "type"}
        try:
            return encode_frame(msgspec.convert(fields, cls))
        except (msgspec.ValidationError, WireError) as exc:
            raise TranscriptError("send", f"{body['type']}: {exc}") from None
    if spec.kind == "binary":
        try:
            frame = msgspec.convert(body["fields"], BINARY_CLASSES[body["layout"]])
            return encode_frame(frame)
        except (msgspec.ValidationError, WireError) as exc:
            raise TranscriptError("send", f"{body['layout']}: {exc}") from None
    return _raw(body)


def _raw(body: dict[str, Any]) -> bytes:
    if "hex" in body:
        data = bytes.fromhex(body["hex"])
    else:
        if "json" in body:
            payload = msgspec.json.encode(body["json"])
        else:
            payload = bytes.fromhex(body.get("payload_hex", ""))
        length = parse_int(body["length"]) if "length" in body else len(payload)
        data = encode_header(parse_int(body["flags"]), length) + payload
    cut = int(body.get("truncate", 0))
    return data[: len(data) - cut] if cut else data


def _whitespace_outside_strings(text: bytes) -> int | None:
    """The offset of the first whitespace byte outside a JSON string, or None."""
    in_string = escaped = False
    for offset, byte in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b" \t\r\n":
            return offset
    return None


def encoding_problems(received: Received) -> list[str]:
    """How a JSON message's bytes depart from the compact catalogue encoding: any
    whitespace outside strings, `type` not the first key, or catalogue fields out
    of catalogue order (keys the catalogue lacks are passed over). Empty for a
    binary frame, which has no JSON encoding."""
    if received.flags != 0:
        return []
    problems: list[str] = []
    where = _whitespace_outside_strings(received.payload)
    if where is not None:
        problems.append(f"whitespace outside strings at byte {where} (not compact JSON)")
    try:
        keys = [k for k, _ in json.loads(received.payload, object_pairs_hook=lambda kv: kv)]
    except (ValueError, TypeError):
        return [*problems, "payload is not a JSON object"]
    if not keys or keys[0] != "type":
        problems.append(f"'type' is not the first key (keys: {', '.join(keys)})")
    message = MESSAGE_CLASSES.get(received.name)
    if message is not None:
        order = {name: i for i, name in enumerate(message.__struct_fields__)}
        known = [k for k in keys if k in order]
        if known != sorted(known, key=order.__getitem__):
            problems.append(
                f"fields out of catalogue order: {', '.join(known)} "
                f"(catalogue: {', '.join(k for k in message.__struct_fields__ if k in known)})"
            )
    return problems


def match_frame(
    spec: FrameSpec, received: Received, variables: Mapping[str, Any], captures: dict[str, Any]
) -> list[str]:
    """Mismatches between an expected frame and a received one; on success the
    frame's captures are added to `captures`."""
    body = substitute(spec.body, variables)
    if received.kind == "undecodable":
        return [f"could not decode the frame: {received.error}"]
    found: dict[str, Any] = {}
    if spec.kind == "message":
        if received.kind not in ("message", "unknown") or received.name != body["type"]:
            return [f"expected message {body['type']}, got {received.describe()}"]
        expected = {k: v for k, v in body.items() if k != "type"}
        problems = match(expected, received.fields, body["type"], found)
    elif spec.kind == "binary":
        if received.kind != "binary" or received.name != body["layout"]:
            return [f"expected binary {body['layout']}, got {received.describe()}"]
        problems = []
        if "flags" in body:
            want = body["flags"]
            want = parse_int(want) if isinstance(want, str) and want.startswith("0x") else want
            problems += match(want, received.flags, f"{body['layout']}.flags", found)
        problems += match(body["fields"], received.fields, body["layout"], found)
    else:
        expected_bytes = _raw(body)
        wire = encode_header(received.flags, len(received.payload)) + received.payload
        problems = [] if wire == expected_bytes else [f"expected bytes {expected_bytes.hex()}"]
    if not problems:
        captures.update(found)
    return problems


def spec_of(received: Received) -> FrameSpec:
    """The transcript form of a received frame (the recorder's starting point)."""
    if received.kind == "message":
        return FrameSpec("message", dict(received.fields))
    if received.kind == "unknown":
        # The catalogue has no class for it, so it can only be replayed as bytes.
        return FrameSpec("raw", {"flags": received.flags, "json": dict(received.fields)})
    if received.kind == "binary":
        return FrameSpec(
            "binary", {"layout": received.name, "flags": received.flags, "fields": received.fields}
        )
    wire = encode_header(received.flags, len(received.payload)) + received.payload
    return FrameSpec("raw", {"hex": wire.hex()})
