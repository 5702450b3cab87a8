"""A real etcd for tests: `etcd_server` starts one on 127.0.0.1 (free ports, a temp data
folder) and stops it by PID afterwards.

A test that needs etcd and finds no binary fails with one line naming the install
command; it is never skipped (CI installs etcd itself: .ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from felix_common.etcd_process import EtcdNotFoundError, EtcdProcess

__all__ = ["etcd_server", "start_etcd"]


def start_etcd(data_dir: Path) -> EtcdProcess:
    """A started etcd in `data_dir`; the test fails (one line) when there is no etcd."""
    try:
        process = EtcdProcess(data_dir)
    except EtcdNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    process.start()
    return process


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdProcess]:
    process = start_etcd(tmp_path / "etcd")
    try:
        yield process
    finally:
        process.close()
