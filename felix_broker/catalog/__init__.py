"""What exists on this broker: tenants, namespaces, streams and caches.

The specs themselves (:class:`StreamSpec`, :class:`CacheSpec`, :class:`Routing`,
the name rule and limits) are the shared resource model of
:mod:`felix_common.catalog`, re-exported here as the broker's names for them.

The broker core asks only the small :class:`Catalog` protocol, so the static
catalog read from the ``catalog:`` section of the YAML config can later be
replaced by a live control-plane catalog without touching the core.

YAML shape (every key optional except the names)::

    catalog:
      tenants:
        t1:
          namespaces:
            default:
              streams:
                demo:
                  durable: false        # default false (in-memory)
                  shards: 1             # default 1, at least 1
                  routing: modulo       # modulo | jump_hash
                  retention:
                    max_age_ms: 86400000  # default none (unbounded)
                    max_bytes: 1073741824 # default none (unbounded)
                  replication_factor: 1 # replicas in a fleet: 1 (default), 3, more
                  consistency: Leader   # Leader (default) | Quorum (durable streams only)
              caches:
                primary:
                  shards: 1
                  replication_factor: 1
                  consistency: Leader

Validation errors name the full path of the bad entry, e.g.
``catalog.tenants.t1.namespaces.ns.streams.orders.shards``. When the config
declares no catalog, :func:`default_catalog` gives tenant ``t1``, namespace
``default``, in-memory stream ``demo`` and cache ``primary``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

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
    "MAX_SHARDS",
    "CacheSpec",
    "Catalog",
    "CatalogError",
    "Routing",
    "StaticCatalog",
    "StreamSpec",
    "default_catalog",
    "load_catalog",
]


class Catalog(Protocol):
    """The broker's only view of what exists."""

    def tenant_exists(self, tenant_id: str) -> bool: ...

    def namespace_exists(self, tenant_id: str, namespace: str) -> bool: ...

    def stream(self, tenant_id: str, namespace: str, name: str) -> StreamSpec | None: ...

    def cache(self, tenant_id: str, namespace: str, name: str) -> CacheSpec | None: ...

    def streams(self) -> list[StreamSpec]: ...

    def caches(self) -> list[CacheSpec]: ...


class CatalogError(ValueError):
    """A catalog entry is invalid; ``path`` names it (``catalog.tenants.t1...``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class CatalogTables:
    """The lookups every catalog answers, over four plain tables. A static catalog
    fills them once; the control plane's live catalog keeps them up to date."""

    def __init__(self) -> None:
        self._tenants: set[str] = set()
        self._namespaces: set[tuple[str, str]] = set()
        self._streams: dict[tuple[str, str, str], StreamSpec] = {}
        self._caches: dict[tuple[str, str, str], CacheSpec] = {}

    def tenant_exists(self, tenant_id: str) -> bool:
        return tenant_id in self._tenants

    def namespace_exists(self, tenant_id: str, namespace: str) -> bool:
        return (tenant_id, namespace) in self._namespaces

    def stream(self, tenant_id: str, namespace: str, name: str) -> StreamSpec | None:
        return self._streams.get((tenant_id, namespace, name))

    def cache(self, tenant_id: str, namespace: str, name: str) -> CacheSpec | None:
        return self._caches.get((tenant_id, namespace, name))

    def streams(self) -> list[StreamSpec]:
        """Every stream, e.g. for durable storage to open logs at start."""
        return list(self._streams.values())

    def caches(self) -> list[CacheSpec]:
        """Every cache."""
        return list(self._caches.values())


class StaticCatalog(CatalogTables):
    """A fixed catalog, e.g. the one read from the config file."""

    def __init__(
        self,
        streams: Iterable[StreamSpec],
        caches: Iterable[CacheSpec],
        namespaces: Iterable[tuple[str, str]] = (),
    ) -> None:
        super().__init__()
        self._streams = {(s.tenant_id, s.namespace, s.name): s for s in streams}
        self._caches = {(c.tenant_id, c.namespace, c.name): c for c in caches}
        self._namespaces = set(namespaces)
        self._namespaces.update((t, ns) for t, ns, _ in self._streams)
        self._namespaces.update((t, ns) for t, ns, _ in self._caches)
        self._tenants = {t for t, _ in self._namespaces}


def default_catalog() -> StaticCatalog:
    """A catalog a user can work with at once: ``t1/default`` with ``demo`` and ``primary``."""
    return StaticCatalog(
        streams=[StreamSpec("t1", "default", "demo")],
        caches=[CacheSpec("t1", "default", "primary")],
    )


