"""Nesting depth is bounded before any JSON decoder sees a payload (issue 20, finding 2)."""

from __future__ import annotations

import pytest

from felix_wire import wire_errors as we
from felix_wire.codec import decode_payload
from felix_wire.frame import MAX_JSON_DEPTH, PREAUTH_MAX_FRAME_BYTES
from felix_wire.messages import Unknown, decode_message, json_too_deep


def nested(depth: int, kind: str = "auth") -> bytes:
    return b'{"type":"' + kind.encode() + b'","x":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("kind", ["auth", "publish", "no_such_type"])
def test_a_1000_deep_2kb_frame_is_malformed_json_not_a_recursion_error(kind: str) -> None:
    payload = nested(1000, kind)
    assert len(payload) < 2100 < PREAUTH_MAX_FRAME_BYTES
    with pytest.raises(we.MalformedJsonError, match="nested deeper than"):
        decode_payload(0, payload)
    with pytest.raises(we.MalformedJsonError):
        decode_message(memoryview(payload))


def test_objects_count_as_levels_too() -> None:
    deep = b'{"type":"auth","x":' + b'{"a":' * 200 + b"1" + b"}" * 200 + b"}"
    with pytest.raises(we.MalformedJsonError, match="nested deeper than"):
        decode_message(deep)


def test_depth_at_the_limit_still_decodes() -> None:
    # The outer object is level 1, so the field may nest MAX_JSON_DEPTH - 1 more.
    payload = nested(MAX_JSON_DEPTH - 1, "no_such_type")
    assert not json_too_deep(payload)
    assert isinstance(decode_message(payload), Unknown)
    assert json_too_deep(nested(MAX_JSON_DEPTH, "no_such_type"))


def test_brackets_inside_strings_do_not_count() -> None:
    text = b"[" * 5000 + b'\\"{' * 100
    payload = b'{"type":"no_such_type","x":"' + text + b'"}'
    assert not json_too_deep(payload)
    assert isinstance(decode_message(payload), Unknown)


def test_many_shallow_brackets_are_not_deep() -> None:
    payload = b'{"type":"no_such_type","x":[' + b",".join([b"[1]"] * 5000) + b"]}"
    assert not json_too_deep(payload)
    assert isinstance(decode_message(payload), Unknown)
