"""The typed errors of the storage engine, so callers can tell damage from misuse."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CorruptionError",
    "LogClosedError",
    "LogFailedError",
    "OffsetOutOfRangeError",
    "PrincipalTooLongError",
    "StorageError",
    "UnsupportedVersionError",
]


class StorageError(Exception):
    """Base class of every error raised by :mod:`felix_broker.storage`."""


class CorruptionError(StorageError):
    """A file holds bytes the format does not allow where valid data must be.

    ``path`` and ``position`` (a byte offset into that file) say where an
    operator should look; the log refuses to open rather than silently drop
    records that may have been acknowledged.
    """

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class UnsupportedVersionError(StorageError):
    """A file was written with a format version this code does not know."""

    def __init__(self, path: Path, version: int, supported: int) -> None:
        super().__init__(
            f"{path}: unsupported storage format version {version} (this broker reads {supported})"
        )
        self.path = path
        self.version = version
        self.supported = supported


class LogFailedError(StorageError):
    """The log hit an I/O error (a failed write or fsync) and acknowledges nothing more.

    After a failed fsync the kernel may already have dropped the dirty pages, so
    retrying could report durability that does not exist; only reopening the
    log (which rescans the files) makes it usable again.
    """


class LogOpenError(StorageError):
    """A log's folder or files could not be opened or created (no space, no
    permission, a file where a folder belongs, ...); nothing was written."""

    def __init__(self, directory: Path, error: OSError) -> None:
        super().__init__(f"cannot open the log in {directory}: {error.strerror or error}")
        self.directory = directory
        self.errno = error.errno


class LogClosedError(StorageError):
    """The log was closed; reopen it to use it again."""


class PrincipalTooLongError(StorageError, ValueError):
    """A publisher principal longer than 255 bytes once UTF-8 encoded."""

    def __init__(self, length: int) -> None:
        super().__init__(f"publisher principal is {length} bytes in UTF-8; at most 255 allowed")
        self.length = length


class OffsetOutOfRangeError(StorageError, ValueError):
    """A read started outside ``[start_offset, next_offset]``, e.g. below retention."""

    def __init__(self, offset: int, start_offset: int, next_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log's range [{start_offset}, {next_offset}]"
        )
        self.offset = offset
        self.start_offset = start_offset
        self.next_offset = next_offset
