"""All shard logs of a broker under one root folder, with their background upkeep.

Layout: ``root/<tenant>/<namespace>/<stream>/<shard>/`` holds one log, where
the names follow the catalogue's name rule (:mod:`felix_wire.names`) and
``<shard>`` is the decimal shard number; folders are built only by
:mod:`felix_broker.storage.paths`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from felix_broker.clock import wall_us
from felix_broker.config import FsyncMode
from felix_broker.storage.errors import LogFailedError, LogOpenError
from felix_broker.storage.log import Log, LogConfig
from felix_broker.storage.paths import log_dir
from felix_broker.storage.retention import Retention
from felix_wire.names import check_name

__all__ = ["LogStore", "ShardKey", "ShardOffsets"]

_log = logging.getLogger(__name__)

_SHARD = re.compile(r"0|[1-9][0-9]{0,9}")


def _now_us() -> int:
    return wall_us()


@dataclass(frozen=True, order=True, slots=True)
class ShardKey:
    """Which log: one per shard of a stream."""

    tenant: str
    namespace: str
    stream: str
    shard: int

    def __post_init__(self) -> None:
        # Raises InvalidNameError (a ValueError) for a name breaking the rule.
        check_name("tenant", self.tenant)
        check_name("namespace", self.namespace)
        check_name("stream", self.stream)
        if self.shard < 0:
            raise ValueError(f"invalid shard {self.shard}")

    def directory(self, root: Path) -> Path:
        """The log's folder below the store root."""
        return log_dir(root, "streams", self.tenant, self.namespace, self.stream, self.shard)


@dataclass(frozen=True, slots=True)
class ShardOffsets:
    """A shard's offsets: oldest retained, committed (durable) and next."""

    start: int
    durable: int
    next: int


class LogStore:
    """Opens, recovers, syncs, trims and closes every shard log under ``root``.

    Call :meth:`recover_all` once at start (the broker is ready only after it
    returns), then :meth:`start` to run the periodic fsync (every
    ``config.fsync_interval``; fsync modes other than ``none``) and retention
    (every ``retention_interval`` seconds) tasks.
    """

    def __init__(
        self,
        root: Path,
        *,
        config: LogConfig | None = None,
        retention_interval: float = 30.0,
        fsync: Callable[[int], None] = os.fsync,
        clock_us: Callable[[], int] = _now_us,
    ) -> None:
        if not retention_interval > 0:
            raise ValueError(f"retention_interval must be > 0, got {retention_interval}")
        self.root = root
        self.config = config or LogConfig()
        self.retention_interval = retention_interval
        self._fsync = fsync
        self._clock_us = clock_us
        self._logs: dict[ShardKey, Log] = {}
        self._retention: dict[ShardKey, Retention] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = False

    # --- opening ---------------------------------------------------------------------

    async def recover_all(self) -> list[ShardKey]:
        """Open (and so recover) every log found under the root, off the event loop.

        Raises the first :class:`~felix_broker.storage.errors.StorageError` met;
        the logs opened before it stay open.
        """
        keys = await asyncio.to_thread(self._find_shards)
        for key in keys:
            if key not in self._logs:
                self._logs[key] = await asyncio.to_thread(
                    Log.open, key.directory(self.root), self.config, fsync=self._fsync
                )
        self.ready = True
        _log.info("recovered %d shard logs under %s", len(keys), self.root)
        return keys

    def _find_shards(self) -> list[ShardKey]:
        # Walked level by level rather than globbed: catalog names may start
        # with a dot, which glob patterns skip.
        keys: list[ShardKey] = []
        for shard_dir in self._subfolders(self.root, depth=4):
            tenant, namespace, stream, shard = shard_dir.relative_to(self.root).parts
            if not _SHARD.fullmatch(shard):
                _log.warning("ignoring %s: not a shard log folder", shard_dir)
                continue
            try:
                keys.append(ShardKey(tenant, namespace, stream, int(shard)))
            except ValueError:
                _log.warning("ignoring %s: not a shard log folder", shard_dir)
        return sorted(keys)

    @classmethod
    def _subfolders(cls, folder: Path, *, depth: int) -> list[Path]:
        if not folder.is_dir():
            return []
        children = sorted(child for child in folder.iterdir() if child.is_dir())
        if depth == 1:
            return children
        return [found for child in children for found in cls._subfolders(child, depth=depth - 1)]

    def open_log(self, key: ShardKey, *, retention: Retention | None = None) -> Log:
        """The log of ``key``, opened or created now if needed (blocking file I/O)."""
        if retention is not None:
            self._retention[key] = retention
        log = self._logs.get(key)
        if log is None:
            directory = key.directory(self.root)
            try:
                log = Log.open(directory, self.config, fsync=self._fsync)
            except OSError as exc:
                # e.g. ENOSPC or EACCES creating the first segment of a new log.
                raise LogOpenError(directory, exc) from exc
            self._logs[key] = log
        return log

    def failed_logs(self) -> list[ShardKey]:
        """The open logs in the failed state (see LogFailedError): they accept no
        more writes until the broker is restarted, which reopens and rescans them."""
        return [key for key, log in self._logs.items() if log.failed]

    def forget(self, key: ShardKey) -> None:
        """Close and forget the log of ``key`` (its shard moved, or a move's copy is
        about to replace its files); the next `open_log` reopens it from disk."""
        log = self._logs.pop(key, None)
        if log is not None:
            try:
                log.close()
            except LogFailedError as exc:
                _log.error("closing a moved log failed: %s", exc)

    def get(self, key: ShardKey) -> Log | None:
        """The open log of ``key``, if any."""
        return self._logs.get(key)

    def set_retention(self, key: ShardKey, retention: Retention) -> None:
        """The policy the retention task applies to ``key`` (default: keep everything)."""
        self._retention[key] = retention

    # --- upkeep ----------------------------------------------------------------------

    def apply_retention(self) -> int:
        """One retention pass over every open log; returns the segments deleted."""
        now_us = self._clock_us()
        deleted = 0
        for key, log in self._logs.items():
            retention = self._retention.get(key)
            if retention is not None and not log.closed:
                deleted += log.apply_retention(retention, now_us=now_us)
        return deleted

    async def sync_all(self) -> None:
        """Sync every log with pending writes, concurrently; failures are logged by each log."""
        pending = [log.sync() for log in self._logs.values() if log.needs_sync]
        await asyncio.gather(*pending, return_exceptions=True)

    def offsets(self) -> dict[ShardKey, ShardOffsets]:
        """Per shard: start, committed (durable) and next offsets, e.g. for /backup/offsets."""
        return {
            key: ShardOffsets(log.start_offset, log.durable_offset, log.next_offset)
            for key, log in sorted(self._logs.items())
        }

    def start(self) -> None:
        """Start the periodic fsync and retention tasks on the running event loop."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        if self.config.fsync_mode is not FsyncMode.NONE:
            # Under on_commit this also makes records readable that were
            # appended without anyone waiting for them.
            self._tasks.append(
                loop.create_task(self._every(self.config.fsync_interval, self.sync_all))
            )
        self._tasks.append(loop.create_task(self._every(self.retention_interval, self._retain)))

    async def _retain(self) -> None:
        self.apply_retention()

    async def _every(self, interval: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await action()
            except Exception:
                # One bad pass (e.g. a file that cannot be removed) must not
                # stop the upkeep of every other shard.
                _log.exception("storage upkeep pass failed")

    async def aclose(self) -> None:
        """Stop the tasks and close every log (syncing what is pending)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        logs = list(self._logs.values())
        self._logs.clear()
        self.ready = False
        results = await asyncio.gather(*(log.aclose() for log in logs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
