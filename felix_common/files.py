"""Small file helpers shared by the modules that keep keys and certificates on disk."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

__all__ = ["create_file_once", "replace_file", "warn_if_readable_by_others"]

_log = logging.getLogger(__name__)


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    # A unique temporary name beside the target, so the final step is a
    # same-folder link or rename and a reader never sees a half-written file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def create_file_once(path: Path, data: bytes, *, mode: int = 0o600) -> bool:
    """Create ``path`` with ``data`` and ``mode`` unless it exists; True if this call made it.

    Two processes racing to create the same file both end up reading the one
    that won, because the final step (a hard link) refuses to replace.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, data, mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    return True


def replace_file(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``path`` atomically, replacing any previous content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def warn_if_readable_by_others(path: Path) -> None:
    """Log a warning when a private key file can be read by group or others."""
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        _log.warning("private key %s is accessible to other users; chmod 600 it", path)
