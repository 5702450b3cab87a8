"""The resource model both sides speak: streams, caches, their names and limits.

The broker builds its catalog from these (a static YAML catalog or the live one it
syncs); the control plane validates API definitions into them, so the catalog a
broker syncs is exactly what the broker understands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "MAX_SHARDS",
    "NAME_PATTERN",
    "NAME_RULE",
    "CacheSpec",
    "Routing",
    "StreamSpec",
    "is_name",
]

# Names become path segments of permission objects ("stream:t1/ns/orders"),
# so '/', '*' and ':' must never appear in them; a conservative identifier
# alphabet keeps them safe in file names and metric labels too.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
NAME_RULE = "names are 1-128 characters of A-Z a-z 0-9 _ . -"
MAX_SHARDS = 65536


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid tenant, namespace, stream or cache name."""
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None


class Routing(StrEnum):
    """How a stream maps routing keys onto shards (§10)."""

    MODULO = "modulo"
    JUMP_HASH = "jump_hash"


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One stream: durable or in-memory, its shard count, routing and retention."""

    tenant_id: str
    namespace: str
    name: str
    durable: bool = False
    shards: int = 1
    routing: Routing = Routing.MODULO
    retention_max_age_ms: int | None = None
    retention_max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """One cache and its shard count."""

    tenant_id: str
    namespace: str
    name: str
    shards: int = 1
