"""Definitions the control plane stores, and their validation.

Every definition arrives as JSON over the API. Validation happens here, before
anything touches the store, so an invalid definition is refused whole with a
message naming the bad field and nothing is written.

Streams and caches validate into the broker's own :class:`StreamSpec` /
:class:`CacheSpec` shapes (plus the control-plane-only ``consistency``), so the
catalog a broker syncs is exactly what the broker understands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from felix_broker.catalog import MAX_SHARDS, CacheSpec, Routing, StreamSpec
from felix_wire.names import name_problem

__all__ = [
    "CONSISTENCIES",
    "DURABILITIES",
    "ApiError",
    "cache_body",
    "cache_spec",
    "check_name",
    "stream_body",
    "stream_spec",
    "validate_cache",
    "validate_stream",
]


DURABILITIES = ("memory", "durable")
# Stored and served with the stream; a standalone broker has one replica, so it
# only matters to a clustered broker.
CONSISTENCIES = ("leader", "quorum")


class ApiError(Exception):
    """A request refused with an HTTP status and a machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_definition", message)


def check_name(value: object, what: str) -> str:
    # The catalogue's one name rule (felix_wire.names): names become permission
    # path segments and on-disk folders, so '/', '*', ':', '.' and '..' never get in.
    problem = name_problem(value)
    if problem is not None:
        raise bad_request(f"{what}: {problem}")
    assert isinstance(value, str)
    return value


def _object(body: object, allowed: frozenset[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise bad_request(f"{what}: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(
            f"{what}: unknown field {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )
    return body


def _int(value: object, what: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{what}: expected an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise bad_request(f"{what}: must be {bound}, got {value}")
    return value


def _choice(value: object, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise bad_request(f"{what}: expected one of {', '.join(choices)}, got {value!r}")
    assert isinstance(value, str)
    return value


_STREAM_FIELDS = frozenset({"name", "shards", "durability", "retention", "consistency", "routing"})
_RETENTION_FIELDS = frozenset({"max_age_ms", "max_bytes"})


@dataclass(frozen=True, slots=True)
class StreamDefinition:
    spec: StreamSpec
    consistency: str


def validate_stream(tenant: str, namespace: str, body: object) -> StreamDefinition:
    """A stream definition from an API body; raise :class:`ApiError` (400) if invalid."""
    fields = _object(body, _STREAM_FIELDS, "stream")
    name = check_name(fields.get("name"), "stream.name")
    shards = _int(fields.get("shards", 1), "stream.shards", minimum=1, maximum=MAX_SHARDS)
    durability = _choice(fields.get("durability", "memory"), DURABILITIES, "stream.durability")
    consistency = _choice(fields.get("consistency", "leader"), CONSISTENCIES, "stream.consistency")
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
    )
    return StreamDefinition(spec, consistency)


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
    }


def stream_spec(tenant: str, namespace: str, body: Mapping[str, Any]) -> StreamSpec:
    """The broker's spec from a stored body (already validated when it was stored)."""
    return validate_stream(tenant, namespace, body).spec


def validate_cache(tenant: str, namespace: str, body: object) -> CacheSpec:
    fields = _object(body, frozenset({"name", "shards"}), "cache")
    name = check_name(fields.get("name"), "cache.name")
    shards = _int(fields.get("shards", 1), "cache.shards", minimum=1, maximum=MAX_SHARDS)
    return CacheSpec(tenant_id=tenant, namespace=namespace, name=name, shards=shards)


def cache_body(spec: CacheSpec) -> dict[str, Any]:
    return {"name": spec.name, "shards": spec.shards}


def cache_spec(tenant: str, namespace: str, body: Mapping[str, Any]) -> CacheSpec:
    return validate_cache(tenant, namespace, body)
