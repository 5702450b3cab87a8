"""The fleet's knobs: a node id and etcd endpoints go together; endpoints, prefix and
lease TTL are checked at load, naming the knob."""

from __future__ import annotations

import pytest

from felix_broker.config import ConfigError, HostPort, load_config


def test_the_fleet_knobs_from_the_environment() -> None:
    config = load_config(
        environ={
            "FELIX_NODE_ID": "b1",
            "FELIX_ETCD_ENDPOINTS": "127.0.0.1:2379, etcd-2:2379",
            "FELIX_ETCD_PREFIX": "/prod",
            "FELIX_NODE_LEASE_TTL_MS": "3000",
        }
    )
    assert config.node_id == "b1" and config.etcd_prefix == "/prod"
    assert config.etcd_endpoints == (HostPort("127.0.0.1", 2379), HostPort("etcd-2", 2379))
    assert config.node_lease_ttl_ms == 3000
    standalone = load_config(environ={})
    assert (standalone.node_id, standalone.etcd_endpoints) == ("", ())


@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"FELIX_NODE_ID": "b1"}, "etcd_endpoints"),
        ({"FELIX_ETCD_ENDPOINTS": "127.0.0.1:2379"}, "node_id"),
        ({"FELIX_NODE_ID": "b1", "FELIX_ETCD_ENDPOINTS": "nowhere"}, "etcd_endpoints"),
        (
            {"FELIX_NODE_ID": "b", "FELIX_ETCD_ENDPOINTS": "h:1", "FELIX_ETCD_PREFIX": "/x/"},
            "etcd_prefix",
        ),
        (
            {"FELIX_NODE_ID": "b", "FELIX_ETCD_ENDPOINTS": "h:1", "FELIX_NODE_LEASE_TTL_MS": "10"},
            "node_lease_ttl_ms",
        ),
    ],
)
def test_a_wrong_fleet_setting_names_its_knob(environ: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(environ=environ)
    assert refused.value.key == key
