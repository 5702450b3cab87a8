"""What a broker needs to be a fleet member: its peer identity, its routing view,
where its peer listener binds and the peer bounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from felix_broker.fleet.peer import PeerLimits, PeerTls
from felix_broker.fleet.view import FleetView

__all__ = ["FleetNode"]


@dataclass(frozen=True)
class FleetNode:
    """A fleet member's setup. `view` is fed by the assignment watcher (or a test)."""

    tls: PeerTls
    view: FleetView
    peer_host: str = "127.0.0.1"
    peer_port: int = 0
    limits: PeerLimits = field(default_factory=PeerLimits)

    @property
    def node_id(self) -> str:
        return self.tls.node_id
