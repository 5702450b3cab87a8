"""The broker's side of transcripts, for testing client implementations.

Each incoming connection plays the next selected case (in order, then from the
start again): the transcript's `send` steps become frames the server expects
from the client (matched like the runner matches the broker, with any
undefined `${variable}` such as the client's token captured from what the
client sends), and its `expect` steps become frames the server sends, built
from the literals, captures and `$example` values of the transcript. Stream
ends and resets the transcript expects are produced by the server.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from felix_transport import (
    Connection,
    ConnectionClosedError,
    Server,
    StreamClosedError,
    TransportConfig,
    generate_ca,
    generate_leaf,
    serve,
)
from felix_wire.flags import KNOWN_FLAGS

from .corpus import load_corpus, select
from .frames import build_frame, match_frame
from .matching import MissingVariableError, NotConcreteError, concrete, match, substitute
from .model import Case, FrameSpec, Step
from .schema import TranscriptError
from .session import StreamIO
from .target import parse_host_port
from .wirelog import WireLog

__all__ = ["PlaybackResult", "PlaybackServer", "main_serve", "serve_parser"]

_log = logging.getLogger(__name__)


@dataclass
class PlaybackResult:
    case_id: str
    passed: bool
    detail: str = ""
    wire_log: str = ""


class _ClientMisbehavedError(Exception):
    pass


@dataclass
class PlaybackServer:
    cases: Sequence[Case]
    variables: dict[str, Any] = field(default_factory=dict)
    results: list[PlaybackResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        ca = generate_ca("Felix conformance playback CA")
        leaf = generate_leaf(ca, dns_names=("localhost",), ip_addresses=("127.0.0.1", "::1"))
        self.ca_pem = ca.cert_pem
        self._chain = leaf.cert_pem + ca.cert_pem
        self._key = leaf.key_pem
        self._next: Iterator[Case] = itertools.cycle(self.cases)
        self._server: Server | None = None
        self.finished = asyncio.Event()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        config = TransportConfig.server(self._chain, self._key)
        self._server = await serve(config, host, port, self._on_connection)
        address = self._server.address
        return str(address[0]), int(address[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connection(self, connection: Connection) -> None:
        case = next(self._next)
        log = WireLog()
        play = _Play(case, connection, log, dict(self.variables))
        try:
            async with asyncio.timeout(case.timeout):
                await play.run()
            result = PlaybackResult(case.id, True)
        except _ClientMisbehavedError as exc:
            result = PlaybackResult(case.id, False, str(exc))
        except TimeoutError:
            result = PlaybackResult(case.id, False, f"not finished within {case.timeout:g}s")
        except (StreamClosedError, ConnectionClosedError) as exc:
            result = PlaybackResult(case.id, False, f"connection failed: {exc}")
        result.wire_log = log.text()
        _log.info("playback %s: %s %s", case.id, "pass" if result.passed else "fail", result.detail)
        self.results.append(result)
        self.finished.set()
        # Give the client time to read the last frames before the handler's close.
        await asyncio.sleep(0.2)


class _Play:
    def __init__(
        self, case: Case, connection: Connection, log: WireLog, variables: dict[str, Any]
    ) -> None:
        self.case = case
        self.connection = connection
        self.log = log
        self.variables = variables
        self.streams: dict[str, StreamIO] = {}

    async def run(self) -> None:
        for step in self.case.steps:
            await self.step(step)

    def _stream(self, step: Step) -> StreamIO:
        assert step.stream is not None
        return self.streams[step.stream]

    async def step(self, step: Step) -> None:
        action = step.action
        if action == "open":
            assert step.stream is not None
            async with asyncio.timeout(step.timeout):
                stream = await self.connection.accept_stream()
            self.streams[step.stream] = StreamIO(step.stream, stream, self.log)
        elif action == "accept":
            assert step.stream is not None
            stream = await self.connection.open_uni_stream()
            self.streams[step.stream] = StreamIO(step.stream, stream, self.log)
        elif action == "send":
            await self._receive(step)
        elif action == "expect":
            await self._answer(step, step.frames[0])
        elif action == "expect_end":
            await self._stream(step).stream.finish()
        elif action == "expect_reset":
            self._stream(step).stream.reset(step.code or 0)
        elif action == "expect_close":
            self.connection.close(step.code or 0)
        elif action in ("expect_silence", "wait"):
            await asyncio.sleep(step.seconds)
        elif action == "finish":
            event = await self._stream(step).next_event(step.timeout)
            if event.kind != "end":
                raise _ClientMisbehavedError(
                    f"{step.describe()}: expected FIN, got {event.describe()}"
                )
        elif action == "close":
            async with asyncio.timeout(step.timeout):
                await self.connection.wait_closed()

    async def _receive(self, step: Step) -> None:
        (spec,) = step.frames
        event = await self._stream(step).next_event(step.timeout)
        if event.frame is None:
            raise _ClientMisbehavedError(f"{step.describe()}: got {event.describe()}")
        open_spec = FrameSpec(
            spec.kind, substitute(spec.body, self.variables, unknown_as_capture=True)
        )
        problems = match_frame(open_spec, event.frame, self.variables, self.variables)
        if problems:
            raise _ClientMisbehavedError(f"{step.describe()}: " + "; ".join(problems))

    async def _answer(self, step: Step, spec: FrameSpec) -> None:
        try:
            template = substitute(spec.body, self.variables)
            body = concrete(template, self.variables)
        except (NotConcreteError, MissingVariableError) as exc:
            raise _ClientMisbehavedError(f"{step.describe()}: cannot play: {exc}") from None
        # What we send binds the transcript's captures, as if we had received it.
        match(template, body, spec.type_name, self.variables)
        if spec.kind == "message" and body["type"] == "auth_ok":
            # A transcript that does not say what the broker advertises gets a
            # played broker that reads every layout (the catalogue's known flags).
            body.setdefault("server_flags", KNOWN_FLAGS)
        try:
            data = build_frame(FrameSpec(spec.kind, body), self.variables)
        except TranscriptError as exc:
            raise _ClientMisbehavedError(f"{step.describe()}: cannot play: {exc}") from None
        io = self._stream(step)
        await io.write(data, spec.type_name)


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="felix-conformance serve",
        description="Play the broker's side of transcripts to a client under test.",
    )
    p.add_argument("--transcripts", type=Path, help="cases to play (default: shipped)")
    p.add_argument("--listen", required=True, metavar="HOST:PORT")
    p.add_argument("-t", "--test", action="append", default=[], metavar="GLOB")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--ca-out",
        type=Path,
        metavar="PEM",
        help="where to write the CA clients must trust (default: a temporary folder, "
        "printed at start and removed at exit)",
    )
    return p


def main_serve(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cases = select(load_corpus(args.transcripts), args.test, strict=True)
    if not cases:
        raise ValueError("no case matches the selection")
    variables = dict(pair.partition("=")[::2] for pair in args.set)
    host, port = parse_host_port(args.listen)
    with tempfile.TemporaryDirectory(prefix="felix-playback-") as scratch:
        ca_out = args.ca_out if args.ca_out is not None else Path(scratch) / "playback-ca.pem"
        return asyncio.run(_serve(PlaybackServer(cases, variables), host, port, ca_out))


async def _serve(server: PlaybackServer, host: str, port: int, ca_out: Path) -> int:
    # Handlers first: a signal right after the announcement still ends us cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ca_out.write_bytes(server.ca_pem)
    bound = await server.start(host, port)
    print(
        f"playing {len(server.cases)} case(s) on {bound[0]}:{bound[1]}; trust {ca_out}",
        flush=True,
    )
    await stop.wait()
    await server.close()
    failed = [r for r in server.results if not r.passed]
    for r in server.results:
        print(f"{r.case_id}: {'pass' if r.passed else 'fail'} {r.detail}")
    return 1 if failed else 0
