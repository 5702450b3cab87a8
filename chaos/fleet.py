"""A real fleet for chaos runs: etcd, a control plane and N brokers, each its own process.

Built from the same parts as ``felix-broker fixture --brokers N`` (its control plane
helper, peer certificates and TLS material; ``felix_common.etcd_process`` for etcd),
but it keeps what the fixture hides and a nemesis needs: every process's PID, fixed
ports per broker (a broker restarted on its data folder comes back at the same
address, as a restarted machine does), a per-broker fault file (FELIX_TEST_FAULTS)
and a UDP link interposer in front of the first broker.

The shard layout is a parameter (`Layout`): the stream the workload checks as a
log (durable or not, how many shards), so Quorum streams slot in once the catalog
has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from felix_broker.catalog import CacheSpec, Routing, StaticCatalog, StreamSpec
from felix_broker.chaos.faults import FsyncFault, write_fault
from felix_broker.fixture.interposer import LinkInterposer
from felix_broker.fixture.probe import ProbeError, fleet_ready
from felix_broker.fixture.run import FLEET_FEATURES as _FLEET_FEATURES
from felix_broker.fixture.run import FixtureControlPlane as _FixtureControlPlane
from felix_broker.fixture.run import FixtureParts as _Parts
from felix_broker.fixture.run import catalog_section as _catalog_section
from felix_broker.fixture.run import full_rights
from felix_broker.fixture.run import member_env as _member_env
from felix_broker.fixture.run import write_tls as _write_tls
from felix_client import Client, ClientConfig, connect
from felix_client.errors import BrokerError, ClientError
from felix_common.catalog import Consistency
from felix_common.etcd_process import EtcdProcess
from felix_transport.events import StreamClosedError
from felix_wire.messages import ShardKind

__all__ = ["NAMESPACE", "TENANT", "BrokerProcess", "ChaosFleet", "FleetError", "Layout"]

_log = logging.getLogger(__name__)

TENANT = "t1"
NAMESPACE = "default"
READY_STREAM = "chaos-ready"
_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 10.0
_LEASE_TTL_MS = 3000  # a lost broker's shards go unavailable within ~3 s


class FleetError(Exception):
    """A part of the fleet did not start, or did not come back."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What the workload runs on: the checked logs, each read back whole at the end
    and judged by every rule (a durable RF1 stream acknowledged after the write, and
    ``quorum_stream``, a ``Quorum`` stream with ``quorum_replicas`` replicas, on
    every broker of a 3-broker fleet: its acks promise a majority's disks, so kill -9
    of its leader must promote a caught-up follower and lose nothing), the
    in-memory stream and the cache (``Quorum`` with ``cache_replicas`` replicas when
    that is above 1). ``quorum_stream=None`` leaves it out.

    ``lose_disk_on_restart`` is a deliberately broken fleet: a restarted broker
    comes back with an empty durable folder (a data folder on tmpfs, a replaced
    disk) and serves its shards anyway, which is the bug class of a lagging
    replica promoted or a rejoining one not truncated: acknowledged writes gone.

    ``quorum_ack_before_majority`` is another: every broker runs with
    ``FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY`` (test mode only), so a Quorum leader
    acknowledges a write once its own disk holds it."""

    log_stream: str = "chaos-log"
    log_shards: int = 2
    quorum_stream: str | None = "chaos-quorum"
    quorum_shards: int = 1
    quorum_replicas: int = 3
    memory_stream: str = "chaos-memory"
    cache: str = "chaos-cache"
    cache_shards: int = 2
    cache_replicas: int = 1  # > 1: the cache is Quorum with this many replicas
    lose_disk_on_restart: bool = False
    quorum_ack_before_majority: bool = False

    @property
    def logs(self) -> list[tuple[str, int]]:
        """The checked logs: (stream, shard count), the RF1 log first."""
        logs = [(self.log_stream, self.log_shards)]
        if self.quorum_stream is not None:
            logs.append((self.quorum_stream, self.quorum_shards))
        return logs

    def catalog(self) -> StaticCatalog:
        t, ns = TENANT, NAMESPACE
        quorum = [
            StreamSpec(
                t,
                ns,
                name,
                durable=True,
                shards=self.quorum_shards,
                routing=Routing.MODULO,
                replication_factor=self.quorum_replicas,
                consistency=Consistency.QUORUM,
            )
            for name in ([self.quorum_stream] if self.quorum_stream is not None else [])
        ]
        return StaticCatalog(
            streams=[
                *quorum,
                StreamSpec(
                    t,
                    ns,
                    self.log_stream,
                    durable=True,
                    shards=self.log_shards,
                    routing=Routing.MODULO,
                ),
                StreamSpec(t, ns, self.memory_stream, durable=False, shards=1),
                StreamSpec(t, ns, READY_STREAM, durable=False, shards=1),
            ],
            caches=[
                CacheSpec(
                    t,
                    ns,
                    self.cache,
                    shards=self.cache_shards,
                    replication_factor=self.cache_replicas,
                    consistency=(
                        Consistency.QUORUM if self.cache_replicas > 1 else Consistency.LEADER
                    ),
                )
            ],
        )


def _free_port() -> int:
    """A port free for both UDP (QUIC) and TCP (HTTP) on loopback right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise FleetError("no free port found")


