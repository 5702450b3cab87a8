"""JSON nesting is bounded before decoding (felix_common.safejson)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_common.safejson import JsonTooDeep, check_depth, loads


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_depth_at_the_bound_passes_and_one_more_is_refused() -> None:
    assert loads(_nested(32)) is not None
    with pytest.raises(JsonTooDeep):
        loads(_nested(33))
    with pytest.raises(JsonTooDeep):
        loads(b'{"a":' * 40 + b"1" + b"}" * 40)


def test_a_hundred_thousand_levels_are_refused_without_recursion() -> None:
    with pytest.raises(JsonTooDeep):
        loads(_nested(100_000))


def test_brackets_inside_strings_do_not_count() -> None:
    text = b'{"a": "' + b"[" * 100 + b'\\"[[[", "b": ["]]]]"]}'
    assert loads(text) == {"a": "[" * 100 + '"[[[', "b": ["]]]]"]}


def test_malformed_json_is_still_a_value_error() -> None:
    with pytest.raises(ValueError):
        loads(b"{not json")


@given(st.recursive(st.none() | st.integers() | st.text(), lambda c: st.lists(c, max_size=3)))
def test_check_depth_agrees_with_the_real_depth(value: object) -> None:
    import json

    def depth(v: object) -> int:
        return 1 + max((depth(x) for x in v), default=0) if isinstance(v, list) else 0

    raw = json.dumps(value).encode()
    if depth(value) <= 5:
        check_depth(raw, 5)
    else:
        with pytest.raises(JsonTooDeep):
            check_depth(raw, 5)
