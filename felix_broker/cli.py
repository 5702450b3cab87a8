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
import functools
import json
import logging
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
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
from felix_common import safejson
from felix_common.files import replace_file
from felix_common.http import HttpServer
from felix_common.tokens import LEEWAY_SECONDS, DevIssuer
from felix_transport import __version__

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
    parser = argparse.ArgumentParser(
        prog="felix-broker",
        description="A Felix broker.",
        epilog=(
            f"Tokens: exp and nbf are checked at auth with {LEEWAY_SECONDS} s of leeway; a "
            f"stream's authority ends when its token's exp plus {LEEWAY_SECONDS} s passes "
            "(its next request is refused unauthenticated, then the stream ends, and the "
            "subscriptions and watches opened on it end)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="logging level (default WARNING)",
    )
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
        try:
            ttl = args.ttl
            token = issuer.mint(args.tenant, subject=args.subject, perms=perms, ttl_seconds=ttl)
        except ValueError as exc:  # a bad --perm or --ttl: nothing is minted
            print(f"felix-broker token: {exc}", file=sys.stderr)
            return 2
        print(token)
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
    print(f"felix-broker: {token_hint(config)}", flush=True)
    await stop.wait()
    await broker.stop()
    return 0


def token_hint(config: BrokerConfig, *, cwd: Path | None = None) -> str:
    """How to get a token this broker accepts, for how it was started (the start
    banner's last line). The order is the broker's: a control plane's keys win over
    ``jwks_path``, which wins over the development issuer."""
    if config.controlplane_url is not None:
        url = config.controlplane_url.rstrip("/")
        return (
            f"a token: from the control plane at {url}: POST {url}/v1/tenants/TENANT/tokens "
            "with a tenant admin token, or .../token/exchange with an identity provider's "
            "token (development tokens are refused)"
        )
    if config.jwks_path is not None:
        return (
            f"a token: from the issuer whose keys are in {config.jwks_path} "
            "(development tokens are refused)"
        )
    catalog = config.catalog
    tenants = sorted(
        {s.tenant_id for s in catalog.streams()} | {c.tenant_id for c in catalog.caches()}
    )
    tenant = tenants[0] if tenants else "TENANT"
    # The development issuer's key is in the data folder: the token command needs the
    # same one (the environment beats a config file, so this works for every start).
    default_dir = (cwd or Path.cwd()) / "felix-data"
    env = (
        ""
        if config.data_dir == default_dir
        else f"FELIX_DATA_DIR={shlex.quote(str(config.data_dir))} "
    )
    return f"a token: {env}felix-broker token --tenant {shlex.quote(tenant)}"


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


Minter = Callable[[str, str, list[str], int], Awaitable[str]]
"""(tenant, subject, perms, ttl seconds) -> a signed Felix token."""


def _dev_minter(issuer: DevIssuer) -> Minter:
    async def mint(tenant: str, subject: str, perms: list[str], ttl: int) -> str:
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
    mint: Minter
    if plane is not None:
        mint = plane.mint
    else:
        assert broker.issuer is not None
        mint = _dev_minter(broker.issuer)
    forger = _dev_minter(DevIssuer(Ed25519PrivateKey.generate()))
    control = HttpServer(functools.partial(_token_endpoint, mint=mint, forger=forger))
    await control.start("127.0.0.1", 0)
    control_port = control.port
    tenant = FIXTURE_TENANT
    document: dict[str, Any] = {
        "addrs": [f"127.0.0.1:{broker.quic_port}"],
        "tenant_id": tenant,
        "namespace": FIXTURE_NAMESPACE,
        "token": await mint(tenant, "fixture", full_rights(tenant), 86400),
        "unauthorized_token": await mint(tenant, "nobody", [], 86400),
        # An operator's token: exactly the grant inspection needs, no data-plane rights.
        "inspector_token": await mint(tenant, "operator", ["node.view:cluster:*"], 86400),
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
        await control.close()
        if plane is not None:
            await plane.close()
        shutil.rmtree(data_dir, ignore_errors=True)  # the fixture's own mkdtemp folder
    return 0


class _ControlPlaneError(Exception):
    """The fixture's control plane refused a call or did not start."""


class _FixtureControlPlane:
    """A control plane beside the fixture's broker, run as its own process
    (``felix-controlplane``, as a user runs it), with the fixture's tenant, streams
    and caches created through its API (so the broker learns them by syncing) and
    tokens minted by the tenant's administrator (``POST /v1/tenants/T/tokens``)."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        session: aiohttp.ClientSession,
        urls: dict[str, str],
        sync_token_file: Path,
    ) -> None:
        self._process = process
        self._session = session
        self.url = urls["url"]
        self.admin_url = urls["admin_url"]
        self.sync_token_file = sync_token_file
        self.admin_token = ""

    @classmethod
    async def start(cls, data_dir: Path) -> _FixtureControlPlane:
        sync_file = data_dir / "controlplane.sync-token"
        bootstrap_file = data_dir / "controlplane.bootstrap-secret"
        for path in (sync_file, bootstrap_file):
            replace_file(path, secrets.token_urlsafe(32).encode(), mode=0o600)
        ready = data_dir / "controlplane.ready.json"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "felix_controlplane.cli",
            *("--db", str(data_dir / "controlplane.db")),
            *("--bind", "127.0.0.1:0", "--admin-bind", "127.0.0.1:0"),
            *("--sync-token-file", str(sync_file)),
            *("--bootstrap-secret-file", str(bootstrap_file)),
            *("--max-token-ttl", "86400", "--ready-file", str(ready)),
            *("--log-level", "WARNING"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
        )
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with asyncio.timeout(30):
                while not ready.exists():
                    if process.returncode is not None:
                        raise _ControlPlaneError(
                            f"felix-controlplane exited with status {process.returncode}"
                        )
                    await asyncio.sleep(0.05)
            plane = cls(process, session, json.loads(ready.read_text()), sync_file)
            await plane._populate(bootstrap_file.read_text().strip())
        except BaseException:
            await session.close()
            await _end(process)
            raise
        return plane

    async def _populate(self, bootstrap_secret: str) -> None:
        tenant = FIXTURE_TENANT
        answer = await self._post(
            f"{self.admin_url}/v1/bootstrap",
            bootstrap_secret,
            {"tenant": tenant, "admin": {"subjects": [f"admin@{tenant}"]}},
        )
        # The bootstrap token lives 15 minutes; the fixture lives as long as a test run.
        minted = await self._post(
            f"{self.url}/v1/tenants/{tenant}/tokens",
            str(answer["admin_token"]),
            {
                "subject": f"admin@{tenant}",
                "perms": answer["policy"]["permissions"],
                "audience": "felix-controlplane",
                "ttl_seconds": 86400,
            },
        )
        self.admin_token = str(minted["token"])
        tenant_url = f"{self.url}/v1/tenants/{tenant}"
        await self._post(f"{tenant_url}/namespaces", self.admin_token, {"name": FIXTURE_NAMESPACE})
        ns_url = f"{tenant_url}/namespaces/{FIXTURE_NAMESPACE}"
        for spec in fixture_catalog().streams():
            body: dict[str, Any] = {"name": spec.name, "shards": spec.shards}
            body["durability"] = "durable" if spec.durable else "memory"
            await self._post(f"{ns_url}/streams", self.admin_token, body)
        for cache in fixture_catalog().caches():
            body = {"name": cache.name, "shards": cache.shards}
            await self._post(f"{ns_url}/caches", self.admin_token, body)

    async def mint(self, tenant: str, subject: str, perms: list[str], ttl: int) -> str:
        answer = await self._post(
            f"{self.url}/v1/tenants/{tenant}/tokens",
            self.admin_token,
            {"subject": subject, "perms": perms, "ttl_seconds": ttl},
        )
        return str(answer["token"])

    async def _post(self, url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with self._session.post(url, json=body, headers=headers) as response:
                answer: dict[str, Any] = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise _ControlPlaneError(f"POST {url}: {exc}") from None
        if response.status >= 300:
            raise _ControlPlaneError(f"POST {url}: {response.status} {answer.get('message')}")
        return answer

    async def close(self) -> None:
        await self._session.close()
        await _end(self._process)


async def _end(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    if process.returncode is None:
        process.terminate()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


def _with_catalog(config: BrokerConfig, catalog: StaticCatalog) -> BrokerConfig:
    from dataclasses import replace

    return replace(config, catalog=catalog)


async def _token_endpoint(
    request: web.BaseRequest, *, mint: Minter, forger: Minter
) -> web.StreamResponse:
    """POST /tokens {"ttl_secs": N, "forged": bool} -> {"token": "..."} (tests mint tokens here)."""
    if (request.method, request.path) != ("POST", "/tokens"):
        return web.json_response({"error": "not found"}, status=404)
    try:
        raw = await request.content.read(65536) if request.can_read_body else b""
        body = safejson.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise ValueError("expected a JSON object")
        ttl = int(body.get("ttl_secs", 3600))
        perms = body.get("perms", full_rights(FIXTURE_TENANT))
        signer = forger if body.get("forged") else mint
        token = await signer(FIXTURE_TENANT, str(body.get("subject", "fixture")), perms, ttl)
    except (ValueError, TypeError, _ControlPlaneError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return web.json_response({"token": token})


if __name__ == "__main__":
    raise SystemExit(main())
