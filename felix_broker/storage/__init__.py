"""Durable storage: one append-only, segmented, checksummed log per stream shard.

The on-disk format is described in ``docs/storage-format.md``; durability and
visibility per fsync mode in :mod:`felix_broker.storage.log`.
"""

from felix_broker.config import FsyncMode
from felix_broker.storage.errors import (
    CorruptionError,
    LogClosedError,
    LogFailedError,
    LogOpenError,
    OffsetOutOfRangeError,
    PrincipalTooLongError,
    StorageError,
    UnsupportedVersionError,
)
from felix_broker.storage.format import FORMAT_VERSION, MAX_PRINCIPAL_BYTES, Record
from felix_broker.storage.log import Log, LogConfig
from felix_broker.storage.retention import Retention
from felix_broker.storage.store import LogStore, ShardKey, ShardOffsets

__all__ = [
    "FORMAT_VERSION",
    "MAX_PRINCIPAL_BYTES",
    "CorruptionError",
    "FsyncMode",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogFailedError",
    "LogOpenError",
    "LogStore",
    "OffsetOutOfRangeError",
    "PrincipalTooLongError",
    "Record",
    "Retention",
    "ShardKey",
    "ShardOffsets",
    "StorageError",
    "UnsupportedVersionError",
]
