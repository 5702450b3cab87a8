"""A broker configured with a peer certificate is a fleet member: its peer listener
binds where peer_bind says, its node id is the certificate's, and it advertises the
cluster features."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_broker.config import InvalidConfigValueError
from felix_common.etcd import EtcdClient
from felix_common.etcd_process import EtcdProcess
from felix_common.fleet import Keyspace
from felix_transport import generate_ca, generate_leaf
from felix_wire.features import Feature

from ..broker.harness import running_broker


def _write(tmp: Path, *node_ids: str) -> dict[str, str]:
    ca = generate_ca("fleet")
    leaf = generate_leaf(ca, dns_names=node_ids, ip_addresses=(), client_auth=True)
    (tmp / "peer.pem").write_bytes(leaf.cert_pem)
    (tmp / "peer.key").write_bytes(leaf.key_pem)
    (tmp / "fleet-ca.pem").write_bytes(ca.cert_pem)
    return {
        "peer_tls_cert": str(tmp / "peer.pem"),
        "peer_tls_key": str(tmp / "peer.key"),
        "peer_tls_ca": str(tmp / "fleet-ca.pem"),
        "peer_bind": "127.0.0.1:0",
    }


async def test_peer_tls_knobs_make_a_fleet_member(tmp_path: Path) -> None:
    async with running_broker(tmp_path, **_write(tmp_path, "node-x")) as broker:
        assert broker.fleet is not None and broker.fleet.node_id == "node-x"
        assert broker.peer_addr.startswith("127.0.0.1:")
        assert broker.features & Feature.FEATURE_TOPOLOGY
        assert broker.features & Feature.FEATURE_REDIRECT


async def test_a_peer_certificate_must_name_one_node(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one node id"):
        async with running_broker(tmp_path, **_write(tmp_path, "node-x", "node-y")):
            pass


async def test_the_peer_tls_files_go_together(tmp_path: Path) -> None:
    knobs = _write(tmp_path, "node-x")
    del knobs["peer_tls_ca"]
    with pytest.raises(InvalidConfigValueError, match="peer_tls_ca"):
        async with running_broker(tmp_path, **knobs):
            pass


async def test_a_node_id_other_than_the_certificates_refuses_to_join(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    # FELIX_NODE_ID says node-y, the peer certificate (FELIX_PEER_TLS_CERT) names node-x:
    # the broker refuses to start, before it registers anything in etcd.
    knobs = {**_write(tmp_path, "node-x"), "node_id": "node-y"}
    with pytest.raises(ValueError, match="'node-y' is not the one its peer certificate names"):
        async with running_broker(tmp_path, etcd_endpoints=etcd_server.endpoint, **knobs):
            pass
    probe = EtcdClient([("127.0.0.1", etcd_server.client_port)])
    try:
        _, members = await probe.get_prefix(Keyspace("/felix").members)
        assert members == []
    finally:
        await probe.close()
    # The same files with the certificate's node id join.
    knobs["node_id"] = "node-x"
    async with running_broker(tmp_path, etcd_endpoints=etcd_server.endpoint, **knobs) as broker:
        assert broker.etcd is not None and broker.fleet is not None
        assert broker.fleet.node_id == "node-x"


async def test_a_member_on_a_wildcard_peer_bind_must_advertise_its_peer_address(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    # Registered as 0.0.0.0:port no other broker could forward to it: refused at start,
    # before the peer listener binds anything.
    knobs = {**_write(tmp_path, "node-x"), "node_id": "node-x", "peer_bind": "0.0.0.0:0"}
    with pytest.raises(ValueError, match="peer_advertise_addr"):
        async with running_broker(tmp_path, etcd_endpoints=etcd_server.endpoint, **knobs):
            pass
