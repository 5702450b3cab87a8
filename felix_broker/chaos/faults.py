"""The broker's test-mode faults: a fault file read only when FELIX_TEST_FAULTS is set.

The chaos nemesis and the client fixture write the file (JSON, replaced atomically);
the broker reads it at most once per `RECHECK_S` (a `stat` otherwise), on every
fsync, every peer message it sends or receives and every wall-clock read. Its keys, each optional:

- ``{"fsync_delay_ms": N}``: each fsync first sleeps N ms (a slow disk);
- ``{"fsync_fail": true}``: each fsync raises ``OSError(EIO)`` instead of syncing
  (a failed disk: the log goes to its failed state and acknowledges nothing more);
- ``{"peer_blocked": ["node-2", ...]}``: a partition between this broker and those
  fleet members, for replication only: every replication message (``replica_*``) to
  them is dropped before it is sent, and every one from them is answered
  ``replica_received {held: false}`` without reaching the replica (as a lost
  message: the cores resend, so healing loses nothing). Client traffic, forwarding
  and every other peer message are untouched;
- ``{"peer_blocked_out": ["node-2"]}`` / ``{"peer_blocked_in": ["node-3"]}``: a
  directional partition of every peer message (forwarding, moves, replication),
  applied by the peer layer (`felix_broker.fleet.peer`, dialer and listener
  alike). ``out`` loses what this broker sends to those members: its requests to
  them fail unsent, and its answers to their requests are lost after the request
  took effect (they see the stream reset: outcome unknown). ``in`` loses what
  they send to this broker: their requests are dropped unseen (stream reset), and
  their answers to this broker's requests are lost after taking effect there. A
  both-ways cut of a pair needs one file naming the other node in both lists;
  a one-way cut X -> Y is X's ``out`` or Y's ``in``. Client traffic and etcd are
  untouched (leases hold: no failover, only replication and forwarding fail);
- ``{"clock_offset_ms": N}``: this broker's wall clock runs N ms ahead (negative:
  behind) of the host's: a clock jump. It moves every wall-clock read of the
  broker's data path (`felix_broker.clock`: append times, cache TTLs and expiry,
  group and cache log stamps); monotonic timers, etcd leases, token and
  certificate checks are unaffected. At most ``MAX_CLOCK_OFFSET_MS`` either way;
- ``{"forwards_unanswered": true}``: a fleet member that takes every publish another
  broker forwards to it and never answers (nor applies) it: the forwarding broker
  stops waiting after its peer request timeout and answers its client
  ``unacknowledged`` (retry class ``outcome_unknown``);
- ``{"auth_draining": true}``: the broker answers every new ``auth`` ``draining``,
  as in the window between the start of a drain and its close, and keeps serving
  the connections it already has (a drain held open; a real drain cannot be undone);
- ``{"handler_fault": true}``: every request the broker's dispatch table routes fails
  inside its handler, as a bug would (`felix_broker.session.dispatch`): the broker's
  catch-all answers it ``internal`` (retry class ``outcome_unknown``), logs and
  counts it, and the stream and connection go on being served;
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

__all__ = ["MAX_CLOCK_OFFSET_MS", "RECHECK_S", "FaultFile", "Faults", "FsyncFault", "write_fault"]

_log = logging.getLogger(__name__)

RECHECK_S = 0.05
_MAX_DELAY_MS = 60_000  # a fault is bounded: one fsync never sleeps longer than this
MAX_CLOCK_OFFSET_MS = 86_400_000  # a clock jump is bounded: a day either way

_SWITCHES = ("forwards_unanswered", "auth_draining", "handler_fault")
_KEYS = frozenset(
    {
        "fsync_delay_ms",
        "fsync_fail",
        "peer_blocked",
        "peer_blocked_out",
        "peer_blocked_in",
        "clock_offset_ms",
        *_SWITCHES,
    }
)


def _node_ids(value: object, key: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ValueError(f"{key} must be a list of node ids")
    return frozenset(value)


@dataclass(frozen=True, slots=True)
class Faults:
    """The faults a file names (the default: none)."""

    delay_ms: int = 0
    fail: bool = False
    peer_blocked: frozenset[str] = frozenset()  # node ids cut off for replication
    blocked_out: frozenset[str] = frozenset()  # node ids this broker's messages to are lost
    blocked_in: frozenset[str] = frozenset()  # node ids whose messages to this broker are lost
    clock_offset_ms: int = 0  # this broker's wall clock, ahead (+) or behind (-)
    forwards_unanswered: bool = False  # forwarded publishes taken, never answered
    auth_draining: bool = False  # every new auth answered `draining`
    handler_fault: bool = False  # every routed request fails inside its handler

    def to_json(self) -> dict[str, object]:
        return {
            "fsync_delay_ms": self.delay_ms,
            "fsync_fail": self.fail,
            "peer_blocked": sorted(self.peer_blocked),
            "peer_blocked_out": sorted(self.blocked_out),
            "peer_blocked_in": sorted(self.blocked_in),
            "clock_offset_ms": self.clock_offset_ms,
            "forwards_unanswered": self.forwards_unanswered,
            "auth_draining": self.auth_draining,
            "handler_fault": self.handler_fault,
        }

    @classmethod
    def parse(cls, text: str) -> Faults:
        """The faults a file's text names; ``ValueError`` for anything else."""
        value = json.loads(text) if text.strip() else {}
        if not isinstance(value, dict) or set(value) - _KEYS:
            raise ValueError(f"expected an object with some of {', '.join(sorted(_KEYS))}")
        delay = value.get("fsync_delay_ms", 0)
        offset = value.get("clock_offset_ms", 0)
        if not isinstance(delay, int) or isinstance(delay, bool) or not delay >= 0:
            raise ValueError("fsync_delay_ms must be a non-negative integer")
        flags = {key: value.get(key, False) for key in ("fsync_fail", *_SWITCHES)}
        for key, flag in flags.items():
            if not isinstance(flag, bool):
                raise ValueError(f"{key} must be true or false")
        if (
            not isinstance(offset, int)
            or isinstance(offset, bool)
            or not -MAX_CLOCK_OFFSET_MS <= offset <= MAX_CLOCK_OFFSET_MS
        ):
            raise ValueError(f"clock_offset_ms must be an integer within +-{MAX_CLOCK_OFFSET_MS}")
        return cls(
            min(delay, _MAX_DELAY_MS),
            flags["fsync_fail"],
            _node_ids(value.get("peer_blocked", []), "peer_blocked"),
            _node_ids(value.get("peer_blocked_out", []), "peer_blocked_out"),
            _node_ids(value.get("peer_blocked_in", []), "peer_blocked_in"),
            offset,
            forwards_unanswered=flags["forwards_unanswered"],
            auth_draining=flags["auth_draining"],
            handler_fault=flags["handler_fault"],
        )


FsyncFault = Faults  # the name the chaos runner's fsync faults use


class FaultFile:
    """``fsync`` is ``os.fsync`` with the file's current fault applied; ``peer_blocked``
    says whether replication with a node is cut, ``blocks_out`` / ``blocks_in`` whether
    peer messages to / from a node are lost (the peer layer's `LinkFaults`),
    ``clock_offset_ns`` how far this broker's wall clock is moved, and
    ``forwards_unanswered`` / ``auth_draining`` / ``handler_fault`` whether those
    switches are on (all thread-safe)."""

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

    def blocks_out(self, node_id: str) -> bool:
        return node_id in self.current().blocked_out

    def blocks_in(self, node_id: str) -> bool:
        return node_id in self.current().blocked_in

    def clock_offset_ns(self) -> int:
        return self.current().clock_offset_ms * 1_000_000

    def forwards_unanswered(self) -> bool:
        return self.current().forwards_unanswered

    def auth_draining(self) -> bool:
        return self.current().auth_draining

    def handler_fault(self) -> bool:
        return self.current().handler_fault

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
