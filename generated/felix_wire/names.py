# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""The one name rule for tenant, namespace, stream, cache, group names.

A tenant, namespace, stream, cache or group name: 1 to 128 characters of ASCII letters, digits, `_`, `-` and `.`, and never `.` or `..` (which would walk the folder tree as a path segment).

Names are compared byte for byte: `Orders` and `orders` are two names (a broker's data directory must be on a case-sensitive file system).

A name may start with a dot (`.hidden`); only the two names that mean a folder itself or its parent are refused.

Every entry point checks a name here before using it (`check_name` raises
`InvalidNameError`, a ValueError that names the kind, the value and the
problem); a name that passes is always a safe single on-disk path segment.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "NAME_KINDS",
    "NAME_ALPHABET",
    "NAME_MIN_LENGTH",
    "NAME_MAX_LENGTH",
    "RESERVED_NAMES",
    "NameKind",
    "InvalidNameError",
    "name_problem",
    "is_valid_name",
    "check_name",
]

NameKind = Literal["tenant", "namespace", "stream", "cache", "group"]
NAME_KINDS: tuple[NameKind, ...] = (
    "tenant",
    "namespace",
    "stream",
    "cache",
    "group",
)
NAME_ALPHABET = "A-Za-z0-9_.-"
NAME_MIN_LENGTH = 1
NAME_MAX_LENGTH = 128
RESERVED_NAMES = frozenset(
    {
        ".",
        "..",
    }
)

_CHARS = re.compile("[A-Za-z0-9_.-]*", re.ASCII)


class InvalidNameError(ValueError):
    """A name breaks the rule; says which kind of name, the value and why."""

    def __init__(self, kind: str, name: object, problem: str) -> None:
        shown = (
            repr(name) if not isinstance(name, str) or len(name) <= 64 else repr(name[:64]) + "..."
        )
        super().__init__(f"invalid {kind} name {shown}: {problem}")
        self.kind = kind
        self.name = name
        self.problem = problem


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid name, or None when it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if len(name) < NAME_MIN_LENGTH:
        return (
            "must not be empty"
            if NAME_MIN_LENGTH == 1
            else f"is shorter than {NAME_MIN_LENGTH} characters"
        )
    if len(name) > NAME_MAX_LENGTH:
        return f"is longer than {NAME_MAX_LENGTH} characters"
    if _CHARS.fullmatch(name) is None:
        return f"may only contain {NAME_ALPHABET}"
    if name in RESERVED_NAMES:
        return "is reserved (it would name a folder itself or its parent)"
    return None


def is_valid_name(name: object) -> bool:
    """True when `name` follows the rule."""
    return name_problem(name) is None


def check_name(kind: NameKind, name: object) -> str:
    """`name` itself when it follows the rule; raises InvalidNameError otherwise."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidNameError(kind, name, problem)
    assert isinstance(name, str)
    return name
