"""`felix-broker`: run a broker, mint a development token, or serve a test fixture.

    felix-broker [--config FILE] [--set KEY=VALUE ...]   run on the embedded defaults
    felix-broker token --tenant T [--perm P ...] [--ttl SECONDS]
    felix-broker fixture --out fixture.json --ca-file ca.pem

The broker prints, on start, where it listens, where its CA certificate is and
how to get a token; otherwise it logs warnings only unless `--log-level` says so.
SIGTERM or SIGINT drains it (see Broker.drain) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from felix_broker.app import Broker
from felix_broker.catalog import CacheSpec, Routing, StaticCatalog, StreamSpec
from felix_broker.config import (
    BrokerConfig,
    ConfigError,
    HostPort,
    add_cli_arguments,
    config_from_args,
    load_config,
)
from felix_broker.tokens import DevIssuer
from felix_controlplane.api import ControlPlane, Settings
from felix_controlplane.http11 import HttpServer
from felix_controlplane.store import SqliteStore

__all__ = ["full_rights", "main"]

_log = logging.getLogger(__name__)


def full_rights(tenant_id: str) -> list[str]:
    """Every data-plane grant within one tenant."""
    return [
        f"stream.publish:stream:{tenant_id}/*",
        f"stream.subscribe:stream:{tenant_id}/*",
        f"stream.manage:stream:{tenant_id}/*",
        f"cache.read:cache:{tenant_id}/*",
        f"cache.write:cache:{tenant_id}/*",
        f"cache.manage:cache:{tenant_id}/*",
        f"group.consume:group:{tenant_id}/*",
        f"group.manage:group:{tenant_id}/*",
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="felix-broker", description="A Felix broker.")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    add_cli_arguments(parser)
    sub = parser.add_subparsers(dest="command")
    token = sub.add_parser("token", help="print a token signed by this broker's development issuer")
    token.add_argument("--tenant", required=True)
    token.add_argument("--subject", default="developer")
    token.add_argument(
        "--perm",
        action="append",
        dest="perms",
        help="a grant, repeatable (default: full rights in the tenant)",
    )
    token.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (default 3600)")
    fixture = sub.add_parser("fixture", help="serve a broker for client test suites on loopback")
    fixture.add_argument("--out", type=Path, required=True, help="where to write the fixture JSON")
    fixture.add_argument("--ca-file", type=Path, required=True, help="where to write the CA PEM")
    fixture.add_argument(
        "--control-plane",
        action="store_true",
        help="also run a control plane: the broker takes its catalog and keys from it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":
        # qh3 logs every peer close at WARNING; a broker says little by default.
        logging.getLogger("quic").setLevel(logging.ERROR)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"felix-broker: {exc}", file=sys.stderr)
        return 2
    if args.command == "token":
        issuer = DevIssuer.load_or_create(config.data_dir)
        perms = args.perms if args.perms is not None else full_rights(args.tenant)
        print(issuer.mint(args.tenant, subject=args.subject, perms=perms, ttl_seconds=args.ttl))
        return 0
    if args.command == "fixture":
        return asyncio.run(_fixture(args.out, args.ca_file, control_plane=args.control_plane))
    return asyncio.run(_serve(config))


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT; installed before anything is announced, so a
    signal that follows the start message always drains instead of killing."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve(config: BrokerConfig) -> int:
    stop = _stop_on_signals()
    broker = Broker(config)
    try:
        await broker.start()
    except OSError as exc:
        print(f"felix-broker: cannot start: {exc}", file=sys.stderr)
        return 1
    quic = HostPort(config.quic_bind.host, broker.quic_port)
    print(
        f"felix-broker: QUIC on {quic} ({config.quic_impl.value}), HTTP on "
        f"{config.metrics_bind.host}:{broker.http_port}",
        flush=True,
    )
    print(f"felix-broker: CA certificate {broker.ca_path}", flush=True)
    print("felix-broker: a token: felix-broker token --tenant t1", flush=True)
    await stop.wait()
    await broker.stop()
    return 0


FIXTURE_TENANT = "t1"
FIXTURE_NAMESPACE = "default"


def fixture_catalog() -> StaticCatalog:
    t, ns = FIXTURE_TENANT, FIXTURE_NAMESPACE
    return StaticCatalog(
        streams=[
            StreamSpec(t, ns, "durable", durable=True, shards=4, routing=Routing.MODULO),
            StreamSpec(t, ns, "memory", durable=False, shards=1),
        ],
        caches=[CacheSpec(t, ns, "cache", shards=4), CacheSpec(t, ns, "single", shards=1)],
    )


Minter = Callable[[str, str, list[str], int], str]
"""(tenant, subject, perms, ttl seconds) -> a signed Felix token."""


def _dev_minter(issuer: DevIssuer) -> Minter:
    def mint(tenant: str, subject: str, perms: list[str], ttl: int) -> str:
        return issuer.mint(tenant, subject=subject, perms=perms, ttl_seconds=ttl)

    return mint


async def _fixture(out: Path, ca_file: Path, *, control_plane: bool) -> int:
    stop = _stop_on_signals()
    data_dir = Path(tempfile.mkdtemp(prefix="felix-fixture-"))
    # FELIX_* variables apply (e.g. FELIX_QUIC_IMPL); the fixture's own settings win.
    overrides: dict[str, object] = {
        "quic_bind": "127.0.0.1:0",
        "metrics_bind": "127.0.0.1:0",
        "data_dir": str(data_dir),
        "durable_storage_dir": str(data_dir / "durable"),
        "tls_cert_export": str(ca_file),
    }
    extra: dict[str, Any] = {}
    plane: _FixtureControlPlane | None = None
    if control_plane:
        plane = await _FixtureControlPlane.start(data_dir)
        overrides["controlplane_url"] = plane.url
        overrides["controlplane_sync_token_file"] = str(plane.sync_token_file)
        extra = {"controlplane_url": plane.url, "controlplane_admin_token": plane.admin_token}
    config = _with_catalog(load_config(overrides=overrides), fixture_catalog())
    broker = Broker(config)
    await broker.start()
    if plane is not None:
        mint = plane.minter()
    else:
        assert broker.issuer is not None
        mint = _dev_minter(broker.issuer)
    forger = _dev_minter(DevIssuer(Ed25519PrivateKey.generate()))
    control = await asyncio.start_server(
        lambda r, w: _token_endpoint(r, w, mint, forger), "127.0.0.1", 0
    )
    control_port = control.sockets[0].getsockname()[1]
    tenant = FIXTURE_TENANT
    document: dict[str, Any] = {
        "addrs": [f"127.0.0.1:{broker.quic_port}"],
        "tenant_id": tenant,
        "namespace": FIXTURE_NAMESPACE,
        "token": mint(tenant, "fixture", full_rights(tenant), 86400),
        "unauthorized_token": mint(tenant, "nobody", [], 86400),
        "ca_file": str(ca_file),
        "durable_stream": "durable",
        "memory_stream": "memory",
        "cache": "cache",
        "single_shard_cache": "single",
        "missing_stream": "no-such-stream",
        "control_url": f"http://127.0.0.1:{control_port}",
        "http_url": f"http://127.0.0.1:{broker.http_port}",
        **extra,
    }
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(out)  # readers never see a half-written fixture
    print(f"felix-broker fixture: {out}", flush=True)
    try:
        await stop.wait()
        await broker.stop()
    finally:
        control.close()
        await control.wait_closed()
        if plane is not None:
            await plane.close()
    return 0


class _FixtureControlPlane:
    """A control plane in the fixture's process, with the fixture's tenant, streams
    and caches created through its own API (so the broker learns them by syncing)."""

    def __init__(
        self,
        url: str,
        admin_token: str,
        sync_token_file: Path,
        control: ControlPlane,
        servers: tuple[HttpServer, HttpServer],
        store: SqliteStore,
    ) -> None:
        self.url = url
        self.admin_token = admin_token
        self.sync_token_file = sync_token_file
        self._control = control
        self._servers = servers
        self._store = store

    @classmethod
    async def start(cls, data_dir: Path) -> _FixtureControlPlane:
        sync_token = secrets.token_urlsafe(32)
        bootstrap = secrets.token_urlsafe(32)
        store = SqliteStore(data_dir / "controlplane.db")
        control = ControlPlane(store, Settings(sync_token=sync_token, bootstrap_secret=bootstrap))
        public = HttpServer(control.handle)
        admin = HttpServer(control.handle_admin)
        await public.start("127.0.0.1", 0)
        await admin.start("127.0.0.1", 0)
        url = f"http://127.0.0.1:{public.port}"
        answer = await _post(
            f"http://127.0.0.1:{admin.port}/v1/bootstrap",
            bootstrap,
            {"tenant": FIXTURE_TENANT, "admin": {"subjects": [f"admin@{FIXTURE_TENANT}"]}},
        )
        token = str(answer["admin_token"])
        tenant_url = f"{url}/v1/tenants/{FIXTURE_TENANT}"
        await _post(f"{tenant_url}/namespaces", token, {"name": FIXTURE_NAMESPACE})
        ns_url = f"{tenant_url}/namespaces/{FIXTURE_NAMESPACE}"
        for spec in fixture_catalog().streams():
            body = {"name": spec.name, "shards": spec.shards}
            body["durability"] = "durable" if spec.durable else "memory"
            await _post(f"{ns_url}/streams", token, body)
        for cache in fixture_catalog().caches():
            await _post(f"{ns_url}/caches", token, {"name": cache.name, "shards": cache.shards})
        sync_file = data_dir / "controlplane.sync-token"
        sync_file.write_text(sync_token)
        sync_file.chmod(0o600)
        return cls(url, token, sync_file, control, (public, admin), store)

    def minter(self) -> Minter:
        keys = self._control.keys

        def mint(tenant: str, subject: str, perms: list[str], ttl: int) -> str:
            now = int(time.time())
            claims = {
                "iss": "felix-auth",
                "aud": "felix-broker",
                "sub": subject,
                "tid": tenant,
                "perms": perms,
                "iat": now,
                "nbf": now,
                "exp": now + ttl,
            }
            token: str = keys.sign(tenant, claims, now)
            return token

        return mint

    async def close(self) -> None:
        for server in self._servers:
            await server.close()
        self._store.close()


async def _post(url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    """One JSON POST (off the event loop: the server may run on this loop)."""

    def call() -> dict[str, Any]:
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
            return answer

    return await asyncio.to_thread(call)


def _with_catalog(config: BrokerConfig, catalog: StaticCatalog) -> BrokerConfig:
    from dataclasses import replace

    return replace(config, catalog=catalog)


async def _token_endpoint(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mint: Minter, forger: Minter
) -> None:
    """POST /tokens {"ttl_secs": N, "forged": bool} -> {"token": "..."} (tests mint tokens here)."""
    status, body = 404, {"error": "not found"}
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = min(int(value.strip()), 65536)
        raw = await asyncio.wait_for(reader.readexactly(length), 5) if length else b"{}"
        if method == "POST" and path == "/tokens":
            request = json.loads(raw or b"{}")
            ttl = int(request.get("ttl_secs", 3600))
            perms = request.get("perms", full_rights(FIXTURE_TENANT))
            signer = forger if request.get("forged") else mint
            token = signer(FIXTURE_TENANT, str(request.get("subject", "fixture")), perms, ttl)
            status, body = 200, {"token": token}
    except (
        ValueError,
        asyncio.IncompleteReadError,
        asyncio.LimitOverrunError,
        TimeoutError,
    ) as exc:
        status, body = 400, {"error": str(exc)}
    payload = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    try:
        await writer.drain()
    finally:
        writer.close()


if __name__ == "__main__":
    raise SystemExit(main())
