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
    "MAX_REPLICATION_FACTOR",
    "MAX_SHARDS",
    "NAME_RULE",
    "CacheSpec",
    "Consistency",
    "Routing",
    "StreamSpec",
    "check_replication",
    "is_name",
    "parse_consistency",
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
# A replica set is every broker holding a shard's log, the leader included. 1 is a
# shard without replicas; 3 survives the loss of one broker (a majority is 2); more
# is allowed (5 survives two). The cap bounds a ship's fan-out per write.
MAX_REPLICATION_FACTOR = 9


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid tenant, namespace, stream, cache or group name."""
    return is_valid_name(value)


class Routing(StrEnum):
    """How a stream maps routing keys onto shards (§10)."""

    MODULO = "modulo"
    JUMP_HASH = "jump_hash"


class Consistency(StrEnum):
    """What a write's acknowledgement promises (the README's consistency table): `leader`, once the
    leader took it (replicas catch up asynchronously); `quorum`, once a majority of the
    replica set, the leader included, holds it durably (readers stop at that mark)."""

    LEADER = "leader"
    QUORUM = "quorum"


def parse_consistency(value: object) -> Consistency:
    """`leader`/`quorum`, also in upstream's spelling `Leader`/`Quorum`. Raises
    ValueError naming the levels for anything else (never a default for an unknown
    level: a broker that cannot keep a promise refuses it)."""
    if isinstance(value, str):
        for level in Consistency:
            if value in (level.value, level.value.capitalize()):
                return level
    raise ValueError(f"consistency must be Leader or Quorum, got {value!r}")


def check_replication(replication_factor: object, consistency: Consistency) -> None:
    """Raises ValueError for a replication factor outside 1..MAX_REPLICATION_FACTOR."""
    if (
        isinstance(replication_factor, bool)
        or not isinstance(replication_factor, int)
        or not 1 <= replication_factor <= MAX_REPLICATION_FACTOR
    ):
        raise ValueError(
            f"replication_factor must be an integer between 1 and {MAX_REPLICATION_FACTOR}"
            f", got {replication_factor!r}"
        )
    if not isinstance(consistency, Consistency):
        raise ValueError(f"consistency must be Leader or Quorum, got {consistency!r}")


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """One stream: durable or in-memory, its shard count, routing and retention, and
    its replica set's size and consistency level. A Quorum stream is durable (its
    acknowledgement promises records on disk on a majority)."""

    tenant_id: str
    namespace: str
    name: str
    durable: bool = False
    shards: int = 1
    routing: Routing = Routing.MODULO
    retention_max_age_ms: int | None = None
    retention_max_bytes: int | None = None
    replication_factor: int = 1
    consistency: Consistency = Consistency.LEADER

    def __post_init__(self) -> None:
        _check_names(self.tenant_id, self.namespace, ("stream", self.name))
        check_replication(self.replication_factor, self.consistency)
        if self.consistency is Consistency.QUORUM and not self.durable:
            raise ValueError(
                f"stream {self.name!r}: Quorum consistency needs a durable stream "
                "(its acknowledgement promises the record on disk on a majority)"
            )

    @property
    def replicated(self) -> bool:
        """Whether a fleet runs this stream's writes through replication: a durable
        stream with RF > 1, Quorum or Leader (acknowledged at the leader's own disk,
        shipped after). An in-memory Leader stream keeps one copy whatever its RF."""
        return self.durable and self.replication_factor > 1


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """One cache: its shard count, its replica set's size and consistency level."""

    tenant_id: str
    namespace: str
    name: str
    shards: int = 1
    replication_factor: int = 1
    consistency: Consistency = Consistency.LEADER

    def __post_init__(self) -> None:
        _check_names(self.tenant_id, self.namespace, ("cache", self.name))
        check_replication(self.replication_factor, self.consistency)

    @property
    def replicated(self) -> bool:
        """Whether a fleet runs this cache's writes through replication (Quorum, RF > 1)."""
        return self.consistency is Consistency.QUORUM and self.replication_factor > 1


def _check_names(tenant: str, namespace: str, named: tuple[NameKind, str]) -> None:
    """Raises InvalidNameError (a ValueError) for a name breaking the rule."""
    check_name("tenant", tenant)
    check_name("namespace", namespace)
    check_name(*named)
