"""The catalog sync feed: what the control plane serves and a broker follows.

Two read-only endpoints under the broker sync token:

* ``GET /v1/catalog/snapshot``: a :class:`Snapshot`, every tenant, namespace,
  stream and cache at sequence ``seq``;
* ``GET /v1/catalog/changes?since=N&wait=S``: a :class:`ChangePage`, the changes
  after ``N`` (long-polled up to ``S`` seconds); ``reset`` means the control plane
  no longer has them and the broker reloads the snapshot.

A stream or cache travels as its definition's JSON body (:func:`stream_body`,
:func:`cache_body`), the same body the API stores and answers; both sides turn it
into a spec with the same validator, so they cannot disagree about a field.
Bodies that do not validate raise :class:`InvalidDefinition` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import msgspec

from felix_common.catalog import (
    MAX_REPLICATION_FACTOR,
    MAX_SHARDS,
    CacheSpec,
    Consistency,
    Routing,
    StreamSpec,
    parse_consistency,
)
from felix_wire.names import name_problem

__all__ = [
    "CHANGES_PATH",
    "CONSISTENCIES",
    "DURABILITIES",
    "SNAPSHOT_PATH",
    "Change",
    "ChangePage",
    "FeedError",
    "InvalidDefinition",
    "Resource",
    "Snapshot",
    "StreamDefinition",
    "cache_body",
    "cache_spec",
    "check_name",
    "decode_changes",
    "decode_snapshot",
    "jwks_path",
    "stream_body",
    "stream_spec",
    "validate_cache",
    "validate_stream",
]

SNAPSHOT_PATH = "/v1/catalog/snapshot"
CHANGES_PATH = "/v1/catalog/changes"

DURABILITIES = ("memory", "durable")
# Stored and served with the stream; a standalone broker has one replica, so it
# only matters to a clustered broker.
CONSISTENCIES = tuple(level.value for level in Consistency)


def jwks_path(tenant: str) -> str:
    """Where a tenant's public signing keys are served (no credentials needed)."""
    return f"/v1/tenants/{quote(tenant, safe='')}/.well-known/jwks.json"


# -- the pages ------------------------------------------------------------------------


class Resource(msgspec.Struct, frozen=True):
    """One catalog entry of a snapshot: ``kind`` namespace, stream or cache."""

    kind: str
    tenant: str
    namespace: str
    name: str
    body: dict[str, Any]


class Snapshot(msgspec.Struct, frozen=True):
    seq: int
    tenants: list[str]
    resources: list[Resource]


class Change(msgspec.Struct, frozen=True):
    """One change: ``kind`` tenant, namespace, stream, cache or jwks (a key change)."""

    seq: int
    op: Literal["put", "delete"]
    kind: str
    tenant: str
    namespace: str
    name: str
    body: dict[str, Any] | None = None


class ChangePage(msgspec.Struct, frozen=True):
    seq: int  # the newest sequence number the control plane has
    reset: bool
    changes: list[Change]


class FeedError(ValueError):
    """A feed document that is not shaped like one."""


def decode_snapshot(raw: bytes) -> Snapshot:
    try:
        return msgspec.json.decode(raw, type=Snapshot)
    except msgspec.DecodeError as exc:
        raise FeedError(f"catalog snapshot: {exc}") from None


def decode_changes(raw: bytes) -> ChangePage:
    try:
        return msgspec.json.decode(raw, type=ChangePage)
    except msgspec.DecodeError as exc:
        raise FeedError(f"catalog changes: {exc}") from None


# -- definitions ------------------------------------------------------------------------


class InvalidDefinition(ValueError):
    """A stream or cache definition refused whole; the message names the bad field."""


def check_name(value: object, what: str) -> str:
    # The catalogue's one name rule (felix_wire.names): names become permission
    # path segments and on-disk folders, so '/', '*', ':', '.' and '..' never get in.
    problem = name_problem(value)
    if problem is not None:
        raise InvalidDefinition(f"{what}: {problem}")
    assert isinstance(value, str)
    return value


