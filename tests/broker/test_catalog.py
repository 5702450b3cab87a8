"""The config catalog: lookups, defaults, and validation errors that name the path."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from felix_broker.catalog import (
    Catalog,
    CatalogError,
    Routing,
    StaticCatalog,
    default_catalog,
    load_catalog,
)

pytestmark = pytest.mark.timeout(10)

_YAML = """
tenants:
  t1:
    namespaces:
      ns:
        streams:
          orders:
            durable: true
            shards: 4
            routing: jump_hash
            retention: {max_age_ms: 86400000, max_bytes: 1048576}
          plain: {}
        caches:
          sessions: {shards: 2}
      empty:
  t2:
    namespaces:
      prod:
        streams:
          events:
"""


def _load(text: str) -> StaticCatalog:
    return load_catalog(yaml.safe_load(text))


def test_lookups() -> None:
    catalog: Catalog = _load(_YAML)
    orders = catalog.stream("t1", "ns", "orders")
    assert orders is not None
    assert (orders.durable, orders.shards, orders.routing) == (True, 4, Routing.JUMP_HASH)
    assert (orders.retention_max_age_ms, orders.retention_max_bytes) == (86400000, 1048576)
    plain = catalog.stream("t1", "ns", "plain")
    assert plain is not None
    assert (plain.durable, plain.shards, plain.routing) == (False, 1, Routing.MODULO)
    assert plain.retention_max_age_ms is None
    events = catalog.stream("t2", "prod", "events")
    assert events is not None and events.shards == 1
    sessions = catalog.cache("t1", "ns", "sessions")
    assert sessions is not None and sessions.shards == 2
    assert catalog.stream("t1", "ns", "sessions") is None
    assert catalog.cache("t1", "ns", "orders") is None
    assert catalog.stream("t1", "other", "orders") is None


def test_existence() -> None:
    catalog = _load(_YAML)
    assert catalog.tenant_exists("t1") and catalog.tenant_exists("t2")
    assert not catalog.tenant_exists("t3")
    assert catalog.namespace_exists("t1", "ns")
    assert catalog.namespace_exists("t1", "empty")  # declared, even with nothing in it
    assert not catalog.namespace_exists("t2", "ns")


def test_default_catalog() -> None:
    for catalog in (default_catalog(), load_catalog(None)):
        demo = catalog.stream("t1", "default", "demo")
        assert demo is not None and not demo.durable and demo.shards == 1
        assert catalog.cache("t1", "default", "primary") is not None
        assert catalog.tenant_exists("t1") and catalog.namespace_exists("t1", "default")


def _orders(**fields: Any) -> dict[str, Any]:
    return {"tenants": {"t1": {"namespaces": {"ns": {"streams": {"orders": fields}}}}}}


_ORDERS = "catalog.tenants.t1.namespaces.ns.streams.orders"


@pytest.mark.parametrize(
    ("section", "path"),
    [
        (_orders(shards=0), f"{_ORDERS}.shards"),
        (_orders(shards=-2), f"{_ORDERS}.shards"),
        (_orders(shards="4"), f"{_ORDERS}.shards"),
        (_orders(shards=True), f"{_ORDERS}.shards"),
        (_orders(shards=10**9), f"{_ORDERS}.shards"),
        (_orders(routing="round_robin"), f"{_ORDERS}.routing"),
        (_orders(durable="yes"), f"{_ORDERS}.durable"),
        (_orders(partitions=3), f"{_ORDERS}.partitions"),
        (_orders(retention={"max_age": 5}), f"{_ORDERS}.retention.max_age"),
        (_orders(retention={"max_bytes": 0}), f"{_ORDERS}.retention.max_bytes"),
        (_orders(retention=7), f"{_ORDERS}.retention"),
        (
            {"tenants": {"t1": {"namespaces": {"ns": {"caches": {"c": {"shards": 0}}}}}}},
            "catalog.tenants.t1.namespaces.ns.caches.c.shards",
        ),
        (
            {"tenants": {"t1": {"namespaces": {"ns": {"caches": {"c": {"ttl": 1}}}}}}},
            "catalog.tenants.t1.namespaces.ns.caches.c.ttl",
        ),
        (
            {"tenants": {"t1": {"namespaces": {"ns": {"queues": {}}}}}},
            "catalog.tenants.t1.namespaces.ns.queues",
        ),
        ({"tenants": {"t/1": {"namespaces": {"ns": {}}}}}, "catalog.tenants.t/1"),
        (
            {"tenants": {"t1": {"namespaces": {"ns": {"streams": {"a*": {}}}}}}},
            "catalog.tenants.t1.namespaces.ns.streams.a*",
        ),
        ({"tenants": {"t1": {}}}, "catalog.tenants.t1.namespaces"),
        ({"tenants": {}}, "catalog.tenants"),
        ({"tenant": {}}, "catalog.tenant"),
        (["t1"], "catalog"),
    ],
)
def test_validation_names_the_path(section: object, path: str) -> None:
    with pytest.raises(CatalogError) as info:
        load_catalog(section)
    assert info.value.path == path
    assert str(info.value).startswith(path + ":")
