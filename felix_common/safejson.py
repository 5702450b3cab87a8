"""JSON from strangers: the nesting depth is bounded before any decoder sees it.

Python's decoders recurse once per nesting level, so a body of ``[[[[...`` a few
hundred kilobytes long raises ``RecursionError`` (or worse) inside the decoder.
:func:`loads` measures the depth first, with C-speed passes over the bytes
(strings removed, everything but brackets dropped), and refuses a document
deeper than ``max_depth`` with :class:`JsonTooDeep` before decoding it.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["DEFAULT_MAX_DEPTH", "JsonTooDeep", "check_depth", "loads"]

DEFAULT_MAX_DEPTH = 32

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than allowed."""


def check_depth(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise :class:`JsonTooDeep` if ``raw`` nests deeper than ``max_depth``.

    Brackets inside strings do not count. A malformed document may pass (the
    decoder then refuses it); a deep one never does.
    """
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        if byte in b"[{":
            depth += 1
            if depth > max_depth:
                raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels")
        else:
            depth -= 1


def loads(raw: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """``json.loads`` after :func:`check_depth`; raises ``ValueError`` (incl. JsonTooDeep)."""
    data = raw.encode() if isinstance(raw, str) else raw
    check_depth(data, max_depth)
    return json.loads(data)