def _mapping(
    value: object, path: str, *, allowed: frozenset[str] | None = None
) -> Mapping[str, object]:
    # YAML "key:" with nothing after it reads as None; treat it as empty.
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CatalogError(path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise CatalogError(f"{path}.{key}", "keys must be strings")
        if allowed is not None and key not in allowed:
            raise CatalogError(
                f"{path}.{key}", f"unknown key (expected one of {', '.join(sorted(allowed))})"
            )
    return value


def _name(name: str, path: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise CatalogError(path, f"invalid name {name!r}: {problem}")
    return name


def _int(value: object, path: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(path, f"expected an integer, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise CatalogError(path, f"must be {bound}, got {value}")
    return value


def _optional_int(value: object, path: str) -> int | None:
    return None if value is None else _int(value, path, minimum=1)


def _stream(tenant: str, ns: str, name: str, raw: object, path: str) -> StreamSpec:
    body = _mapping(
        raw,
        path,
        allowed=frozenset(
            {"durable", "shards", "routing", "retention", "replication_factor", "consistency"}
        ),
    )
    durable = body.get("durable", False)
    if not isinstance(durable, bool):
        raise CatalogError(f"{path}.durable", f"expected true or false, got {durable!r}")
    shards = _int(body.get("shards", 1), f"{path}.shards", minimum=1, maximum=MAX_SHARDS)
    routing_raw = body.get("routing", Routing.MODULO.value)
    if routing_raw not in {r.value for r in Routing}:
        raise CatalogError(f"{path}.routing", f"expected modulo or jump_hash, got {routing_raw!r}")
    routing = Routing(str(routing_raw))
    retention = _mapping(
        body.get("retention"), f"{path}.retention", allowed=frozenset({"max_age_ms", "max_bytes"})
    )
    return StreamSpec(
        tenant_id=tenant,
        namespace=ns,
        name=name,
        durable=durable,
        shards=shards,
        routing=routing,
        retention_max_age_ms=_optional_int(
            retention.get("max_age_ms"), f"{path}.retention.max_age_ms"
        ),
        retention_max_bytes=_optional_int(
            retention.get("max_bytes"), f"{path}.retention.max_bytes"
        ),
        **_replication(body, path, durable=durable),
    )


def _replication(body: Mapping[str, object], path: str, *, durable: bool) -> dict[str, Any]:
    """`replication_factor` (1..MAX_REPLICATION_FACTOR, default 1) and `consistency`
    (Leader default, or Quorum: durable streams only)."""
    factor = _int(
        body.get("replication_factor", 1),
        f"{path}.replication_factor",
        minimum=1,
        maximum=MAX_REPLICATION_FACTOR,
    )
    try:
        consistency = parse_consistency(body.get("consistency", Consistency.LEADER.value))
    except ValueError as exc:
        raise CatalogError(f"{path}.consistency", str(exc)) from None
    if consistency is Consistency.QUORUM and not durable:
        raise CatalogError(
            f"{path}.consistency", "Quorum needs durable: true (acks promise disk on a majority)"
        )
    return {"replication_factor": factor, "consistency": consistency}


def _cache(tenant: str, ns: str, name: str, raw: object, path: str) -> CacheSpec:
    body = _mapping(raw, path, allowed=frozenset({"shards", "replication_factor", "consistency"}))
    shards = _int(body.get("shards", 1), f"{path}.shards", minimum=1, maximum=MAX_SHARDS)
    return CacheSpec(
        tenant_id=tenant,
        namespace=ns,
        name=name,
        shards=shards,
        **_replication(body, path, durable=True),
    )


def load_catalog(section: object, path: str = "catalog") -> StaticCatalog:
    """Validate the ``catalog:`` section of a config file and build its catalog.

    A missing (None) section gives :func:`default_catalog`. Raises
    :class:`CatalogError` naming the path of the first bad entry.
    """
    if section is None:
        return default_catalog()
    root = _mapping(section, path, allowed=frozenset({"tenants"}))
    streams: list[StreamSpec] = []
    caches: list[CacheSpec] = []
    namespaces: set[tuple[str, str]] = set()
    tenants = _mapping(root.get("tenants"), f"{path}.tenants")
    if not tenants:
        raise CatalogError(
            f"{path}.tenants", "declare at least one tenant, or leave out catalog for the default"
        )
    for tenant, tenant_raw in tenants.items():
        t_path = f"{path}.tenants.{tenant}"
        _name(tenant, t_path)
        tenant_body = _mapping(tenant_raw, t_path, allowed=frozenset({"namespaces"}))
        ns_map = _mapping(tenant_body.get("namespaces"), f"{t_path}.namespaces")
        if not ns_map:
            raise CatalogError(f"{t_path}.namespaces", "a tenant needs at least one namespace")
        for ns, ns_raw in ns_map.items():
            ns_path = f"{t_path}.namespaces.{ns}"
            _name(ns, ns_path)
            namespaces.add((tenant, ns))
            ns_body = _mapping(ns_raw, ns_path, allowed=frozenset({"streams", "caches"}))
            for name, raw in _mapping(ns_body.get("streams"), f"{ns_path}.streams").items():
                s_path = f"{ns_path}.streams.{name}"
                streams.append(_stream(tenant, ns, _name(name, s_path), raw, s_path))
            for name, raw in _mapping(ns_body.get("caches"), f"{ns_path}.caches").items():
                c_path = f"{ns_path}.caches.{name}"
                caches.append(_cache(tenant, ns, _name(name, c_path), raw, c_path))
    return StaticCatalog(streams, caches, namespaces)
