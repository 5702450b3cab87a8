"""``felix-controlplane``: run the control plane (SQLite or etcd store, public API, loopback admin
API, and with ``--etcd-endpoints`` the fleet's placer).

``felix-controlplane --help`` describes every option and its default.

The broker sync token and the bootstrap secret come from the named files, else
from ``FELIX_CONTROLPLANE_SYNC_TOKEN`` / ``FELIX_CONTROLPLANE_BOOTSTRAP_SECRET``;
when neither is given, a random one is created beside the database (mode 0600)
and its path logged. The admin listener refuses any non-loopback address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

from felix_common.etcd import parse_endpoints
from felix_common.files import create_file_once, replace_file
from felix_controlplane.api import ControlPlane, Settings
from felix_controlplane.fleet_api import DEFAULT_MAX_MOVES
from felix_controlplane.http import HttpServer
from felix_controlplane.store import DEFAULT_MAX_CHANGES, SqliteStore, Store
from felix_transport import __version__

__all__ = ["build_parser", "main", "parse_args", "run"]

_log = logging.getLogger(__name__)


def _hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


_DESCRIPTION = """\
Run the Felix control plane: tenants, namespaces, streams and caches, RBAC, signing
keys and token exchange, in one SQLite file (or in etcd, --store etcd). The public
listener serves the /v1 API and the brokers' catalog sync feed; the admin listener
(loopback only) serves bootstrap with the bootstrap secret as bearer. Given
--etcd-endpoints, the instance also campaigns for placement (one placer at a time)."""

_EPILOG = """\
secrets: the broker sync token and the bootstrap secret are read from the named files,
else from FELIX_CONTROLPLANE_SYNC_TOKEN / FELIX_CONTROLPLANE_BOOTSTRAP_SECRET; when
neither is given, a random one is created beside the database (<db>.sync-token,
<db>.bootstrap-secret, mode 0600) and its path logged.

a first token without an identity provider:
  curl -X POST -H "Authorization: Bearer $(cat felix-controlplane.db.bootstrap-secret)" \\
       -d '{"tenant": "t1", "admin": {"subjects": ["admin"]}}' http://127.0.0.1:8901/v1/bootstrap
  then POST /v1/tenants/t1/tokens with the admin token (see the README).

