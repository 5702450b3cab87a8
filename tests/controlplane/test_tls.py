"""The control plane's public listener over TLS, as `felix-controlplane --tls-cert` runs it."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from felix_broker.catalog.live import LiveCatalog, SyncError
from felix_broker.tls import prepare_tls
from felix_controlplane.cli import parse_args, run

pytestmark = pytest.mark.timeout(30)

SYNC_TOKEN = "sync-token-for-the-tls-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_brokers_sync_over_tls_and_refuse_an_untrusted_or_plain_listener(
    tmp_path: Path,
) -> None:
    material = prepare_tls(data_dir=tmp_path / "certs")  # a CA and a leaf for 127.0.0.1
    assert material.ca_path is not None
    token_file = tmp_path / "sync-token"
    token_file.write_text(SYNC_TOKEN)
    port = free_port()
    args = parse_args(
        [
            "--db",
            str(tmp_path / "cp.db"),
            "--bind",
            f"127.0.0.1:{port}",
            "--admin-bind",
            f"127.0.0.1:{free_port()}",
            "--tls-cert",
            str(material.cert_path),
            "--tls-key",
            str(material.key_path),
            "--sync-token-file",
            str(token_file),
        ]
    )
    stop = asyncio.Event()
    plane = asyncio.get_running_loop().create_task(run(args, stop))
    try:
        url = f"https://127.0.0.1:{port}"
        catalog = LiveCatalog(url, sync_token=SYNC_TOKEN, ca_file=str(material.ca_path))
        for attempt in range(100):  # the listener is up once a snapshot loads
            try:
                await catalog.start()
                break
            except SyncError:
                if attempt == 99:
                    raise
                await asyncio.sleep(0.05)
        assert catalog.tenant_ids() == []  # a fresh control plane, read over TLS
        await catalog.close()
        # Without the CA the certificate is not trusted; plain HTTP gets no answer.
        with pytest.raises(SyncError):
            await LiveCatalog(url, sync_token=SYNC_TOKEN).start()
        with pytest.raises(SyncError):
            await LiveCatalog(f"http://127.0.0.1:{port}", sync_token=SYNC_TOKEN).start()
    finally:
        stop.set()
        await plane
