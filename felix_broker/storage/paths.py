"""The only place a catalog name becomes part of an on-disk path.

Layout under the data directory (``durable_storage_dir``)::

    <root>/<tenant>/<namespace>/<stream>/<shard>/          stream shard logs
    <root>/@cache/<tenant>/<namespace>/<cache>/<shard>/    log-backed cache shards
    <root>/@groups/<tenant>/<namespace>/<stream>/<shard>/  consumer-group logs

Every name is checked against the one name rule of the catalogue
(:mod:`felix_wire.names`) before it becomes a segment, so ``.``, ``..``,
separators, NUL and the rest are refused with :class:`~felix_wire.names.InvalidNameError`;
and the joined path is checked to stay below the root (:class:`UnsafePathError`)
even if the rule were ever loosened. ``@`` is outside the name alphabet, so the
``@cache`` and ``@groups`` areas can never collide with a tenant's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from felix_wire.names import NameKind, check_name

__all__ = ["AREAS", "Area", "UnsafePathError", "log_dir", "name_segment", "under_root"]

Area = Literal["streams", "cache", "groups"]

# The folder of each area below the root ("" = the root itself) and the kind of
# its third name.
AREAS: dict[Area, tuple[str, NameKind]] = {
    "streams": ("", "stream"),
    "cache": ("@cache", "cache"),
    "groups": ("@groups", "stream"),
}


class UnsafePathError(ValueError):
    """A path built from names would leave the data directory."""

    def __init__(self, root: Path, path: Path) -> None:
        super().__init__(f"{path} is not below the data directory {root}")
        self.root = root
        self.path = path


def name_segment(kind: NameKind, name: str) -> str:
    """``name`` as one path segment; raises InvalidNameError when it breaks the rule."""
    return check_name(kind, name)


def under_root(root: Path, *segments: str) -> Path:
    """``root`` joined with ``segments``, refused unless strictly below ``root``.

    The check is lexical (``..`` and ``.`` are folded, symbolic links are not
    followed): an operator may mount or link parts of the data directory
    elsewhere on purpose.
    """
    path = root.joinpath(*segments)
    base = os.path.abspath(root)
    full = os.path.abspath(path)
    if full == base or os.path.commonpath([base, full]) != base:
        raise UnsafePathError(root, path)
    for segment in segments:
        if not segment or os.sep in segment or (os.altsep and os.altsep in segment):
            raise UnsafePathError(root, path)
    return path


def log_dir(root: Path, area: Area, tenant: str, namespace: str, name: str, shard: int) -> Path:
    """The folder of one shard's log in ``area``; names are checked on the way."""
    folder, kind = AREAS[area]
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"invalid shard {shard!r}")
    segments = [
        name_segment("tenant", tenant),
        name_segment("namespace", namespace),
        name_segment(kind, name),
        str(shard),
    ]
    if folder:
        segments.insert(0, folder)
    return under_root(root, *segments)
