"""`felix-conformance`: run the kit against a broker, list or measure the corpus,
write a target profile, record transcripts, play transcripts' broker side, or
test a client through its adapter.

    felix-conformance --target HOST:PORT --ca-file PEM --tenant T --token TOKEN
        [--profile YAML] [options]
    felix-conformance --profile YAML [options]
    felix-conformance --fixture fixture.json [options]
    felix-conformance --list [-t GLOB ...]
    felix-conformance coverage [--transcripts DIR]
    felix-conformance profile --fixture fixture.json --out YAML
    felix-conformance record --listen HOST:PORT --upstream HOST:PORT --ca-file PEM --out DIR
        [--keep-idle]
    felix-conformance serve --listen HOST:PORT [--transcripts DIR] [--ca-out PEM]
    felix-conformance client --adapter CMD [-t GLOB ...] [--html PATH] [--json PATH]

Options of a run: --json, --junit-xml, --html (reports), --log-dir, --progress,
--strict, -t/--exclude GLOB, --set NAME=VALUE.

Verdicts: pass; fail; unsupported (the target did not advertise what the case
needs); setup (the profile lacks a stream, cache or token the case needs, or the
target turned out not to have it); informational.

Exit status: 0 when no case failed, 1 when one did, 2 on usage errors (bad
arguments, unreadable transcripts or profile, a refused token), 3 when the
target cannot be reached.
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

from .clienttest.cases import CLIENT_CASES
from .clienttest.runner import run_client_cases, select_client_cases
from .corpus import load_corpus, select
from .coverage import compute_coverage, format_coverage
from .model import Case
from .playback import main_serve, serve_parser
from .profile import ProfileError, load_profile, profile_from_fixture, render_profile
from .recorder import main_record, record_parser
from .reports import Progress, print_summary, write_html, write_json, write_junit, write_logs
from .runner import run_cases
from .schema import TranscriptError
from .target import (
    Target,
    TargetRefusedError,
    TargetUnreachableError,
    discover,
    parse_host_port,
    probe,
    target_from_fixture,
    with_defaults,
)

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main", "parsers"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

_SUBCOMMANDS = ("client", "coverage", "profile", "record", "serve")


class _UsageError(Exception):
    pass


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="felix-conformance",
        description="Check which parts of the Felix wire protocol a broker honours, case by case. "
        "Subcommands: client, coverage, profile, record, serve "
        "(see `felix-conformance SUBCOMMAND -h`).",
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
        "--profile",
        type=Path,
        metavar="YAML",
        help="what the target has that the kit cannot discover: streams, caches, tokens "
        "(schema/profile.schema.json; `felix-conformance profile` writes one)",
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
    p.add_argument("--html", type=Path, metavar="PATH", help="write a self-contained HTML report")
    p.add_argument("--log-dir", type=Path, metavar="DIR", help="write a wire log per case")
    p.add_argument(
        "--progress",
        action="store_true",
        help="a progress line on stderr while cases run (default: only on a terminal)",
    )
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
    """The target from, in increasing precedence: --fixture, --profile, the options, --set."""
    address: str | None = None
    ca_pem: bytes | None = None
    server_name: str | None = None
    variables: dict[str, Any] = {}
    if args.fixture is not None:
        fixture = target_from_fixture(args.fixture)
        address, ca_pem, variables = fixture.address, fixture.ca_pem, dict(fixture.variables)
    if args.profile is not None:
        profile = load_profile(args.profile)
        address = profile.target or address
        ca_pem = profile.ca_file.read_bytes() if profile.ca_file is not None else ca_pem
        server_name = profile.server_name or server_name
        variables.update(profile.variables)
    address = args.target or address
    ca_pem = args.ca_file.read_bytes() if args.ca_file is not None else ca_pem
    server_name = args.server_name or server_name or "localhost"
    if args.tenant:
        variables["tenant_id"] = args.tenant
    if args.token is not None:
        variables["token"] = args.token
    elif args.token_file is not None:
        variables["token"] = args.token_file.read_text().strip()
    variables.update(_variables(args.set))
    lacking = [
        what
        for what, present in (
            ("--target", address is not None),
            ("--ca-file", ca_pem is not None),
            ("--tenant", "tenant_id" in variables),
            ("--token or --token-file", "token" in variables),
        )
        if not present
    ]
    if lacking:
        raise _UsageError(
            "need " + ", ".join(lacking) + " (or a --profile or --fixture that names them)"
        )
    assert address is not None and ca_pem is not None
    host, port = parse_host_port(address)
    variables.setdefault("namespace", "default")
    return Target(host, port, ca_pem, server_name, with_defaults(variables))


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
    discovery = await discover(target, advertised)
    show = args.progress or sys.stderr.isatty()
    progress = Progress(sys.stderr, len(cases), tty=sys.stderr.isatty()) if show else None
    report = await run_cases(
        cases,
        discovery.target,
        advertised,
        on_result=progress.update if progress is not None else None,
    )
    if progress is not None:
        progress.done()
    report.notes = list(discovery.notes)
    print_summary(report, console)
    if args.json is not None:
        write_json(report, args.json)
    if args.junit_xml is not None:
        write_junit(report, args.junit_xml)
    if args.html is not None:
        write_html(report, args.html)
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


def _coverage_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="felix-conformance coverage",
        description="Which messages, flags, features, error codes and requirements have a "
        "case: broker cases (the transcripts) and client cases (the client tester's), "
        "each entry labelled with the side that exercised it.",
    )
    parser.add_argument("--transcripts", type=Path, metavar="DIR")
    parser.add_argument("--broker-only", action="store_true", help="count the broker cases only")
    return parser


def _profile_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="felix-conformance profile",
        description="Write a target profile (schema/profile.schema.json) from a "
        "`felix-broker fixture` document.",
    )
    parser.add_argument("--fixture", type=Path, required=True, help="the fixture document")
    parser.add_argument("--out", type=Path, required=True, metavar="YAML", help="profile to write")
    return parser


def _main_profile(argv: list[str], console: Console) -> int:
    args = _profile_parser().parse_args(argv)
    text = render_profile(profile_from_fixture(args.fixture))
    args.out.write_text(text)
    console.print(f"wrote {args.out}", markup=False)
    return EXIT_OK


def _client_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="felix-conformance client",
        description="Test a client: per case the kit plays a scripted broker and asks the "
        "client's adapter (JSON lines, schema/adapter.schema.json) to perform operations.",
    )
    p.add_argument("--adapter", required=True, metavar="CMD", help="shell command of the adapter")
    p.add_argument("-t", "--test", action="append", default=[], metavar="GLOB", help="case ids")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip case ids")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--json", type=Path, metavar="PATH", help="write a JSON report")
    p.add_argument("--junit-xml", type=Path, metavar="PATH", help="write a JUnit XML report")
    p.add_argument("--html", type=Path, metavar="PATH", help="write a self-contained HTML report")
    p.add_argument("--log-dir", type=Path, metavar="DIR", help="write a log per case")
    p.add_argument("--progress", action="store_true", help="a progress line on stderr")
    return p


def _main_client(argv: list[str], console: Console) -> int:
    args = _client_parser().parse_args(argv)
    cases = select_client_cases(args.test, args.exclude)
    if args.list:
        for case in cases:
            console.print(f"{case.id:<44} {case.section}: {case.title}", markup=False)
        return EXIT_OK
    if not cases:
        raise _UsageError("no client case matches the selection")
    show = args.progress or sys.stderr.isatty()
    progress = Progress(sys.stderr, len(cases), tty=sys.stderr.isatty()) if show else None
    report = asyncio.run(
        run_client_cases(
            cases, args.adapter, on_result=progress.update if progress is not None else None
        )
    )
    if progress is not None:
        progress.done()
    print_summary(report, console)
    if args.json is not None:
        write_json(report, args.json)
    if args.junit_xml is not None:
        write_junit(report, args.junit_xml)
    if args.html is not None:
        write_html(report, args.html)
    if args.log_dir is not None:
        write_logs(report, args.log_dir)
    return EXIT_FAILED if report.failed else EXIT_OK


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The argument parser of each subcommand ("" is the run itself)."""
    return {
        "": _run_parser(),
        "client": _client_parser(),
        "coverage": _coverage_parser(),
        "profile": _profile_parser(),
        "record": record_parser(),
        "serve": serve_parser(),
    }


def _main_coverage(argv: list[str], console: Console) -> int:
    args = _coverage_parser().parse_args(argv)
    client_cases = () if args.broker_only else CLIENT_CASES
    coverage = compute_coverage(load_corpus(args.transcripts), client_cases)
    console.print(format_coverage(coverage), markup=False, end="")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = Console(highlight=False, soft_wrap=True)
    try:
        if argv and argv[0] == "coverage":
            return _main_coverage(argv[1:], console)
        if argv and argv[0] == "client":
            return _main_client(argv[1:], console)
        if argv and argv[0] == "profile":
            return _main_profile(argv[1:], console)
        if argv and argv[0] == "record":
            return main_record(argv[1:])
        if argv and argv[0] == "serve":
            return main_serve(argv[1:])
        return _main_run(argv, console)
    except (_UsageError, TranscriptError, ProfileError, ValueError, OSError) as exc:
        console.print(f"felix-conformance: {exc}", markup=False)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse: --help exits 0, bad arguments 2
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
