"""`felix-broker`: run a broker, mint a development token, or serve a test fixture.

    felix-broker [--config FILE] [--set KEY=VALUE ...]   run on the embedded defaults
    felix-broker token --tenant T [--perm P ...] [--ttl SECONDS]
    felix-broker fixture --out fixture.json --ca-file ca.pem

The broker prints, on start, where it listens, where its CA certificate is and
how to get a token; otherwise it logs warnings only unless `--log-level` says so.
SIGTERM or SIGINT drains it (see Broker.drain) and exits 0; a fleet member first
hands its shards off (Broker.hand_off, bounded by FELIX_SHUTDOWN_HANDOFF_TIMEOUT_MS).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import signal
import sys
from pathlib import Path

from felix_broker.app import Broker
from felix_broker.config import (
    BrokerConfig,
    ConfigError,
    HostPort,
    add_cli_arguments,
    config_from_args,
)
from felix_broker.fixture.run import full_rights, run_fixture
from felix_common.tokens import LEEWAY_SECONDS, DevIssuer
from felix_transport import __version__

__all__ = ["full_rights", "main"]

_log = logging.getLogger(__name__)


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
    fixture.add_argument(
        "--brokers",
        type=_positive,
        default=1,
        help="how many brokers (default 1); more than one runs a fleet: etcd, a control "
        "plane and each broker as its own process",
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


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
        return asyncio.run(
            run_fixture(
                args.out, args.ca_file, control_plane=args.control_plane, brokers=args.brokers
            )
        )
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
    except RuntimeError as exc:  # the fleet refused it (a finalized feature it lacks, ...)
        print(f"felix-broker: cannot join: {exc}", file=sys.stderr)
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
    await broker.hand_off()  # a fleet member drains itself first (bounded)
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


if __name__ == "__main__":
    raise SystemExit(main())