operator tools:
  felix-controlplane admin backup-point --etcd-endpoints HOST:PORT   one consistent
      backup point of a fleet (every leader's committed offsets) as JSON."""


def build_parser() -> argparse.ArgumentParser:
    """The command line: every option with its help and its default."""
    parser = argparse.ArgumentParser(
        prog="felix-controlplane",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--db",
        type=Path,
        default=Path("felix-controlplane.db"),
        metavar="PATH",
        help="the SQLite database (created mode 0600; it holds the tenants' private "
        "signing keys) (default: %(default)s)",
    )
    parser.add_argument(
        "--bind",
        type=_hostport,
        default=("127.0.0.1", 8900),
        metavar="HOST:PORT",
        help="the public API and sync feed; port 0 picks a free port (default: 127.0.0.1:8900)",
    )
    parser.add_argument(
        "--admin-bind",
        type=_hostport,
        default=("127.0.0.1", 8901),
        metavar="HOST:PORT",
        help="the admin listener (bootstrap); loopback addresses only (default: 127.0.0.1:8901)",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="serve the public listener over HTTPS with this certificate chain "
        "(with --tls-key; default: plain HTTP)",
    )
    parser.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert (default: none)"
    )
    parser.add_argument(
        "--sync-token-file",
        type=Path,
        metavar="FILE",
        help="the broker sync token brokers present to read the catalog "
        "(default: $FELIX_CONTROLPLANE_SYNC_TOKEN, else <db>.sync-token, created if missing)",
    )
    parser.add_argument(
        "--bootstrap-secret-file",
        type=Path,
        metavar="FILE",
        help="the bearer secret of the admin listener's /v1/bootstrap "
        "(default: $FELIX_CONTROLPLANE_BOOTSTRAP_SECRET, else <db>.bootstrap-secret, "
        "created if missing)",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "etcd"),
        default="sqlite",
        help="where the control plane keeps tenants, the catalog and keys: the SQLite file "
        "of --db, or the etcd of --etcd-endpoints (several instances over one etcd are "
        "interchangeable) (default: %(default)s)",
    )
    parser.add_argument(
        "--etcd-endpoints",
        type=_endpoints,
        default=None,
        metavar="HOST:PORT[,...]",
        help="the fleet's etcd: with it this instance also campaigns to be the placer and, "
        "while it is, assigns every shard a leader among the live brokers (default: none)",
    )
    parser.add_argument(
        "--etcd-prefix",
        default="/felix",
        metavar="PREFIX",
        help="the etcd key prefix of the fleet, as the brokers' FELIX_ETCD_PREFIX "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--placer-id",
        default=f"{socket.gethostname()}-{os.getpid()}",
        metavar="ID",
        help="this instance's name in the placer election (default: host-pid)",
    )
    parser.add_argument(
        "--placer-lease-ttl",
        type=int,
        default=10,
        metavar="SECONDS",
        help="TTL of the placer's etcd lease: how long a vanished placer holds placement "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-moves",
        type=int,
        default=None,
        metavar="N",
        help="at most this many shard copies in progress at once across the fleet (moves "
        "and drains; 0: no cap); a drain's other shards wait, listed as queued in "
        "GET /v1/fleet/moves (default: $FELIX_CONTROLPLANE_MAX_MOVES, else "
        f"{DEFAULT_MAX_MOVES})",
    )
    parser.add_argument(
        "--token-ttl",
        type=int,
        default=900,
        metavar="SECONDS",
        help="lifetime of issued tokens when a request names none (default: %(default)s)",
    )
    parser.add_argument(
        "--max-token-ttl",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="the longest lifetime a token request may ask for (default: %(default)s)",
    )
    parser.add_argument(
        "--max-changes",
        type=int,
        default=DEFAULT_MAX_CHANGES,
        metavar="N",
        help="catalog change-log entries kept; a broker further behind reloads the "
        "snapshot (default: %(default)s)",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        metavar="FILE",
        help='once both listeners are up, write {"url": ..., "admin_url": ...} there as JSON '
        "(for scripts that bind port 0) (default: none)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: %(default)s)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if not 1 <= args.token_ttl <= args.max_token_ttl:
        parser.error("--token-ttl must be between 1 and --max-token-ttl")
    if args.store == "etcd" and not args.etcd_endpoints:
        parser.error("--store etcd needs --etcd-endpoints")
    if not args.etcd_prefix.startswith("/") or args.etcd_prefix.endswith("/"):
        parser.error("--etcd-prefix must start with '/' and not end with it")
    if args.placer_lease_ttl < 1:
        parser.error("--placer-lease-ttl must be at least 1")
    if args.max_moves is None:
        text = os.environ.get("FELIX_CONTROLPLANE_MAX_MOVES", "")
        try:
            args.max_moves = int(text) if text else DEFAULT_MAX_MOVES
        except ValueError:
            parser.error(f"FELIX_CONTROLPLANE_MAX_MOVES must be a whole number, got {text!r}")
    if args.max_moves < 0:
        parser.error("--max-moves must be 0 (no cap) or more")
    try:
        loopback = ipaddress.ip_address(args.admin_bind[0]).is_loopback
    except ValueError:
        loopback = args.admin_bind[0] == "localhost"
    if not loopback:
        parser.error("--admin-bind must be a loopback address (it serves the bootstrap path)")
    return args


def _endpoints(value: str) -> list[tuple[str, int]]:
    try:
        return parse_endpoints(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _secret(path: Path | None, env: str, default_path: Path) -> str:
    if path is not None:
        return path.read_text(encoding="utf-8").strip()
    from_env = os.environ.get(env)
    if from_env:
        return from_env
    if create_file_once(default_path, secrets.token_urlsafe(32).encode(), mode=0o600):
        _log.warning("created %s (set %s or pass its file to choose one)", default_path, env)
    return default_path.read_text(encoding="utf-8").strip()


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    args.db.parent.mkdir(parents=True, exist_ok=True)
    # The database holds the tenants' private signing keys.
    if not args.db.exists():
        args.db.touch(mode=0o600)
    settings = Settings(
        default_token_ttl=args.token_ttl,
        max_token_ttl=args.max_token_ttl,
        sync_token=_secret(
            args.sync_token_file,
            "FELIX_CONTROLPLANE_SYNC_TOKEN",
            args.db.with_name(args.db.name + ".sync-token"),
        ),
        bootstrap_secret=_secret(
            args.bootstrap_secret_file,
            "FELIX_CONTROLPLANE_BOOTSTRAP_SECRET",
            args.db.with_name(args.db.name + ".bootstrap-secret"),
        ),
    )
    store: Store
    etcd_store = None
    if args.store == "etcd":
        from felix_controlplane.store_etcd import EtcdStore

        store = etcd_store = EtcdStore(
            args.etcd_endpoints, prefix=args.etcd_prefix, max_changes=args.max_changes
        )
    else:
        store = SqliteStore(args.db, max_changes=args.max_changes)
    plane = ControlPlane(store, settings)
    # The fleet's routes (admin listener): over the fleet's etcd, or answering no_fleet.
    fleet_client = None
    if args.etcd_endpoints:
        from felix_common.etcd import EtcdClient

        fleet_client = EtcdClient(args.etcd_endpoints, timeout_s=2.0)
    from felix_common.fleet import Keyspace
    from felix_controlplane.fleet_features import FleetRoutes

    plane.add_admin_routes(
        FleetRoutes(fleet_client, Keyspace(args.etcd_prefix), args.placer_id).routes()
    )
    if etcd_store is not None:
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from the store's thread: writes through other instances
            loop.call_soon_threadsafe(plane.changed_elsewhere)

        etcd_store.add_change_listener(wake)
    context = None
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    public = HttpServer(plane.handle, ssl_context=context)
    admin = HttpServer(plane.handle_admin)
    await public.start(*args.bind)
    await admin.start(*args.admin_bind)
    scheme = "https" if context else "http"
    if args.ready_file is not None:
        document = {
            "url": f"{scheme}://{_url_host(args.bind[0])}:{public.port}",
            "admin_url": f"http://{_url_host(args.admin_bind[0])}:{admin.port}",
        }
        replace_file(args.ready_file, (json.dumps(document) + "\n").encode(), mode=0o644)
    _log.info(
        "control plane on %s:%d (%s), admin on %s:%d, store %s",
        args.bind[0],
        public.port,
        scheme,
        args.admin_bind[0],
        admin.port,
        args.db if args.store == "sqlite" else f"etcd {args.etcd_prefix}/cp",
    )
    placement = None
    if args.etcd_endpoints:
        from felix_controlplane.placement import Placement

        placement = Placement(
            args.etcd_endpoints,
            prefix=args.etcd_prefix,
            holder_id=args.placer_id,
            store=store,
            lease_ttl_s=args.placer_lease_ttl,
            max_moves=args.max_moves,
        )
        placement.start()
        plane.placer = placement.placer  # the admin listener's fleet commands
    try:
        await stop.wait()
    finally:
        if placement is not None:
            await placement.stop()  # releases P/placer: another instance takes over at once
        await public.close()
        await admin.close()
        await plane.close()
        if fleet_client is not None:
            await fleet_client.close()
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["admin"]:
        return _admin(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run(args, stop)

    try:
        asyncio.run(serve())
    except OSError as exc:
        _log.error("cannot start: %s", exc)
        return 1
    return 0


def _admin(argv: list[str]) -> int:
    """``felix-controlplane admin COMMAND``: operator tools that talk to a running fleet."""
    if argv[:1] == ["backup-point"]:
        from felix_controlplane.backup_point import main as backup_point

        return backup_point(argv[1:])
    print("usage: felix-controlplane admin backup-point [options] (see --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