def _object(body: object, allowed: frozenset[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidDefinition(f"{what}: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidDefinition(
            f"{what}: unknown field {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )
    return body


def _int(value: object, what: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDefinition(f"{what}: expected an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidDefinition(f"{what}: must be {bound}, got {value}")
    return value


def _choice(value: object, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise InvalidDefinition(f"{what}: expected one of {', '.join(choices)}, got {value!r}")
    assert isinstance(value, str)
    return value


_STREAM_FIELDS = frozenset(
    {"name", "shards", "durability", "retention", "consistency", "routing", "replication_factor"}
)
_CACHE_FIELDS = frozenset({"name", "shards", "consistency", "replication_factor"})


def _replication(fields: Mapping[str, Any], what: str) -> tuple[int, Consistency]:
    """The replica set's size (1 default) and consistency level (leader default)."""
    factor = _int(
        fields.get("replication_factor", 1),
        f"{what}.replication_factor",
        minimum=1,
        maximum=MAX_REPLICATION_FACTOR,
    )
    try:
        consistency = parse_consistency(fields.get("consistency", Consistency.LEADER.value))
    except ValueError as exc:
        raise InvalidDefinition(f"{what}.consistency: {exc}") from None
    return factor, consistency


_RETENTION_FIELDS = frozenset({"max_age_ms", "max_bytes"})


@dataclass(frozen=True, slots=True)
class StreamDefinition:
    spec: StreamSpec
    consistency: str


def validate_stream(tenant: str, namespace: str, body: object) -> StreamDefinition:
    """A stream definition from a JSON body; raise :class:`InvalidDefinition` if invalid."""
    fields = _object(body, _STREAM_FIELDS, "stream")
    name = check_name(fields.get("name"), "stream.name")
    shards = _int(fields.get("shards", 1), "stream.shards", minimum=1, maximum=MAX_SHARDS)
    durability = _choice(fields.get("durability", "memory"), DURABILITIES, "stream.durability")
    factor, consistency = _replication(fields, "stream")
    if consistency is Consistency.QUORUM and durability != "durable":
        raise InvalidDefinition(
            "stream.consistency: Quorum needs durability durable (its acknowledgement "
            "promises the record on disk on a majority of the replica set)"
        )
    routing = _choice(
        fields.get("routing", Routing.MODULO.value),
        tuple(r.value for r in Routing),
        "stream.routing",
    )
    retention = _object(fields.get("retention") or {}, _RETENTION_FIELDS, "stream.retention")
    max_age = retention.get("max_age_ms")
    max_bytes = retention.get("max_bytes")
    spec = StreamSpec(
        tenant_id=tenant,
        namespace=namespace,
        name=name,
        durable=durability == "durable",
        shards=shards,
        routing=Routing(routing),
        retention_max_age_ms=None
        if max_age is None
        else _int(max_age, "stream.retention.max_age_ms", minimum=1),
        retention_max_bytes=None
        if max_bytes is None
        else _int(max_bytes, "stream.retention.max_bytes", minimum=1),
        replication_factor=factor,
        consistency=consistency,
    )
    return StreamDefinition(spec, consistency.value)


def stream_body(definition: StreamDefinition) -> dict[str, Any]:
    """The stored (and served) JSON form of a stream."""
    spec = definition.spec
    return {
        "name": spec.name,
        "shards": spec.shards,
        "durability": "durable" if spec.durable else "memory",
        "retention": {
            "max_age_ms": spec.retention_max_age_ms,
            "max_bytes": spec.retention_max_bytes,
        },
        "consistency": definition.consistency,
        "routing": spec.routing.value,
        "replication_factor": spec.replication_factor,
    }


def stream_spec(tenant: str, namespace: str, body: Mapping[str, Any]) -> StreamSpec:
    """The broker's spec from a stored body (already validated when it was stored)."""
    return validate_stream(tenant, namespace, body).spec


def validate_cache(tenant: str, namespace: str, body: object) -> CacheSpec:
    fields = _object(body, _CACHE_FIELDS, "cache")
    name = check_name(fields.get("name"), "cache.name")
    shards = _int(fields.get("shards", 1), "cache.shards", minimum=1, maximum=MAX_SHARDS)
    factor, consistency = _replication(fields, "cache")
    return CacheSpec(
        tenant_id=tenant,
        namespace=namespace,
        name=name,
        shards=shards,
        replication_factor=factor,
        consistency=consistency,
    )


def cache_body(spec: CacheSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "shards": spec.shards,
        "consistency": spec.consistency.value,
        "replication_factor": spec.replication_factor,
    }


def cache_spec(tenant: str, namespace: str, body: Mapping[str, Any]) -> CacheSpec:
    return validate_cache(tenant, namespace, body)
