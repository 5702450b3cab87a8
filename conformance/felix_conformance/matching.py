"""Variables, captures and field matchers.

A transcript value is matched against a decoded field:

- a literal (number, string, bool, null, list) must be equal; a mapping is
  matched key by key, and keys it does not name are ignored (decoders ignore
  unknown fields too, G3);
- a mapping whose keys all start with `$` is a matcher:
  `$any`/`$present` (present, any value), `$absent` (not present),
  `$range: [lo, hi]` (inclusive, null = open), `$regex` (full match on a string),
  `$type: integer|number|string|boolean|list|object|null` (the value's JSON
  shape, for values the broker chooses),
  `$one_of: [...]`, `$set: [...]` (the same items in any order, for unordered
  batches), `$capture: name` (store the value as `${name}` for later steps; may
  be combined with the others) and `$example` (a value the playback server
  sends in place of the matcher; ignored when matching);
- a string `${name}` is the target variable or capture `name` (keeping its
  type); `${name}` inside a longer string is replaced by its text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MissingVariableError",
    "NotConcreteError",
    "concrete",
    "is_matcher",
    "json_type",
    "match",
    "substitute",
]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.-]*)\}")
_ABSENT = object()


class MissingVariableError(KeyError):
    """A `${name}` no target variable or earlier capture defines."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"variable ${{{self.name}}} is not defined (target setup or earlier capture)"


class NotConcreteError(ValueError):
    """A matcher with no value to send in its place (playback needs `$example`)."""


def is_matcher(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(str(k).startswith("$") for k in value)


def substitute(
    value: Any, variables: Mapping[str, Any], *, unknown_as_capture: bool = False
) -> Any:
    """`value` with every `${name}` replaced.

    With `unknown_as_capture`, an undefined whole-string `${name}` becomes a
    `$capture` matcher: the playback server learns a client's token or tenant
    from what the client sends instead of being told.
    """
    if isinstance(value, str):
        whole = _VAR.fullmatch(value)
        if whole is not None:
            name = whole.group(1)
            if name in variables:
                return variables[name]
            if unknown_as_capture:
                return {"$capture": name}
            raise MissingVariableError(name)

        def text(found: re.Match[str]) -> str:
            if found.group(1) not in variables:
                raise MissingVariableError(found.group(1))
            return str(variables[found.group(1)])

        return _VAR.sub(text, value)
    if isinstance(value, list):
        return [substitute(v, variables, unknown_as_capture=unknown_as_capture) for v in value]
    if isinstance(value, dict):
        return {
            k: (
                v
                if k == "$capture"
                else substitute(v, variables, unknown_as_capture=unknown_as_capture)
            )
            for k, v in value.items()
        }
    return value


_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "list": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def json_type(value: Any) -> str:
    """The `$type` name of a decoded value."""
    if isinstance(value, bool):
        return "boolean"
    for name, kinds in _TYPES.items():
        if isinstance(value, kinds):
            return name
    return "object"


def _has_type(name: str, value: Any) -> bool:
    if name not in _TYPES:
        return False
    if isinstance(value, bool):
        return name == "boolean"
    return isinstance(value, _TYPES[name])


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _match_matcher(
    spec: dict[str, Any], actual: Any, path: str, captures: dict[str, Any]
) -> list[str]:
    if actual is _ABSENT:
        options = spec.get("$one_of", [])
        if spec.get("$absent") or any(is_matcher(o) and o.get("$absent") for o in options):
            return []
        return [f"{path}: missing (expected {_show(spec)})"]
    problems: list[str] = []
    if spec.get("$absent"):
        problems.append(f"{path}: expected absent, got {_show(actual)}")
    if "$type" in spec and not _has_type(str(spec["$type"]), actual):
        problems.append(f"{path}: expected a {spec['$type']}, got {_show(actual)}")
    if "$range" in spec:
        low, high = spec["$range"]
        if not isinstance(actual, int | float) or isinstance(actual, bool):
            problems.append(f"{path}: expected a number in [{low}, {high}], got {_show(actual)}")
        elif (low is not None and actual < low) or (high is not None and actual > high):
            problems.append(f"{path}: {actual} is outside [{low}, {high}]")
    if "$regex" in spec and not (
        isinstance(actual, str) and re.fullmatch(spec["$regex"], actual) is not None
    ):
        problems.append(f"{path}: {_show(actual)} does not match /{spec['$regex']}/")
    if "$one_of" in spec and not any(
        not match(option, actual, path, {}) for option in spec["$one_of"]
    ):
        problems.append(f"{path}: {_show(actual)} is not one of {_show(spec['$one_of'])}")
    if "$set" in spec:
        problems += _match_set(spec["$set"], actual, path)
    if "$capture" in spec and not problems:
        captures[str(spec["$capture"])] = actual
    return problems


def _match_set(expected: list[Any], actual: Any, path: str) -> list[str]:
    if not isinstance(actual, list):
        return [f"{path}: expected a list, got {_show(actual)}"]
    remaining = list(actual)
    for item in expected:
        for i, candidate in enumerate(remaining):
            if not match(item, candidate, path, {}):
                del remaining[i]
                break
        else:
            return [f"{path}: {_show(item)} not found in {_show(actual)}"]
    if remaining:
        return [f"{path}: unexpected items {_show(remaining)}"]
    return []


def match(expected: Any, actual: Any, path: str, captures: dict[str, Any]) -> list[str]:
    """The mismatches between an expected value (literal or matcher) and an actual
    decoded value; captures are stored into `captures` only where they matched."""
    if is_matcher(expected):
        return _match_matcher(expected, actual, path, captures)
    if actual is _ABSENT:
        return [f"{path}: missing (expected {_show(expected)})"]
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {_show(actual)}"]
        problems: list[str] = []
        for key, want in expected.items():
            problems += match(want, actual.get(key, _ABSENT), f"{path}.{key}", captures)
        return problems
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {_show(expected)}, got {_show(actual)}"]
        problems = []
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            problems += match(want, got, f"{path}[{i}]", captures)
        return problems
    # bool is an int in Python: true must not equal 1 on the wire.
    if expected != actual or isinstance(expected, bool) != isinstance(actual, bool):
        return [f"{path}: expected {_show(expected)}, got {_show(actual)}"]
    return []


def concrete(value: Any, variables: Mapping[str, Any]) -> Any:
    """A value to send for a transcript value that may hold matchers (playback).

    Keys whose matcher is `$absent` are left out.
    """
    if is_matcher(value):
        if "$example" in value:
            return value["$example"]
        name = value.get("$capture")
        if name is not None and name in variables:
            return variables[name]
        if "$one_of" in value:
            return concrete(value["$one_of"][0], variables)
        if "$set" in value:
            return [concrete(v, variables) for v in value["$set"]]
        if "$range" in value and value["$range"][0] is not None:
            return value["$range"][0]
        raise NotConcreteError(f"no value to send for matcher {value!r}")
    if isinstance(value, dict):
        return {
            k: concrete(v, variables)
            for k, v in value.items()
            if not (is_matcher(v) and v.get("$absent"))
        }
    if isinstance(value, list):
        return [concrete(v, variables) for v in value]
    return value
