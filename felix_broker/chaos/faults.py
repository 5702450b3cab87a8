"""The broker's test-mode faults: a fault file read only when FELIX_TEST_FAULTS is set.

The chaos nemesis and the client fixture write the file (JSON, replaced atomically);
the broker reads it at most once per `RECHECK_S` (a `stat` otherwise), on every
fsync and on every replication message it sends or receives. Its keys, each optional:

- ``{"fsync_delay_ms": N}``: each fsync first sleeps N ms (a slow disk);
- ``{"fsync_fail": true}``: each fsync raises ``OSError(EIO)`` instead of syncing
  (a failed disk: the log goes to its failed state and acknowledges nothing more);
- ``{"peer_blocked": ["node-2", ...]}``: a partition between this broker and those
  fleet members, for replication only: every replication message (``replica_*``) to
  them is dropped before it is sent, and every one from them is answered
  ``replica_received {held: false}`` without reaching the replica (as a lost
  message: the cores resend, so healing loses nothing). Client traffic, forwarding
  and every other peer message are untouched;
- ``{"forwards_unanswered": true}``: a fleet member that takes every publish another
  broker forwards to it and never answers (nor applies) it: the forwarding broker
  stops waiting after its peer request timeout and answers its client
  ``unacknowledged`` (retry class ``outcome_unknown``);
- ``{"auth_draining": true}``: the broker answers every new ``auth`` ``draining``,
  as in the window between the start of a drain and its close, and keeps serving
  the connections it already has (a drain held open; a real drain cannot be undone);
- an empty object, or no file: no fault.

A file that is not such an object counts as no fault and is logged once per
change, so a typo never turns into a fault nobody asked for. Without the knob the
broker's fsync is plain ``os.fsync`` and this module is never imported.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RECHECK_S", "FaultFile", "Faults", "FsyncFault", "write_fault"]

_log = logging.getLogger(__name__)

RECHECK_S = 0.05
_MAX_DELAY_MS = 60_000  # a fault is bounded: one fsync never sleeps longer than this


_SWITCHES = ("forwards_unanswered", "auth_draining")
_KEYS = frozenset(
    {"fsync_delay_ms", "fsync_fail", "peer_blocked", "forwards_unanswered", "auth_draining"}
)


@dataclass(frozen=True, slots=True)
class Faults:
    """The faults a file names (the default: none)."""

    delay_ms: int = 0
    fail: bool = False
    peer_blocked: frozenset[str] = frozenset()  # node ids cut off for replication
    forwards_unanswered: bool = False  # forwarded publishes taken, never answered
    auth_draining: bool = False  # every new auth answered `draining`

    def to_json(self) -> dict[str, object]:
        return {
            "fsync_delay_ms": self.delay_ms,
            "fsync_fail": self.fail,
            "peer_blocked": sorted(self.peer_blocked),
            "forwards_unanswered": self.forwards_unanswered,
            "auth_draining": self.auth_draining,
        }

    @classmethod
    def parse(cls, text: str) -> Faults:
        """The faults a file's text names; ``ValueError`` for anything else."""
        value = json.loads(text) if text.strip() else {}
        if not isinstance(value, dict) or set(value) - _KEYS:
            raise ValueError(f"expected an object with some of {', '.join(sorted(_KEYS))}")
        delay = value.get("fsync_delay_ms", 0)
        blocked = value.get("peer_blocked", [])
        if not isinstance(delay, int) or isinstance(delay, bool) or not delay >= 0:
            raise ValueError("fsync_delay_ms must be a non-negative integer")
        flags = {key: value.get(key, False) for key in ("fsync_fail", *_SWITCHES)}
        for key, flag in flags.items():
            if not isinstance(flag, bool):
                raise ValueError(f"{key} must be true or false")
        if not isinstance(blocked, list) or not all(isinstance(n, str) and n for n in blocked):
            raise ValueError("peer_blocked must be a list of node ids")
        return cls(
            min(delay, _MAX_DELAY_MS),
            flags["fsync_fail"],
            frozenset(blocked),
            forwards_unanswered=flags["forwards_unanswered"],
            auth_draining=flags["auth_draining"],
        )


FsyncFault = Faults  # the name the chaos runner's fsync faults use


class FaultFile:
    """``fsync`` is ``os.fsync`` with the file's current fault applied; ``peer_blocked``
    says whether replication with a node is cut (both thread-safe)."""

    def __init__(self, path: Path, sync: Callable[[int], None] = os.fsync) -> None:
        self.path = path
        self._sync = sync
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._stamp: tuple[int, int] | None = None
        self._fault = Faults()

    def current(self) -> Faults:
        now = time.monotonic()
        with self._lock:
            if now - self._checked < RECHECK_S:
                return self._fault
            self._checked = now
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                self._stamp, self._fault = None, Faults()
                return self._fault
            stamp = (stat.st_mtime_ns, stat.st_ino)
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._fault = Faults.parse(self.path.read_text())
                except (OSError, ValueError) as exc:
                    _log.warning("test fault file %s ignored: %s", self.path, exc)
                    self._fault = Faults()
            return self._fault

    def peer_blocked(self, node_id: str) -> bool:
        return node_id in self.current().peer_blocked

    def forwards_unanswered(self) -> bool:
        return self.current().forwards_unanswered

    def auth_draining(self) -> bool:
        return self.current().auth_draining

    def fsync(self, fd: int) -> None:
        fault = self.current()
        if fault.delay_ms:
            time.sleep(fault.delay_ms / 1000)
        if fault.fail:
            raise OSError(errno.EIO, "fsync failed (test fault)")
        self._sync(fd)


def write_fault(path: Path, fault: Faults) -> None:
    """Replace the fault file atomically (what the nemesis calls)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(fault.to_json()))
    tmp.replace(path)
