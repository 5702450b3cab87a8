"""A broker's presence in etcd: its client, its membership and the watcher feeding its view.

Built by the composition root (`felix_broker.app`) only when FELIX_NODE_ID and
FELIX_ETCD_ENDPOINTS are set. `start()` reads the fleet's assignments into the
`FleetView` (so the first snapshot is complete), then registers the broker;
`view.snapshot` is what placement and discovery read from then on. `stop()`
revokes the lease, so the placer re-places this broker's shards at once.
"""

from __future__ import annotations

import logging

from felix_broker.fleet.assignments import AssignmentWatcher
from felix_broker.fleet.features import FeatureMissingError
from felix_broker.fleet.membership import Membership
from felix_broker.fleet.view import FleetView
from felix_common.etcd import EtcdClient
from felix_common.fleet import (
    Drain,
    Keyspace,
    Member,
    MoveCopied,
    PromotionRefusal,
    ShardId,
    encode_record,
)

__all__ = ["EtcdNode"]

_log = logging.getLogger(__name__)


class EtcdNode:
    def __init__(
        self,
        *,
        view: FleetView,
        endpoints: list[tuple[str, int]],
        prefix: str,
        lease_ttl_ms: int,
        client_addr: str,
        peer_addr: str,
        features: list[str],
        ops_addr: str = "",
    ) -> None:
        # Every etcd call is bounded by a third of the TTL, so one slow call never
        # eats the lease's margin.
        self.client = EtcdClient(endpoints, timeout_s=max(0.5, lease_ttl_ms / 3000))
        self.keys = Keyspace(prefix)
        self.view = view
        node_id = view.snapshot.node_id
        self.watcher = AssignmentWatcher(self.client, self.keys, self.view)
        record = Member(
            node_id=node_id,
            client_addr=client_addr,
            peer_addr=peer_addr,
            features=features,
            incarnation=0,  # chosen at each registration
            ops_addr=ops_addr or None,
        )
        self._features = frozenset(features)
        self.membership = Membership(
            self.client,
            self.keys,
            record,
            ttl_ms=lease_ttl_ms,
            view=self.view,
            catch_up=self.watcher.catch_up,
        )

    @property
    def node_id(self) -> str:
        return self.membership.node_id

    async def start(self) -> None:
        """Read the fleet, refuse to join when it finalized a feature this broker lacks
        (FeatureMissingError: finalizing is one-way), then register."""
        await self.watcher.start()
        missing = self.view.raw.finalized - self._features
        if missing:
            await self.watcher.stop()
            raise FeatureMissingError(self.node_id, missing)
        await self.membership.start()

    async def stop(self) -> None:
        await self.membership.stop()
        await self.watcher.stop()
        await self.client.close()

    async def report_move(self, shard: ShardId, record: MoveCopied) -> None:
        """Report a move's copy installed here (under this broker's own lease)."""
        lease = self.membership.lease_id
        if not lease or not self.membership.held:
            raise RuntimeError("this broker holds no lease: it cannot report a copy")
        key = self.keys.move_progress(self.node_id, shard)
        await self.client.put(key, encode_record(record), lease=lease)

    async def report_refusal(self, shard: ShardId, record: PromotionRefusal | None) -> None:
        """Report a refused promotion of `shard` here (under this broker's own lease),
        or withdraw the report (None): it then holds a newer generation."""
        key = self.keys.promotion_refused(self.node_id, shard)
        if record is None:
            await self.client.delete(key)
            return
        lease = self.membership.lease_id
        if not lease or not self.membership.held:
            raise RuntimeError("this broker holds no lease: it cannot report a refusal")
        await self.client.put(key, encode_record(record), lease=lease)

    async def request_drain(self) -> bool:
        """Ask the placer to drain this broker (under its own lease: the request goes
        with the broker). False when it holds no lease."""
        lease = self.membership.lease_id
        if not lease or not self.membership.held:
            return False
        record = encode_record(Drain(requested_by=f"{self.node_id} (shutting down)"))
        await self.client.put(self.keys.drain_request(self.node_id), record, lease=lease)
        return True
