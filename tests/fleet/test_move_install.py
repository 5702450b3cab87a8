"""The successor's install of a staged copy on real files: the copy replaces the
folder (an older copy never survives) and the parent folder is fsynced after the
rename, so the installed copy survives a crash before the copy is reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from felix_broker.fleet import moves


def test_the_install_replaces_the_folder_and_fsyncs_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "streams" / "t" / "ns" / "s"
    target, staging = parent / "0", parent / ".0.incoming-9"
    target.mkdir(parents=True)
    (target / "old.log").write_bytes(b"stale")
    staging.mkdir()
    (staging / "new.log").write_bytes(b"fresh")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(moves.os, "fsync", fsync)
    moves._install_folder(staging, target)
    assert sorted(p.name for p in target.iterdir()) == ["new.log"]
    assert not staging.exists()
    assert str(parent) in synced
