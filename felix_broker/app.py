"""The broker's composition root: builds the services, starts them, stops them.

No request logic lives here. `Broker.start()` prepares TLS and tokens, takes
the catalog (the config file's, or the control plane's live one), opens the
HTTP listener (``/ready`` answers 503 until the end of start), recovers the
logs, builds the capability services, registers their handlers in one
`DispatchTable` and binds QUIC. Where a request goes from there is
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from felix_broker.cache.service import CacheLimits, CacheService
from felix_broker.catalog import Catalog
from felix_broker.config import BrokerConfig, FsyncMode, UdpOffload, warn_ignored_knobs
from felix_broker.discovery.service import DISCOVERY_FEATURES, DiscoveryService
from felix_broker.groups.service import GroupService
from felix_broker.inspection.service import InspectionService
from felix_broker.metrics import BrokerMetrics
from felix_broker.ops_http import Health, HttpListener
from felix_broker.session.context import ConnectionState, RequestContext
from felix_broker.session.dispatch import DispatchTable
from felix_broker.session.protocol import AuthRefusedError
from felix_broker.session.quic import CLOSE_SHUTTING_DOWN, Session
from felix_broker.storage import LogConfig, LogStore
from felix_broker.streams.engine import Engine
from felix_broker.streams.guarded import GuardedWriteService
from felix_broker.streams.service import STREAM_FEATURES, StreamService
from felix_broker.streams.width import StreamWidths
from felix_broker.tls import TlsMaterial, prepare_tls
from felix_common.tokens import DevIssuer, Principal, TokenError, TokenVerifier
from felix_transport import Server, TransportConfig, serve
from felix_wire import frame
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.flags import KNOWN_FLAGS
from felix_wire.messages import Auth, Commit

if TYPE_CHECKING:  # the fleet (and so etcd) is imported only by a broker that joins one
    from felix_broker.fleet.etcd_node import EtcdNode
    from felix_broker.fleet.features import FleetFeatures
    from felix_broker.fleet.moves import MoveHold, MoveService
    from felix_broker.fleet.node import FleetNode
    from felix_broker.fleet.peer import LinkFaults, PeerDialer, PeerListener
    from felix_broker.fleet.placement import ClusterPlacement
    from felix_broker.replication.cache import CacheReplication
    from felix_broker.replication.manager import ReplicationManager
    from felix_broker.replication.reads import ReadRounds

__all__ = ["SERVER_FEATURES", "SERVER_FLAGS", "Broker", "Verifier"]

_log = logging.getLogger(__name__)

# Frame layouts this broker reads and writes: every one (idempotent publishes, 0x0100,
# are served by the guarded-write service).
SERVER_FLAGS = KNOWN_FLAGS
# The session's own features (answers shaped with codes; unknown requests answered).
SESSION_FEATURES = int(Feature.FEATURE_ERROR_CODES | Feature.FEATURE_UNSUPPORTED)
# What every broker serves, whatever its storage (cache and groups add theirs).
SERVER_FEATURES = SESSION_FEATURES | DISCOVERY_FEATURES | STREAM_FEATURES


class Verifier(Protocol):
    """Checks a Felix token for the tenant a stream names (TokenVerifier, or the
    control plane's TenantJwksVerifier)."""

    def verify(self, token: str, tenant_id: str) -> Principal: ...


class Broker:
    """A standalone Felix broker on asyncio.

    `start()` binds QUIC and HTTP and returns; `quic_port` and `http_port` then
    say where. `drain()` stops taking work and closes connections with code 0;
    `stop()` tears everything down.
    """

    def __init__(
        self,
        config: BrokerConfig,
        *,
        verifier: Verifier | None = None,
        cache_limits: CacheLimits | None = None,
        fleet: FleetNode | None = None,
    ) -> None:
        self.config = config
        # A fleet member (FleetNode) forwards and redirects what it does not lead;
        # without one the broker is standalone and imports nothing of the fleet.
        self.fleet = fleet
        self.peer_listener: PeerListener | None = None
        self.peer_dialer: PeerDialer | None = None
        self.move_hold: MoveHold | None = None  # writes held for a move's cut-over
        self.moves: MoveService | None = None  # this broker's part in planned moves
        self.cluster_placement: ClusterPlacement | None = None
        self.replication: ReplicationManager | None = None  # a fleet member's replicas
        self.cache_replication: CacheReplication | None = None  # ... of Quorum caches
        self._cache_limits = cache_limits
        fsync: Callable[[int], None] = os.fsync
        # Test mode only: the fault file's fsync and replication faults (chaos, fixture).
        self._peer_blocked: Callable[[str], bool] | None = None
        self._link_faults: LinkFaults | None = None
        self._forwards_unanswered: Callable[[], bool] | None = None
        self._auth_draining: Callable[[], bool] = lambda: False
        self._handler_fault: Callable[[], bool] | None = None
        if config.test_faults_file is not None:
            from felix_broker import clock
            from felix_broker.chaos.faults import FaultFile

            faults = FaultFile(config.test_faults_file)
            fsync, self._peer_blocked = faults.fsync, faults.peer_blocked
            self._link_faults = faults  # one-way and both-ways peer partitions
            clock.install_offset(faults.clock_offset_ns)  # clock jumps
            self._forwards_unanswered = faults.forwards_unanswered
            self._auth_draining = faults.auth_draining
            self._handler_fault = faults.handler_fault
        self.metrics = BrokerMetrics(quic_impl=config.quic_impl.value, fsync=fsync)
        self.health = Health()
        self.engine: Engine | None = None
        self.streams: StreamService | None = None
        self.cache: CacheService | None = None
        self.groups: GroupService | None = None
        self.store: LogStore | None = None
        # What exists: the config file's catalog, or the control plane's live one.
        self.catalog: Catalog = config.catalog
        # Features this broker is configured not to offer (config.withhold_*).
        self._withheld = int(Feature.FEATURE_ATOMIC_COMMIT) if config.withhold_atomic_commit else 0
        self.table = DispatchTable(
            metrics=self.metrics, withheld=self._withheld, handler_fault=self._handler_fault
        )
        self.session: Session | None = None
        self._control: list[Any] = []  # control-plane clients to close on stop
        self.tls: TlsMaterial | None = None
        self.issuer: DevIssuer | None = None
        self._verifier = verifier
        self._features = SESSION_FEATURES
        self._server: Server | None = None
        self._http: HttpListener | None = None
        self._draining = False
        self._stopped = asyncio.Event()
        # Membership and assignments in etcd (FELIX_NODE_ID and FELIX_ETCD_ENDPOINTS):
        # they feed the fleet's view (`fleet.view`).
        self.etcd: EtcdNode | None = None
        # A fleet member's enabled fleet features (fleet/features.py).
        self.fleet_features: FleetFeatures | None = None

    # -- life cycle ----------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        warn_ignored_knobs(config)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.tls = prepare_tls(
            data_dir=config.data_dir,
            cert=config.tls_cert,
            key=config.tls_key,
            ca=config.tls_ca,
            cert_export=config.tls_cert_export,
        )
        if self.fleet is None and config.peer_tls_cert is not None:
            self.fleet = self._fleet_from_config()
        if config.node_id:
            # Registered in etcd, a broker must be able to forward and redirect.
            if self.fleet is None:
                raise ValueError(
                    "node_id makes this broker a fleet member, which needs its peer "
                    "certificate: peer_tls_cert, peer_tls_key and peer_tls_ca"
                )
            if self.fleet.node_id != config.node_id:
                raise ValueError(
                    f"node_id {config.node_id!r} is not the one its peer certificate names "
                    f"({self.fleet.node_id!r})"
                )
            wildcard = self.fleet.peer_host in ("", "0.0.0.0", "::")
            if wildcard and not config.peer_advertise_addr:
                # Registered as 0.0.0.0, no other broker could forward to this one.
                bind = f"{self.fleet.peer_host}:{self.fleet.peer_port}"
                raise ValueError(
                    f"peer_bind {bind} is a wildcard address: set "
                    "peer_advertise_addr (FELIX_PEER_ADVERTISE_ADDR) to the host:port other "
                    "brokers reach this one's peer listener at"
                )
        if config.controlplane_url is not None:
            await self._connect_control_plane(config.controlplane_url)
        if self._verifier is None:
            if config.jwks_path is not None:
                self._verifier = TokenVerifier.from_file(config.jwks_path)
            else:
                self.issuer = DevIssuer.load_or_create(config.data_dir)
                self._verifier = TokenVerifier(self.issuer.jwks())
        # Listen first: /ready answers 503 while the logs recover.
        backup = self._backup_offsets if self.fleet is None else self._cluster_backup_offsets
        self._http = HttpListener(
            metrics=self.metrics,
            health=self.health,
            backup_offsets=backup,
            replication_halted=self._replication_halted,
        )
        await self._http.start(config.metrics_bind.host, config.metrics_bind.port)
        if config.durable_enabled:
            assert config.durable_storage_dir is not None
            self.store = LogStore(
                config.durable_storage_dir,
                config=LogConfig(fsync_mode=config.durable_fsync_mode),
                fsync=self.metrics.timed_fsync(),
            )
            # /ready stays 503 until every log has recovered (a corrupt log stops here).
            await self.store.recover_all()
        await self._build_services()
        if self.store is not None:
            # After the engine replayed every log's marks on worker threads: no
            # retention pass may delete a segment while one is being read.
            self.store.start()
        stream_window = min(config.pub_stream_recv_window, config.pub_conn_recv_window)
        preauth_window = max(
            4096, min(stream_window, config.preauth_max_frame_bytes + frame.HEADER_SIZE)
        )
        transport = TransportConfig.server(
            self.tls.chain_pem(),
            self.tls.key_pem(),
            impl=config.quic_impl.value,
            udp_gso=config.udp_gso is UdpOffload.AUTO,
            udp_gro=config.udp_gso is UdpOffload.AUTO,
            require_alpn=config.tls_require_alpn,
            max_datagram_size=config.max_datagram_size,
            idle_timeout=config.max_idle_timeout_ms / 1000,
            connection_receive_window=config.pub_conn_recv_window,
            stream_receive_window=stream_window,
            # Until a connection's first stream authenticates (Session trusts it then).
            preauth_stream_window=preauth_window,
            preauth_connection_budget=max(preauth_window, config.preauth_conn_recv_budget),
            preauth_global_budget=max(
                preauth_window, config.preauth_conn_recv_budget, config.preauth_recv_budget
            ),
        )
        assert self.session is not None
        self._server = await serve(
            transport,
            config.quic_bind.host,
            config.quic_bind.port,
            self.session.on_connection,
            max_connections=config.max_client_connections,
        )
        self.health.failed_logs = self.failed_logs
        self.metrics.failed_logs.set_function(self.failed_logs)

        if config.node_id:
            try:
                await self._join_fleet()
            except BaseException:
                # Refused by the fleet (a finalized feature it lacks, its node id in
                # use) or etcd unreachable: nothing it bound stays open.
                await self.stop()
                raise
        self.health.mark_ready()

    def failed_logs(self) -> int:
        """Logs of every kind in the failed state (``/ready`` and ``/metrics``)."""
        count = len(self.store.failed_logs()) if self.store is not None else 0
        if self.cache is not None:
            count += self.cache.failed_logs()
        if self.groups is not None:
            count += self.groups.failed_logs()
        return count

    async def _join_fleet(self) -> None:
        """Read the fleet's assignments into the routing view, then register this
        broker under its lease (client and peer addresses as bound or advertised)."""
        from felix_broker.fleet.etcd_node import EtcdNode

        config = self.config
        assert self.fleet is not None  # checked at start
        client_addr = config.client_advertise_addr
        if not client_addr and config.quic_bind.host not in ("", "0.0.0.0", "::"):
            client_addr = str(type(config.quic_bind)(config.quic_bind.host, self.quic_port))
        peer_addr = config.peer_advertise_addr
        if not peer_addr and self.peer_listener is not None:
            peer_addr = self.peer_addr
        ops_addr = config.ops_advertise_addr
        if not ops_addr and config.metrics_bind.host not in ("", "0.0.0.0", "::"):
            ops_addr = str(type(config.metrics_bind)(config.metrics_bind.host, self.http_port))
        assert self.fleet_features is not None  # built with the services
        self.etcd = EtcdNode(
            view=self.fleet.view,
            endpoints=[(e.host, e.port) for e in config.etcd_endpoints],
            prefix=config.etcd_prefix,
            lease_ttl_ms=config.node_lease_ttl_ms,
            client_addr=client_addr,
            peer_addr=peer_addr,
            ops_addr=ops_addr,
            features=sorted(self.fleet_features.implemented),
        )
        await self.etcd.start()

    async def _build_services(self) -> None:
        """Every capability service, its shards recovered, its handlers in the table."""
        config, catalog = self.config, self.catalog
        discovery = self._fleet_seam() if self.fleet is not None else DiscoveryService(catalog)
        table = self.table
        self.engine = Engine(catalog, config, self.metrics, self.store)
        await self.engine.recover()  # producer tables and state views, before /ready
        self.streams = StreamService(
            config=config, engine=self.engine, metrics=self.metrics, durable=self.store is not None
        )
        self.cache = CacheService(
            config=config, catalog=catalog, metrics=self.metrics, limits=self._cache_limits
        )
        await self.cache.start()  # reloads cache logs, starts the TTL pass
        guarded = GuardedWriteService(
            engine=self.engine,
            metrics=self.metrics,
            widths=StreamWidths(self.metrics),
            hold_bytes=self.streams.hold_publish_bytes,
        )
        self.streams.idempotent_frames = guarded.publish_frame
        self.streams.widths = guarded.widths
        inspection = self._inspection()
        services: list[
            StreamService
            | DiscoveryService
            | CacheService
            | GroupService
            | GuardedWriteService
            | InspectionService
        ] = [self.streams, discovery, self.cache, guarded, inspection]
        if config.durable_enabled:
            # Consumer groups need durable storage (N4, Q1): none without it.
            self.groups = GroupService(
                config=config, catalog=catalog, engine=self.engine, metrics=self.metrics
            )
            await self.groups.start()  # replays the group logs (cursors, dead letters)
            services.append(self.groups)
        for service in services:
            service.register(table)
            self._features |= service.features
        self._features &= ~self._withheld
        if self.fleet is not None:
            self._fleet_feature_switches()
        self.session = Session(
            config=config,
            metrics=self.metrics,
            table=table,
            authenticate=self._authenticate,
            server_flags=int(SERVER_FLAGS),
            features=lambda: self._features,
        )
        self.session.on_close.append(self.streams.end_connection)
        if self.fleet is not None:
            await self._start_peer_listener()

    def _replication_halted(self) -> list[Any]:
        """`/replication/halted`: this broker's halted replicas; `[]` with none."""
        return self.replication.halted() if self.replication is not None else []

    def _inspection(self) -> InspectionService:
        def connections() -> list[ConnectionState]:
            return list(self.session.connections.values()) if self.session else []

        if self.fleet is None:
            return InspectionService(
                catalog=self.catalog, store=self.store, connections=connections
            )
        from felix_broker.fleet.inspection import ClusterInspection
        from felix_broker.replication.inspect import inspection
        from felix_common.fleet import ShardId

        def replica(shard: ShardId) -> dict[str, Any] | None:
            driver = self.replication.driver(shard) if self.replication is not None else None
            return inspection(driver) if driver is not None else None

        return ClusterInspection(
            catalog=self.catalog,
            store=self.store,
            connections=connections,
            view=self.fleet.view,
            replica=replica,
        )

    # -- the fleet ----------------------------------------------------------------------

    def _fleet_from_config(self) -> FleetNode:
        """A fleet member's setup from peer_bind and the peer TLS files; the node id is
        the certificate's."""
        from felix_broker.fleet.node import FleetNode
        from felix_broker.fleet.peer import PeerTls
        from felix_broker.fleet.routing import RoutingSnapshot
        from felix_broker.fleet.view import FleetView

        config = self.config
        assert config.peer_tls_cert and config.peer_tls_key and config.peer_tls_ca
        tls = PeerTls.from_files(
            None, config.peer_tls_cert, config.peer_tls_key, config.peer_tls_ca
        )
        view = FleetView(RoutingSnapshot(node_id=tls.node_id))
        return FleetNode(tls, view, config.peer_bind.host, config.peer_bind.port)

    def _fleet_feature_switches(self) -> None:
        """A fleet member acts on atomic_commit and publisher_principal only once the
        fleet finalized them (fleet/features.py); record_publishers is a single
        broker's switch."""
        from felix_broker.fleet.features import (
            PUBLISHER_PRINCIPAL,
            FleetFeatures,
            implemented_features,
        )

        assert self.fleet is not None and self.engine is not None
        config, engine = self.config, self.engine
        implemented = implemented_features(
            atomic_commit=bool(self._features & Feature.FEATURE_ATOMIC_COMMIT),
            override=config.fleet_features_override,
        )
        gauge = self.metrics.fleet_feature_enabled
        features = self.fleet_features = FleetFeatures(
            self.fleet.view, implemented, gauge=lambda name: gauge.labels(feature=name).set(1)
        )
        if config.record_publishers:
            _log.warning(
                "record_publishers is ignored on a fleet member: finalize the "
                "publisher_principal fleet feature instead"
            )
        engine.set_record_publishers(False)
        features.on_enabled(PUBLISHER_PRINCIPAL, lambda: engine.set_record_publishers(True))
        self.table.wrap(Commit, features.gate_commit)

    def _fleet_seam(self) -> DiscoveryService:
        """A fleet member's dispatch table (cluster placement) and discovery."""
        from felix_broker.fleet.discovery import ClusterDiscovery
        from felix_broker.fleet.peer import PeerDialer
        from felix_broker.fleet.placement import ClusterPlacement

        fleet = self.fleet
        assert fleet is not None
        self.peer_dialer = PeerDialer(
            fleet.tls, fleet.limits, impl=self.config.quic_impl.value, faults=self._link_faults
        )

        async def hold_bytes(ctx: RequestContext, size: int) -> Callable[[], None]:
            assert self.streams is not None  # built before any request is dispatched
            return await self.streams.hold_publish_bytes(ctx, size)

        def stale_width(
            ctx: RequestContext, tenant: str, namespace: str, stream: str, shards: int
        ) -> int | None:
            widths = self.streams.widths if self.streams is not None else None
            if widths is None:
                return None
            return widths.stale(ctx.io, tenant, namespace, stream, keyed=True, actual=shards)

        from felix_broker.fleet.moves import MoveHold

        self.move_hold = MoveHold(
            fleet.view,
            hold_ms=self.config.shard_move_hold_ms,
            hold_max=self.config.shard_move_hold_max,
        )
        placement = ClusterPlacement(
            view=fleet.view,
            catalog=lambda: self.catalog,
            dialer=self.peer_dialer,
            ack_on_commit=self.config.ack_on_commit,
            hold_bytes=hold_bytes,
            hold=self.move_hold,
            stale_width=stale_width,
        )
        self.table = DispatchTable(placement, handler_fault=self._handler_fault)
        placement.redispatch = self.table.dispatch
        self.cluster_placement = placement
        return ClusterDiscovery(self.catalog, fleet.view)

    async def _start_peer_listener(self) -> None:
        from felix_broker.fleet.moves import MoveService
        from felix_broker.fleet.owner import OwnerService
        from felix_broker.fleet.peer import PeerListener, PeerTable
        from felix_wire.fleet import (
            ForwardCacheOp,
            ForwardPublish,
            MoveCaughtUp,
            MoveChunk,
            MoveDone,
            MoveFinal,
        )

        fleet, config = self.fleet, self.config
        assert fleet is not None and self._verifier is not None
        owner = OwnerService(
            view=fleet.view,
            catalog=lambda: self.catalog,
            engine=self._engine,
            table=self.table,
            verify=self._verifier.verify,
            server_flags=int(SERVER_FLAGS),
            features=lambda: self._features,
            max_frame_bytes=config.max_frame_bytes,
            metrics=self.metrics,
            hold=self.move_hold,
            unanswered=self._forwards_unanswered,
        )
        assert self.peer_dialer is not None
        self.moves = MoveService(
            view=fleet.view,
            dialer=self.peer_dialer,
            storage=self._move_storage(),
            report=self._report_move,
            catchup_bytes=config.shard_move_catchup_bytes,
            catchup_passes=config.shard_move_catchup_passes,
        )
        fleet.view.add_listener(self.moves.on_change)
        if self.cluster_placement is not None:
            self.cluster_placement.local_owner = owner.handle
        table = PeerTable()
        table.register(ForwardPublish, owner.handle)
        table.register(ForwardCacheOp, owner.handle)
        table.register(MoveChunk, self.moves.handle)
        table.register(MoveDone, self.moves.handle)
        table.register(MoveCaughtUp, self.moves.handle)
        table.register(MoveFinal, self.moves.handle)
        from felix_broker.replication.core import Config as ReplicationConfig
        from felix_broker.replication.manager import ReplicationManager

        assert self.engine is not None
        self.replication = ReplicationManager(
            fleet.view,
            lambda: self.catalog,
            self._engine,
            self.peer_dialer,
            config.data_dir / "replication",
            ReplicationConfig(
                quorum_timeout_ms=config.publish_quorum_timeout_ms,
                ack_before_majority=config.test_quorum_ack_before_majority,
            ),
            blocked=self._peer_blocked,
            report=self._report_refusal,  # etcd joins later: checked at each report
        )
        self.engine.replication_hook = self.replication.publish
        self.replication.conditions_enabled = self._conditions_enabled
        self.engine.read_gate = self.replication.read_refusal
        if self.groups is not None:  # Quorum streams' group changes ride their log
            from felix_broker.replication.groups import GroupReplication, GroupStreamApplier

            groups, replication = self.groups, self.replication
            replication.wrap_applier = lambda stream: GroupStreamApplier(stream, groups)
            groups.replication = GroupReplication(replication.driver, lambda: fleet.view.snapshot)
        self.replication.start()
        self.cache_replication = self._cache_replication(config)
        from felix_wire.fleet import ReplicaReadRound

        self.cache_replication.reads = reads = self._read_rounds(config)
        table.register(ReplicaReadRound, reads.handle)
        for kind, handler in self.replication.service.handlers.items():
            table.register(kind, handler)
        self.peer_listener = PeerListener(
            fleet.tls, table.handle, fleet.limits, faults=self._link_faults
        )
        await self.peer_listener.start(fleet.peer_host, fleet.peer_port)

    def _conditions_enabled(self) -> bool:
        """Whether guarded and idempotent writes to Quorum streams are let in
        (fleet/features.py, replicated_conditions)."""
        from felix_broker.fleet.features import REPLICATED_CONDITIONS

        return self.fleet_features is not None and self.fleet_features.is_enabled(
            REPLICATED_CONDITIONS
        )

    def _cache_replication(self, config: BrokerConfig) -> CacheReplication:
        """Quorum caches (RF > 1) replicated like Quorum streams, on the same peer handlers."""
        from felix_broker.replication.cache import CacheReplication, CacheShards
        from felix_broker.replication.core import Config as ReplicationConfig

        assert self.fleet is not None and self.replication is not None
        assert self.cache is not None and self.peer_dialer is not None
        cache = self.cache
        replication = CacheReplication(
            self.fleet.view,
            lambda: self.catalog,
            CacheShards(cache.limits, cache.evictions, cache.adopt, cache.release),
            self.peer_dialer,
            config.data_dir / "replication",
            ReplicationConfig(
                quorum_timeout_ms=config.publish_quorum_timeout_ms,
                ack_before_majority=config.test_quorum_ack_before_majority,
            ),
            self.replication.service,
            blocked=self._peer_blocked,
            on_event=self.replication.on_event,
        )
        cache.replication = replication
        replication.start()
        return replication

    def _read_rounds(self, config: BrokerConfig) -> ReadRounds:
        """Majority read rounds of Quorum caches: on with FELIX_QUORUM_READS=majority
        once the fleet finalized lease_free_reads (replication/reads.py)."""
        from felix_broker.config import QuorumReads
        from felix_broker.fleet.features import LEASE_FREE_READS
        from felix_broker.replication.reads import ReadRounds

        assert self.fleet is not None and self.replication is not None
        assert self.peer_dialer is not None
        view = self.fleet.view
        majority = config.quorum_reads is QuorumReads.MAJORITY

        def address_of(node: str) -> str | None:
            member = view.snapshot.members.get(node)
            return member.peer_addr if member is not None else None

        def active() -> bool:
            features = self.fleet_features
            return majority and features is not None and features.is_enabled(LEASE_FREE_READS)

        return ReadRounds(
            self.peer_dialer,
            address_of,
            self.replication.service,
            timeout_ms=config.publish_quorum_timeout_ms,
            active=active,
            blocked=self._peer_blocked,
        )

    def _move_storage(self) -> Any:
        from felix_broker.fleet.moves import ServiceStorage
        from felix_broker.fleet.routing import ShardId

        def stream_durable(shard: ShardId) -> bool:
            spec = self.catalog.stream(shard.tenant, shard.namespace, shard.name)
            return spec is not None and spec.durable

        def states() -> list[Any]:
            return list(self.session.connections.values()) if self.session else []

        return ServiceStorage(
            root=self.config.durable_storage_dir if self.config.durable_enabled else None,
            stream_durable=stream_durable,
            cache_durable=self.cache is not None and self.cache.durable,
            streams=lambda: self.streams,
            engine=lambda: self.engine,
            groups=lambda: self.groups,
            cache=lambda: self.cache,
            states=states,
        )

    async def _report_move(self, shard: Any, record: Any) -> None:
        if self.etcd is None:
            raise RuntimeError("not registered in etcd: a move's copy cannot be reported")
        await self.etcd.report_move(shard, record)

    async def _report_refusal(self, shard: Any, record: Any) -> None:
        if self.etcd is None:
            raise RuntimeError("not registered in etcd: a refusal cannot be reported")
        await self.etcd.report_refusal(shard, record)

    async def hand_off(self) -> None:
        """A fleet member told to stop: readiness off, ask the placer to drain it, keep
        serving until it leads nothing (bounded by shutdown_handoff_timeout_ms). A
        standalone broker, or a timeout of 0, hands nothing off."""
        timeout = self.config.shutdown_handoff_timeout_ms / 1000
        if self.etcd is None or self.fleet is None or timeout <= 0:
            return
        from felix_broker.fleet.routing import AssignmentState

        self.health.mark_draining()
        view = self.fleet.view
        node = view.snapshot.node_id

        def leading() -> int:
            return sum(
                1
                for route in view.raw.routes.values()
                if route.leader == node and route.state is not AssignmentState.UNAVAILABLE
            )

        others = [n for n in view.raw.members if n != node]
        if not others or not leading():
            return
        try:
            if not await self.etcd.request_drain():
                return
        except Exception as exc:  # etcd away: nothing to hand off to
            _log.warning("could not ask for this broker's drain: %s", exc)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while leading() and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await view.wait_changed()
        if leading():
            _log.warning("hand-off timed out: %d shard(s) still led here fail over", leading())

    def _engine(self) -> Engine:
        assert self.engine is not None, "not started"
        return self.engine

    @property
    def peer_addr(self) -> str:
        """host:port of the peer listener (a fleet member only)."""
        assert self.peer_listener is not None, "not a started fleet member"
        host, port = self.peer_listener.address
        return f"{host}:{port}"

    @property
    def features(self) -> int:
        """Every feature this broker advertises (before the per-stream window rule)."""
        return self._features

    @property
    def quic_port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.address[1])

    @property
    def http_port(self) -> int:
        assert self._http is not None, "not started"
        return self._http.port

    @property
    def ca_path(self) -> Path | None:
        """The CA certificate clients should trust (None when the operator's
        certificate came without one)."""
        assert self.tls is not None, "not started"
        return self.tls.ca_path

    async def drain(self) -> None:
        """Stop taking work: /ready turns 503, new auth answers `draining`, queued
        publishes finish and their answers are written, then every connection
        closes with code 0."""
        if self._draining:
            return
        self._draining = True
        self.health.mark_draining()
        timeout = self.config.drain_timeout_ms / 1000
        if self.engine is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.engine.drain()
        if self.session is not None:
            # The drained publishes' answers are queued on their streams: write them.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.session.flush_answers()
            self.session.close_all(CLOSE_SHUTTING_DOWN, "broker shutting down")
            await self.session.wait_closed(timeout)

    async def stop(self) -> None:
        await self.drain()
        if self.moves is not None:
            await self.moves.close()
        if self.etcd is not None:
            await self.etcd.stop()  # revokes the lease: the placer re-places at once
        if self.peer_listener is not None:
            await self.peer_listener.close()
        if self.cache_replication is not None:
            await self.cache_replication.close()
        if self.replication is not None:
            await self.replication.close()
        if self.peer_dialer is not None:
            await self.peer_dialer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._http is not None:
            await self._http.close()
        if self.cache is not None:
            await self.cache.close()
        if self.groups is not None:
            await self.groups.close()
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            await self.store.aclose()
        for client in reversed(self._control):
            await client.close()
        if self._link_faults is not None:  # test mode: the clock offset goes with the broker
            from felix_broker import clock

            clock.install_offset(None)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _authenticate(self, auth: Auth) -> Principal:
        if self._draining or self._auth_draining():  # the latter: a test fault only
            raise AuthRefusedError(ErrorCode.DRAINING, "broker is shutting down", "draining")
        assert self._verifier is not None
        try:
            return self._verifier.verify(auth.token, auth.tenant_id)
        except TokenError as exc:
            self.metrics.auth_failures.labels(reason=exc.check).inc()
            raise AuthRefusedError(ErrorCode.UNAUTHENTICATED, str(exc), exc.check) from None

    # -- control plane ----------------------------------------------------------------

    async def _connect_control_plane(self, url: str) -> None:
        """Take the catalog and the tenants' token keys from the control plane: a
        snapshot now (start fails if it cannot be had), then changes as they come."""
        from felix_broker.catalog.live import LiveCatalog, TenantJwksVerifier

        config = self.config
        if config.controlplane_sync_token_file is not None:
            sync_token = config.controlplane_sync_token_file.read_text().strip()
        else:
            sync_token = os.environ.get("FELIX_CONTROLPLANE_SYNC_TOKEN", "")
        if not sync_token:
            raise ValueError(
                "controlplane_url needs a sync token: controlplane_sync_token_file "
                "or FELIX_CONTROLPLANE_SYNC_TOKEN"
            )
        ca = str(config.controlplane_ca) if config.controlplane_ca is not None else None
        catalog = LiveCatalog(url, sync_token=sync_token, ca_file=ca)
        verifier = TenantJwksVerifier(url, ca_file=ca, known_tenant=catalog.tenant_exists)
        catalog.add_listener(verifier.on_catalog_change)
        catalog.add_listener(self.on_catalog_change)
        await catalog.start()
        self._control.append(catalog)
        await verifier.start(catalog.tenant_ids())
        self._control.append(verifier)
        self.catalog = catalog
        self._verifier = verifier

    def on_catalog_change(self, change: Any) -> None:
        """A stream deleted from the catalog ends its subscriptions (their event streams
        finish) and forgets its shards, so a stream created again starts afresh."""
        if not (change.op == "delete" and change.kind == "stream"):
            return
        if self.streams is None or self.session is None:
            return
        states = list(self.session.connections.values())
        self.streams.end_stream_subscriptions(states, change.tenant, change.namespace, change.name)

    # -- backup offsets (GET /backup/offsets) -------------------------------------------

    def _cluster_backup_offsets(self) -> dict[str, object]:
        """A fleet member's answer: what it leads, by its routing view (fleet/backup.py)."""
        from felix_broker.fleet.backup import cluster_backup_offsets, scope_key
        from felix_broker.fleet.routing import ShardKind

        assert self.fleet is not None
        failed = [
            scope_key(ShardKind.STREAM, k.tenant, k.namespace, k.stream, k.shard)
            for k in (self.store.failed_logs() if self.store is not None else [])
        ]
        catalogued = {
            scope_key(ShardKind.STREAM, s.tenant_id, s.namespace, s.name, i)
            for s in self.catalog.streams()
            for i in range(s.shards)
        } | {
            scope_key(ShardKind.CACHE, c.tenant_id, c.namespace, c.name, i)
            for c in self.catalog.caches()
            for i in range(c.shards)
        }
        snapshot = self.fleet.view.snapshot
        settling: dict[tuple[str, tuple[str, str, str, int]], str] = {}
        for shard, route in snapshot.routes.items():
            if route.leader != snapshot.node_id:
                continue
            find = self.catalog.stream if shard.kind is ShardKind.STREAM else self.catalog.cache
            spec = find(shard.tenant, shard.namespace, shard.name)
            if spec is None or not spec.replicated:
                continue
            driver = self.replication.driver(shard) if self.replication is not None else None
            refused = driver.refusal() if driver is not None else (None, "no replica here yet")
            if refused is not None:
                # Named leader, replica not open: readers are told not_ready (as the
                # replication manager's read gate says), unless the replica says more.
                key = scope_key(shard.kind, shard.tenant, shard.namespace, shard.name, shard.shard)
                settling[key] = refused[1] or "not_ready"
        return cluster_backup_offsets(
            snapshot,
            self._backup_offsets(),
            failed=failed,
            catalogued=catalogued,
            settling=settling,
        )

    def _backup_offsets(self) -> dict[str, object]:
        """Every shard's committed log offsets (one past the last record a reader may see).

        A standalone broker leads every shard it serves, at generation 0. Group
        logs are read before the records' (the seed's rule), so a group offset
        never names a record past ``records``. In-memory streams and caches are
        listed under ``skipped`` as ``not_durable``.
        """
        groups = self.groups.committed_offsets() if self.groups is not None else {}
        streams = self.store.offsets() if self.store is not None else {}
        caches = self.cache.committed_offsets() if self.cache is not None else {}
        shards: list[dict[str, object]] = []
        skipped: list[dict[str, object]] = []

        def shard(scope: tuple[str, str, str, int], kind: str) -> dict[str, object]:
            tenant, namespace, name, index = scope
            return {
                "tenant_id": tenant,
                "namespace": namespace,
                "name": name,
                "shard": index,
                "kind": kind,
            }

        # What a reader may see: what an fsync covered under on_commit,
        # everything appended (and so acknowledged) under the other modes.
        on_commit = self.config.durable_fsync_mode is FsyncMode.ON_COMMIT
        for key, offsets in streams.items():
            scope = (key.tenant, key.namespace, key.stream, key.shard)
            records = offsets.durable if on_commit else offsets.next
            logs = {"records": records}
            if scope in groups:
                logs["group_cursors"] = groups[scope]
            shards.append(shard(scope, "stream") | {"generation": 0, "logs": logs})
        for scope, records in sorted(caches.items()):
            shards.append(shard(scope, "cache") | {"generation": 0, "logs": {"records": records}})
        for spec in self.catalog.streams():
            if self.store is None or not spec.durable:
                for index in range(spec.shards):
                    scope = (spec.tenant_id, spec.namespace, spec.name, index)
                    skipped.append(shard(scope, "stream") | {"reason": "not_durable"})
        if self.cache is None or not self.cache.durable:
            for cache_spec in self.catalog.caches():
                for index in range(cache_spec.shards):
                    scope = (cache_spec.tenant_id, cache_spec.namespace, cache_spec.name, index)
                    skipped.append(shard(scope, "cache") | {"reason": "not_durable"})
        return {"node_id": "", "shards": shards, "skipped": skipped}
