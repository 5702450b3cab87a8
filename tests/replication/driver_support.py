"""Three replicas of one shard over the real peer channel (QUIC, mutual TLS, loopback)
with real files, each broker's replication driven by hand: the harness of the driver
tests (and of the reads and inspect tests built on it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from felix_broker.catalog import StaticCatalog, StreamSpec
from felix_broker.config import load_config
from felix_broker.fleet.peer import PeerDialer, PeerLimits, PeerListener, PeerTls
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.apply import StreamApplier
from felix_broker.replication.core import Config, Entry
from felix_broker.replication.disk import ReplicaDisk
from felix_broker.replication.driver import ReplicaDriver
from felix_broker.replication.service import ReplicationService, peer_sender
from felix_broker.storage import FsyncMode, LogConfig, LogStore
from felix_broker.streams.engine import Engine
from felix_common.fleet import ShardId, ShardKind
from felix_transport import CertKeyPair

from ..support import waits

SHARD = ShardId(ShardKind.STREAM, "t1", "ns", "orders", 0)
NODES = ("b1", "b2", "b3")
LIMITS = PeerLimits(request_timeout=1.0, connect_timeout=0.5)
CONFIG = Config(quorum_timeout_ms=1500, retransmit_ms=100)
STREAM = StreamSpec("t1", "ns", "orders", durable=True, replication_factor=3)


@dataclass
class Broker:
    """One broker's replication: its peer listener, dialer, service and driver."""

    node: str
    folder: Path
    tls: PeerTls
    address: str = ""
    listener: PeerListener | None = None
    dialer: PeerDialer | None = None
    service: ReplicationService = field(default_factory=ReplicationService)
    driver: ReplicaDriver | None = None
    engine: Engine | None = None
    store: LogStore | None = None


class Fleet:
    def __init__(
        self, root: Path, ca: CertKeyPair, *, streams: bool = False, compact_every: int = 1024
    ) -> None:
        self.root = root
        self.streams = streams
        self.compact_every = compact_every
        self.brokers = {n: Broker(n, root / n, PeerTls.issue(ca, n)) for n in NODES}

    def address_of(self, node: str) -> str | None:
        return self.brokers[node].address or None

    async def start(self, node: str) -> ReplicaDriver:
        """Start (or restart) `node` from what its disk holds."""
        b = self.brokers[node]
        b.service = ReplicationService()
        b.listener = PeerListener(b.tls, b.service.handle, LIMITS)
        port = int(b.address.rsplit(":", 1)[1]) if b.address else 0  # a restart keeps its port
        await b.listener.start("127.0.0.1", port)
        host, port = b.listener.address
        b.address = f"{host}:{port}"
        b.dialer = PeerDialer(b.tls, LIMITS)
        disk = ReplicaDisk(b.folder / "replication", compact_every=self.compact_every)
        applier = None
        if self.streams:  # the shard's real stream storage, fed committed batches
            config = load_config(environ={}, overrides={"data_dir": str(b.folder)}, cwd=b.folder)
            assert config.durable_storage_dir is not None
            b.store = LogStore(
                config.durable_storage_dir, config=LogConfig(fsync_mode=FsyncMode.ON_COMMIT)
            )
            catalog = StaticCatalog(streams=[STREAM], caches=[])
            b.engine = Engine(catalog, config, BrokerMetrics(), b.store)
            applier = StreamApplier(b.engine.shard(STREAM, 0))
        b.driver = ReplicaDriver.open(
            SHARD,
            node,
            NODES,
            disk,
            peer_sender(b.dialer, self.address_of),
            config=CONFIG,
            applier=applier,
        )
        b.service.add(b.driver)
        b.driver.start()
        return b.driver

    async def stop(self, node: str) -> None:
        """The broker's process ends: its listener, dialer and driver go (the disk stays)."""
        b = self.brokers[node]
        if b.driver is not None:
            await b.driver.close()
            b.driver = None
        if b.listener is not None:
            await b.listener.close()
            b.listener = None
        if b.dialer is not None:
            await b.dialer.close()
            b.dialer = None
        if b.engine is not None:
            b.engine.close()
            b.engine = None
        if b.store is not None:
            await b.store.aclose()
            b.store = None

    async def cut(self, node: str) -> None:
        """`node` stays up but nobody can reach it (its listener is gone)."""
        b = self.brokers[node]
        assert b.listener is not None
        await b.listener.close()
        b.listener = None

    def driver(self, node: str) -> ReplicaDriver:
        driver = self.brokers[node].driver
        assert driver is not None
        return driver

    def on_disk(self, node: str) -> tuple[Entry, ...]:
        """What `node`'s files hold, read by a separate reader (as after a crash)."""
        disk = ReplicaDisk(self.brokers[node].folder / "replication")
        try:
            return disk.recover().entries
        finally:
            disk.close()

    async def close(self) -> None:
        for node in NODES:
            await self.stop(node)


async def until(check: Callable[[], object], seconds: float = 5.0) -> None:
    """The driver tests' wait: tests/support/waits.py's, bounded at 5 s unless told."""
    await waits.until(check, seconds)


async def opened(fleet: Fleet, node: str, generation: int) -> ReplicaDriver:
    driver = fleet.driver(node)
    await driver.promote(generation)
    await until(lambda: driver.replica.mark is not None)
    return driver
