"""`felix-conformance`: run the kit against a broker, list or measure the corpus,
record transcripts, or play the broker's side to a client.

    felix-conformance --target HOST:PORT --ca-file PEM --tenant T --token TOKEN [options]
    felix-conformance --fixture fixture.json [options]
    felix-conformance --list [-t GLOB ...]
    felix-conformance coverage [--transcripts DIR]
    felix-conformance record --listen HOST:PORT --upstream HOST:PORT --ca-file PEM --out DIR
    felix-conformance serve --transcripts DIR --listen HOST:PORT [--cert-dir DIR]

Exit status: 0 when no case failed, 1 when one did, 2 on usage errors (bad
arguments, unreadable transcripts, a refused token), 3 when the target cannot
be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from felix_transport import __version__

from .corpus import load_corpus, select
from .coverage import compute_coverage, format_coverage
from .model import Case
from .playback import main_serve
from .recorder import main_record
from .reports import print_summary, write_json, write_junit, write_logs
from .runner import run_cases
from .schema import TranscriptError
from .target import (
    Target,
    TargetRefusedError,
    TargetUnreachableError,
    parse_host_port,
    probe,
    target_from_fixture,
    with_defaults,
)

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

_SUBCOMMANDS = ("coverage", "record", "serve")


class _UsageError(Exception):
    pass


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="felix-conformance",
        description="Check which parts of the Felix wire protocol a broker honours, case by case. "
        "Subcommands: coverage, record, serve (see `felix-conformance SUBCOMMAND -h`).",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--target", metavar="HOST:PORT", help="the broker to test")
    p.add_argument("--ca-file", type=Path, help="PEM of the CA the broker's certificate chains to")
    p.add_argument("--server-name", help="TLS server name to verify (default localhost)")
    p.add_argument("--tenant", help="tenant id of the token")
    token = p.add_mutually_exclusive_group()
    token.add_argument("--token", help="a token with full rights in the tenant")
    token.add_argument("--token-file", type=Path, help="file holding the token")
    p.add_argument(
        "--fixture", type=Path, help="a `felix-broker fixture` document (all of the above)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a target variable (namespace, memory_stream, unauthorized_token, ...)",
    )
    p.add_argument("-t", "--test", action="append", default=[], metavar="GLOB", help="case ids")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip case ids")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--strict", action="store_true", help="also run SHOULD-level cases")
    p.add_argument("--json", type=Path, metavar="PATH", help="write a JSON report")
    p.add_argument("--junit-xml", type=Path, metavar="PATH", help="write a JUnit XML report")
    p.add_argument("--log-dir", type=Path, metavar="DIR", help="write a wire log per case")
    p.add_argument(
        "--transcripts", type=Path, metavar="DIR", help="cases to run (default: shipped)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return p


def _variables(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise _UsageError(f"--set expects NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def _target(args: argparse.Namespace) -> Target:
    extra = _variables(args.set)
    if args.fixture is not None:
        target = target_from_fixture(args.fixture, server_name=args.server_name)
        variables = dict(target.variables)
    else:
        if not args.target or not args.ca_file or not args.tenant:
            raise _UsageError("need --fixture, or --target, --ca-file, --tenant and a token")
        if args.token is None and args.token_file is None:
            raise _UsageError("need --token or --token-file")
        host, port = parse_host_port(args.target)
        target = Target(host, port, args.ca_file.read_bytes(), args.server_name or "localhost")
        variables = {"namespace": "default"}
    if args.target and args.fixture is not None:
        host, port = parse_host_port(args.target)
        target = Target(host, port, target.ca_pem, target.server_name)
    if args.tenant:
        variables["tenant_id"] = args.tenant
    if args.token is not None:
        variables["token"] = args.token
    elif args.token_file is not None:
        variables["token"] = args.token_file.read_text().strip()
    variables.update(extra)
    return Target(
        target.host, target.port, target.ca_pem, target.server_name, with_defaults(variables)
    )


def _list(cases: list[Case], console: Console) -> None:
    for case in cases:
        console.print(
            f"{case.id:<44} {case.level.value:<6} {case.section}: {case.title}", markup=False
        )


async def _run(args: argparse.Namespace, cases: list[Case], console: Console) -> int:
    target = _target(args)
    try:
        advertised = await probe(target)
    except TargetUnreachableError as exc:
        console.print(f"felix-conformance: {exc}", markup=False)
        return EXIT_UNREACHABLE
    except TargetRefusedError as exc:
        console.print(f"felix-conformance: {exc}", markup=False)
        return EXIT_USAGE
    report = await run_cases(cases, target, advertised)
    print_summary(report, console)
    if args.json is not None:
        write_json(report, args.json)
    if args.junit_xml is not None:
        write_junit(report, args.junit_xml)
    if args.log_dir is not None:
        write_logs(report, args.log_dir)
    return EXIT_FAILED if report.failed else EXIT_OK


def _main_run(argv: list[str], console: Console) -> int:
    parser = _run_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    cases = select(load_corpus(args.transcripts), args.test, args.exclude, strict=args.strict)
    if args.list:
        _list(cases, console)
        return EXIT_OK
    if not cases:
        raise _UsageError("no case matches the selection")
    return asyncio.run(_run(args, cases, console))


def _main_coverage(argv: list[str], console: Console) -> int:
    parser = argparse.ArgumentParser(
        prog="felix-conformance coverage",
        description="Which messages, flags, features, error codes and requirements have a case.",
    )
    parser.add_argument("--transcripts", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    coverage = compute_coverage(load_corpus(args.transcripts))
    console.print(format_coverage(coverage), markup=False, end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if argv and argv[0] == "coverage":
            return _main_coverage(argv[1:], console)
        if argv and argv[0] == "record":
            return main_record(argv[1:])
        if argv and argv[0] == "serve":
            return main_serve(argv[1:])
        return _main_run(argv, console)
    except (_UsageError, TranscriptError, ValueError, OSError) as exc:
        console.print(f"felix-conformance: {exc}", markup=False)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse: --help exits 0, bad arguments 2
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
