"""The resource model both sides speak: streams, caches, their names and limits.

The broker builds its catalog from these (a static YAML catalog or the live one it
syncs); the control plane validates API definitions into them, so the catalog a
broker syncs is exactly what the broker understands.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from felix_wire.names import (
    NAME_ALPHABET,
    NAME_MAX_LENGTH,
    NAME_MIN_LENGTH,
    NameKind,
    check_name,
    is_valid_name,
)

__all__ = [
    "MAX_SHARDS",
    "NAME_RULE",
    "CacheSpec",
    "Routing",
    "StreamSpec",
    "is_name",
]

# Names become path segments of permission objects ("stream:t1/ns/orders") and
# of on-disk paths, so they follow the catalogue's one name rule (spec/messages.yaml
# ``names:``, generated into felix_wire.names): every spec checks its names when
# it is made, whatever made it (a catalog file, the control plane's API or sync, code).
NAME_RULE = (
    f"names are {NAME_MIN_LENGTH}-{NAME_MAX_LENGTH} characters of {NAME_ALPHABET}, "
    "and never '.' or '..'"
)
MAX_SHARDS = 65536


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid tenant, namespace, stream, cache or group name."""
    return is_valid_name(value)


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

    def __post_init__(self) -> None:
        _check_names(self.tenant_id, self.namespace, ("stream", self.name))


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """One cache and its shard count."""

    tenant_id: str
    namespace: str
    name: str
    shards: int = 1

    def __post_init__(self) -> None:
        _check_names(self.tenant_id, self.namespace, ("cache", self.name))


def _check_names(tenant: str, namespace: str, named: tuple[NameKind, str]) -> None:
    """Raises InvalidNameError (a ValueError) for a name breaking the rule."""
    check_name("tenant", tenant)
    check_name("namespace", namespace)
    check_name(*named)
