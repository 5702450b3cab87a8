"""The etcd the tests (and `felix-broker fixture`) start: free loopback ports, its own data,
stopped by PID; missing, a one-line failure naming the install command."""

from __future__ import annotations

from pathlib import Path

import pytest

from felix_common.etcd import EtcdClient
from felix_common.etcd_process import ETCD_INSTALL_HINT, EtcdNotFoundError, EtcdProcess, find_etcd
from tests.support.etcd import start_etcd

pytestmark = pytest.mark.timeout(60)


def test_no_etcd_binary_is_one_line_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FELIX_ETCD_BINARY", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(EtcdNotFoundError) as missing:
        find_etcd()
    assert str(missing.value) == ETCD_INSTALL_HINT
    assert "apt-get install -y etcd-server" in ETCD_INSTALL_HINT and "\n" not in ETCD_INSTALL_HINT
    with pytest.raises(pytest.fail.Exception) as failed:
        start_etcd(Path("/nonexistent"))
    assert str(failed.value) == ETCD_INSTALL_HINT


async def test_restarted_on_the_same_ports_with_its_data(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    try:
        pid, port = etcd.pid, etcd.client_port
        client = EtcdClient([("127.0.0.1", port)])
        revision = await client.put("/k", b"v")
        await client.close()
        etcd.restart()
        assert etcd.running and etcd.pid != pid and etcd.client_port == port
        client = EtcdClient([("127.0.0.1", port)])
        kv = await client.get("/k")
        await client.close()
        assert kv is not None and kv.value == b"v" and kv.mod_revision == revision
    finally:
        etcd.close()
    assert not etcd.running and (tmp_path / "etcd").exists()  # the caller's folder is kept


def test_a_process_of_its_own_cleans_up_its_folder() -> None:
    with EtcdProcess() as etcd:
        folder = etcd.data_dir
        assert etcd.running and folder.exists()
    assert not etcd.running and not folder.exists()