@dataclass
class BrokerProcess:
    """One broker: ``python -m felix_broker.cli`` on its own data folder and ports."""

    node_id: str
    data_dir: Path
    env: dict[str, str]
    config: Path
    quic_port: int
    faults: Path
    process: asyncio.subprocess.Process | None = None
    lose_disk: bool = False  # deliberately broken: restart on an empty durable folder
    starts: int = 0
    stopped: bool = False  # SIGSTOPped and not yet continued
    _reader: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.quic_port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        """Start (or start again, on the same folder and ports); returns once its
        start banner is printed."""
        if self.running:
            return
        if self.starts and self.lose_disk:
            shutil.rmtree(self.data_dir / "durable", ignore_errors=True)
        log = (self.data_dir / "broker.log").open("ab")
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "felix_broker.cli", "--config", str(self.config)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env,
            )
        finally:
            log.close()
        self.starts += 1
        self.stopped = False
        stdout = self.process.stdout
        assert stdout is not None
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                while True:
                    line = await stdout.readline()
                    if not line:
                        status = await self.process.wait()
                        raise FleetError(f"{self.node_id} exited at start (status {status})")
                    if b"QUIC on" in line:
                        break
        except TimeoutError:
            raise FleetError(f"{self.node_id} did not start in {_START_TIMEOUT:.0f} s") from None
        self._reader = asyncio.get_running_loop().create_task(_drain(stdout))

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
        if sig is signal.SIGSTOP:
            self.stopped = True
        elif sig is signal.SIGCONT:
            self.stopped = False

    async def kill(self) -> None:
        """``kill -9`` and reap it."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        await self.process.wait()
        self.stopped = False
        await self._end_reader()

    async def stop(self) -> None:
        """SIGCONT (if stopped), SIGTERM, then SIGKILL after a bound."""
        if self.process is None or self.process.returncode is not None:
            await self._end_reader()
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(_STOP_TIMEOUT):
                await self.process.wait()
        except TimeoutError:
            await self.kill()
        await self._end_reader()

    def set_fault(self, fault: FsyncFault) -> None:
        write_fault(self.faults, fault)

    async def _end_reader(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


class ChaosFleet:
    """``await ChaosFleet.start(folder, layout)``; ``await fleet.close()`` stops it all."""

    def __init__(
        self,
        folder: Path,
        layout: Layout,
        parts: _Parts,
        etcd: EtcdProcess,
        brokers: list[BrokerProcess],
        token: str,
        link: LinkInterposer,
    ) -> None:
        self.folder = folder
        self.layout = layout
        self._parts = parts
        self.etcd = etcd
        self.brokers = brokers
        self.token = token
        # The same rights and node.view:cluster:* (shard_inspect); set by `start`.
        self.operator_token = token
        self.link = link
        self.ca_file = folder / "ca.pem"

    @property
    def addrs(self) -> list[str]:
        return [b.addr for b in self.brokers]

    @property
    def link_addr(self) -> str:
        host, port = self.link.address
        return f"{host}:{port}"

    def broker(self, node_id: str) -> BrokerProcess:
        return next(b for b in self.brokers if b.node_id == node_id)

    def by_addr(self, addr: str) -> BrokerProcess | None:
        return next((b for b in self.brokers if b.addr == addr), None)

    @classmethod
    async def start(cls, folder: Path, layout: Layout, *, brokers: int = 3) -> ChaosFleet:
        folder.mkdir(parents=True, exist_ok=True)
        parts = _Parts()
        started: list[BrokerProcess] = []
        etcd: EtcdProcess | None = None
        try:
            ca, tls = _write_tls(folder / "ca.pem", folder / "tls")
            catalog = layout.catalog()
            (folder / "etcd").mkdir()
            etcd = EtcdProcess(folder / "etcd")
            await asyncio.to_thread(etcd.start)
            plane = await _FixtureControlPlane.start(folder, parts, catalog, etcd=etcd.endpoint)
            for index in range(1, brokers + 1):
                node_id = f"node-{index}"
                data_dir = folder / node_id
                data_dir.mkdir()
                config = data_dir / "broker.yaml"
                config.write_text(yaml.safe_dump({"catalog": _catalog_section(catalog)}))
                quic = _free_port()
                env = dict(os.environ)
                env.update(_member_env(node_id, etcd.endpoint, ca, folder / f"{node_id}.peer"))
                env.update(
                    {
                        "FELIX_CONTROLPLANE_URL": plane.url,
                        "FELIX_CONTROLPLANE_SYNC_TOKEN_FILE": str(plane.sync_token_file),
                        "FELIX_TLS_CA": str(tls["tls_ca"]),
                        "FELIX_TLS_CERT": str(tls["tls_cert"]),
                        "FELIX_TLS_KEY": str(tls["tls_key"]),
                        "FELIX_QUIC_BIND": f"127.0.0.1:{quic}",
                        "FELIX_BROKER_METRICS_BIND": f"127.0.0.1:{_free_port()}",
                        "FELIX_PEER_BIND": f"127.0.0.1:{_free_port()}",
                        "FELIX_DATA_DIR": str(data_dir),
                        "FELIX_DURABLE_STORAGE_DIR": str(data_dir / "durable"),
                        # An acknowledgement waits for the fsync (and readers see only
                        # synced records), so fsync faults reach the clients.
                        "FELIX_DURABLE_FSYNC_MODE": "on_commit",
                        "FELIX_NODE_LEASE_TTL_MS": str(_LEASE_TTL_MS),
                        "FELIX_TEST_FAULTS": str(data_dir / "faults.json"),
                        "FELIX_LOG_LEVEL": "WARNING",
                    }
                )
                if layout.quorum_ack_before_majority:
                    env["FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY"] = "1"
                broker = BrokerProcess(
                    node_id,
                    data_dir,
                    env,
                    config,
                    quic,
                    data_dir / "faults.json",
                    lose_disk=layout.lose_disk_on_restart,
                )
                started.append(broker)
            await asyncio.gather(*(b.start() for b in started))
            token = await plane.mint(TENANT, "chaos", full_rights(TENANT), 86400)
            link = LinkInterposer(("127.0.0.1", started[0].quic_port))
            await link.start("127.0.0.1", 0)
            parts.closers.append(link.close)
            fleet = cls(folder, layout, parts, etcd, started, token, link)
            operator = [*full_rights(TENANT), "node.view:cluster:*"]
            fleet.operator_token = await plane.mint(TENANT, "operator", operator, 86400)
        except BaseException:
            for broker in started:
                await broker.stop()
            await parts.close()
            if etcd is not None:
                await asyncio.to_thread(etcd.stop)
            raise
        try:
            await fleet.wait_ready(60.0)
            # A fleet accepts commits (and stores publishers) only once the control plane
            # finalized those fleet features, as `felix-broker fixture` does.
            for feature in _FLEET_FEATURES:
                await plane.finalize(feature)
        except BaseException:
            await fleet.close()
            raise
        return fleet

    async def wait_ready(self, within: float) -> float:
        """Wait until every shard of every stream and cache has a serving owner, a
        publish through every broker is acknowledged and every checked log's shard
        answers a read (a Quorum shard whose named leader did not open answers
        ``shard_unavailable/not_ready``); return the seconds it took. Raises
        `FleetError` after `within` seconds."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        catalog = self.layout.catalog()
        shards = [(ShardKind.STREAM, s.name) for s in catalog.streams()]
        shards += [(ShardKind.CACHE, c.name) for c in catalog.caches()]
        while True:
            left = began + within - loop.time()
            if left <= 0:
                raise FleetError(f"the fleet was not ready within {within:.0f} s")
            try:
                await fleet_ready(
                    self.addrs,
                    self.ca_file.read_bytes(),
                    TENANT,
                    NAMESPACE,
                    self.token,
                    shards=shards,
                    publish_to=READY_STREAM,
                    timeout=left,
                )
                await self._logs_readable(began + within - loop.time())
                return loop.time() - began
            except ProbeError as exc:
                raise FleetError(str(exc)) from None
            except StreamClosedError as exc:
                # The probe retries what a connection fails with, not a stream's end
                # (a broker that stalls mid-answer): try again within the bound.
                _log.info("fleet not ready yet: %s", exc)
                await asyncio.sleep(0.2)

    async def _logs_readable(self, within: float) -> None:
        """Every checked log's shard answers a one-record read within `within` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        pending = [(s, i) for s, n in self.layout.logs for i in range(n)]
        last = "no client"
        client: Client | None = None
        try:
            while pending:
                if loop.time() >= deadline:
                    raise FleetError(f"{pending[0][0]}/{pending[0][1]} not readable: {last}")
                try:
                    if client is None:
                        async with asyncio.timeout(5.0):
                            client = await self._connect()
                    stream, shard = pending[0]
                    pages = client.stream_read(stream, start=0, shard=shard, max_records=1)
                    async with asyncio.timeout(5.0):
                        async for _ in pages:
                            break
                        await pages.aclose()  # type: ignore[attr-defined]
                    pending.pop(0)
                except (BrokerError, ClientError, TimeoutError, OSError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    await asyncio.sleep(0.2)
        finally:
            if client is not None:
                with contextlib.suppress(BrokerError, ClientError, TimeoutError, OSError):
                    await client.aclose()

    async def wait_successor(self, stream: str, old: str, within: float) -> bool:
        """Until a broker other than the one at `old` leads `stream`'s shard 0 and
        answers a read there (a follower promoted and open); False after `within` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        others = [a for a in self.addrs if a != old]
        while loop.time() < deadline:
            try:
                async with asyncio.timeout(5.0):
                    client = await self._connect(others)
            except (BrokerError, ClientError, TimeoutError, OSError):
                await asyncio.sleep(0.2)
                continue
            try:
                async with asyncio.timeout(5.0):
                    owners = await client.shard_owners(stream)
                addr = next((o.addr for o in owners if o.shard == 0 and o.addr), None)
                if addr is not None and addr != old:
                    pages = client.stream_read(stream, start=0, shard=0, max_records=1)
                    async with asyncio.timeout(5.0):
                        async for _ in pages:
                            break
                        await pages.aclose()  # type: ignore[attr-defined]
                    return True
            except (BrokerError, ClientError, TimeoutError, OSError) as exc:
                _log.info("no successor for %s yet: %s", stream, exc)
            finally:
                with contextlib.suppress(BrokerError, ClientError, TimeoutError, OSError):
                    await client.aclose()
            await asyncio.sleep(0.2)
        return False

    async def _connect(self, addrs: list[str] | None = None) -> Client:
        return await connect(
            addrs or self.addrs,
            tenant_id=TENANT,
            token=self.token,
            namespace=NAMESPACE,
            ca_file=self.ca_file,
            config=ClientConfig(request_timeout=5.0),
        )

    async def heal(self) -> None:
        """Undo every fault: link healed, fault files cleared, stopped brokers
        continued, dead ones restarted, etcd running."""
        self.link.heal()
        if not self.etcd.running:
            await asyncio.to_thread(self.etcd.start)
        for broker in self.brokers:
            broker.set_fault(FsyncFault())
            if broker.stopped:
                broker.signal(signal.SIGCONT)
            if not broker.running:
                await broker.start()

    async def close(self) -> None:
        for broker in self.brokers:
            await broker.stop()
        await self._parts.close()
        await asyncio.to_thread(self.etcd.stop)
