"""Fleet features on a broker: what it implements, and what it acts on (the enabled set).

A fleet feature is a cluster-wide switch. Each broker lists
the ones it implements in its member record (``features``); the control plane
finalizes one once every live broker implements it (``P/features/{name}``,
one-way), and the routing view carries the finalized set. A broker acts only on
its **enabled** set: what it implements that the fleet finalized.

Four features are acted on (``lease_free_reads`` by the Quorum caches' read rounds,
felix_broker/replication/reads.py; ``replicated_conditions`` by the Quorum streams'
replication, felix_broker/replication/manager.py; the two below here):

- ``replicated_conditions``: a fleet member refuses a guarded or idempotent write
  to a Quorum stream (``publish_if``, ``commit``, ``publish_idempotent``: every
  replica judges their condition itself when it applies the entry) with
  ``invalid_request`` (nothing written; decision ``quorum-conditions-feature``)
  until it is enabled, so a fleet with a broker that predates that judging (and
  would append such a batch unconditionally as a follower) never lets one in.

- ``atomic_commit``: a fleet member refuses ``commit`` (``invalid_request``,
  nothing written) until it is enabled. ``FEATURE_ATOMIC_COMMIT`` stays
  advertised before (spec/features.yaml: "advertised even before the fleet
  enables atomic_commit"), so a client learns the refusal, not a closed stream.
  A broker that withholds atomic commits (``withhold_atomic_commit``) does not
  implement the feature, so the fleet cannot finalize it while that broker lives.
- ``publisher_principal``: a fleet member's durable streams store each batch's
  publisher only once it is enabled (a standalone broker follows
  ``record_publishers``). A batch appended before is stored without one, as on
  upstream: the switch is forward-only.

A broker whose implemented set lacks a finalized feature may not join: it
refuses to start (`FeatureMissingError`), checked against etcd before it
registers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from felix_broker.fleet.routing import RoutingSnapshot
from felix_broker.fleet.view import FleetView
from felix_broker.session.context import RequestContext
from felix_broker.session.dispatch import Handler
from felix_wire.errors import ErrorCode
from felix_wire.messages import Commit

__all__ = [
    "ATOMIC_COMMIT",
    "LEASE_FREE_READS",
    "PUBLISHER_PRINCIPAL",
    "REPLICATED_CONDITIONS",
    "FeatureMissingError",
    "FleetFeatures",
    "implemented_features",
]

_log = logging.getLogger(__name__)

ATOMIC_COMMIT = "atomic_commit"
PUBLISHER_PRINCIPAL = "publisher_principal"
# Majority-confirmed reads of Quorum caches with FELIX_QUORUM_READS=majority
# (felix_broker/replication/reads.py): without it finalized, every read uses the lease.
LEASE_FREE_READS = "lease_free_reads"
# Guarded and idempotent writes to Quorum streams, judged by every replica at the
# entry's place in the log (decisions quorum-guarded-writes, quorum-idempotent-producers).
REPLICATED_CONDITIONS = "replicated_conditions"


class FeatureMissingError(RuntimeError):
    """The fleet finalized features this broker does not implement: it may not join."""

    def __init__(self, node_id: str, missing: Iterable[str]) -> None:
        self.missing = sorted(missing)
        super().__init__(
            f"node {node_id} cannot join this fleet: it finalized "
            f"{', '.join(self.missing)}, which this broker does not implement"
        )


def implemented_features(*, atomic_commit: bool, override: str = "") -> list[str]:
    """The fleet features this broker reports: what it implements, or the test knob's
    list (FELIX_TEST_FLEET_FEATURES) when one is set."""
    if override.strip():
        return sorted({word.strip() for word in override.split(",") if word.strip()})
    features = [LEASE_FREE_READS, PUBLISHER_PRINCIPAL, REPLICATED_CONDITIONS]
    if atomic_commit:
        features.append(ATOMIC_COMMIT)
    return sorted(features)


class FleetFeatures:
    """This broker's enabled set, kept from its routing view; `on_enabled` callbacks run
    once per feature, the first time it is enabled."""

    def __init__(
        self,
        view: FleetView,
        implemented: Iterable[str],
        *,
        gauge: Callable[[str], None] | None = None,
    ) -> None:
        self.implemented = frozenset(implemented)
        self._gauge = gauge  # called with each feature once it is enabled
        self._view = view
        self._actions: dict[str, list[Callable[[], None]]] = {}
        self._acted: set[str] = set()
        view.add_listener(self._changed)

    @property
    def enabled(self) -> frozenset[str]:
        return self.implemented & self._view.raw.finalized

    def is_enabled(self, name: str) -> bool:
        return name in self.enabled

    def missing(self, snapshot: RoutingSnapshot | None = None) -> frozenset[str]:
        """Finalized features this broker does not implement."""
        finalized = (snapshot or self._view.raw).finalized
        return finalized - self.implemented

    def on_enabled(self, name: str, action: Callable[[], None]) -> None:
        """Run `action` when `name` is enabled (now, if it already is)."""
        self._actions.setdefault(name, []).append(action)
        self._act()

    def _changed(self, previous: RoutingSnapshot, current: RoutingSnapshot) -> None:
        if current.finalized != previous.finalized:
            lacking = current.finalized - self.implemented
            if lacking:
                # Finalized while this broker was live but between the control plane's
                # check and its write: it keeps serving, without the feature.
                _log.error(
                    "the fleet finalized %s, which this broker does not implement",
                    ", ".join(sorted(lacking)),
                )
            self._act()

    def _act(self) -> None:
        for name in sorted(self.enabled - self._acted):
            self._acted.add(name)
            _log.info("fleet feature %s enabled", name)
            if self._gauge is not None:
                self._gauge(name)
            for action in self._actions.get(name, []):
                action()

    def gate_commit(self, handler: Handler[Commit]) -> Handler[Commit]:
        """`commit` refused until atomic_commit is enabled (a wrapper for the table)."""

        async def gated(request: Commit, ctx: RequestContext) -> None:
            if ATOMIC_COMMIT not in self.enabled:
                text = (
                    "commits are not enabled in this fleet: the control plane has not "
                    f"finalized {ATOMIC_COMMIT} (request_id {request.request_id})"
                )
                await ctx.write(ctx.proto.error(ErrorCode.INVALID_REQUEST, text))
                return
            await handler(request, ctx)

        return gated
