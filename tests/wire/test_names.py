"""The one name rule (spec/messages.yaml `names`, generated into felix_wire.names)."""

from __future__ import annotations

import pytest
from hypothesis import given

from felix_wire import names
from felix_wire.strategies import hostile_names, valid_names


@given(valid_names(max_size=names.NAME_MAX_LENGTH))
def test_valid_names_pass_and_come_back_unchanged(name: str) -> None:
    assert names.is_valid_name(name)
    for kind in names.NAME_KINDS:
        assert names.check_name(kind, name) is name


@given(hostile_names())
def test_hostile_names_are_refused_with_kind_and_reason(name: str) -> None:
    assert names.name_problem(name) is not None
    for kind in names.NAME_KINDS:
        with pytest.raises(names.InvalidNameError) as info:
            names.check_name(kind, name)
        assert info.value.kind == kind
        assert info.value.name == name
        assert str(info.value).startswith(f"invalid {kind} name ")


@pytest.mark.parametrize(
    "name",
    [
        ".",
        "..",
        "",
        "a/b",
        "/",
        "..\\x",
        "a\x00",
        "\x00",
        "a\nb",
        "a\x7f",
        "a b",
        "\u2024",  # one dot leader
        "\u2025",  # two dot leader
        "\uff0e\uff0e",  # full-width full stops
        "a\u2215b",  # division slash
        "caf\u00e9",
        "x" * (names.NAME_MAX_LENGTH + 1),
    ],
)
def test_each_unsafe_name_is_refused(name: str) -> None:
    assert not names.is_valid_name(name)


@pytest.mark.parametrize("name", ["a", "...", ".hidden", "a..b", "A-b_c.d", "x" * 128, "0"])
def test_names_that_are_safe_segments_pass(name: str) -> None:
    assert names.is_valid_name(name)


def test_non_strings_are_refused() -> None:
    for value in (None, 1, b"a", ["a"]):
        assert names.name_problem(value) is not None
        with pytest.raises(names.InvalidNameError, match="must be a string"):
            names.check_name("tenant", value)


def test_the_error_is_a_value_error_and_shortens_long_names() -> None:
    with pytest.raises(ValueError) as info:
        names.check_name("cache", "y" * 5000)
    assert len(str(info.value)) < 200
    assert "longer than 128" in str(info.value)
