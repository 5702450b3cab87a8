"""Recording real client/broker sessions as transcripts.

The recorder is a relay (its own CA toward the client, normal verification
toward the upstream) whose observer keeps every frame and stream end of a
connection; when the connection closes it writes one transcript:

- client frames become `send` steps, broker frames `expect` steps, in the order
  they crossed the relay; broker-opened streams become `accept` steps;
- values equal to a known target variable (tenant, token, stream names ...)
  become `${name}`; ids the broker assigns (subscription ids) become captures
  reused wherever they appear later; fields that differ from run to run or
  broker to broker (offsets, advertised flags, windows, producer ids, texts)
  become `$any` matchers keeping the recorded value as `$example`;
- any other number the broker chose (not an echo of the same field the client
  sent earlier on that connection, like a request_id or a shard: a counter's
  sum, a count, a length) is matched by its shape (`$type: integer`), never as
  the literal seen once;
- streams that carried nothing but auth (the official client opens a pool of
  them) are left out unless asked for.

The output is a starting point for a hand review, as the shipped corpus was.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from felix_wire.frame import Frame

from .frames import Received, decode_received, spec_of
from .matching import json_type
from .model import parse_case
from .relay import TO_BROKER, Relay, StreamRef
from .target import Target, parse_host_port, target_from_fixture, with_defaults

__all__ = ["Recorder", "main_record", "record_parser", "recorder_from_args", "transcript_of"]

_log = logging.getLogger(__name__)

# Fields a broker fills in that legitimately differ between runs or brokers.
_VARYING = frozenset(
    {
        "server_flags", "server_features", "server_features_hi", "publish_window",
        "listener_ports", "offset", "base_offset", "start_offset", "live_offset",
        "next_offset", "generation", "producer_id", "version", "resume_offset",
        "timestamps", "timestamp_micros", "message", "available", "queue_capacity",
        "retry", "detail", "shards", "owners", "brokers", "routing", "publisher",
    }
)  # fmt: skip
# Ids a broker assigns and a client then reuses or sees again.
_ASSIGNED = frozenset({"subscription_id"})
_AUTH_TYPES = frozenset({"auth", "auth_ok", "ok"})


@dataclass
class _Event:
    ref: StreamRef
    direction: str
    kind: str  # "frame" | "fin" | "reset"
    frame: Received | None = None
    code: int | None = None


@dataclass
class _Connection:
    events: list[_Event] = field(default_factory=list)


class Recorder:
    """A relay that writes one transcript per relayed connection into `out`."""

    def __init__(
        self,
        upstream: Target,
        out: Path,
        *,
        variables: dict[str, Any] | None = None,
        name: str = "recorded",
        keep_idle: bool = False,
    ) -> None:
        self.out = out
        self.variables = dict(variables or {})
        self.name = name
        self.keep_idle = keep_idle
        self.written: list[Path] = []
        self._connections: dict[int, _Connection] = {}
        self.relay = Relay(upstream, observer=self)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "recorder-ca.pem").write_bytes(self.relay.ca_pem)
        return await self.relay.start(host, port)

    async def close(self) -> None:
        await self.relay.close()

    # -- RelayObserver ---------------------------------------------------------------

    def stream_opened(self, ref: StreamRef) -> None:
        self._connections.setdefault(ref.conn, _Connection())

    def frame(self, ref: StreamRef, direction: str, frame: Frame) -> None:
        received = decode_received(frame.flags, frame.payload)
        self._connections.setdefault(ref.conn, _Connection()).events.append(
            _Event(ref, direction, "frame", received)
        )

    def stream_ended(self, ref: StreamRef, direction: str, kind: str, code: int | None) -> None:
        self._connections.setdefault(ref.conn, _Connection()).events.append(
            _Event(ref, direction, kind, code=code)
        )

    def connection_closed(self, conn: int, code: int | None) -> None:
        recorded = self._connections.pop(conn, None)
        if recorded is None or not recorded.events:
            return
        case_id = f"{self.name}.c{conn}"
        document = transcript_of(case_id, recorded.events, self.variables, keep_idle=self.keep_idle)
        if document is None:
            return
        path = self.out / f"{self.name}-c{conn}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False, width=100))
        parse_case(document, str(path))  # what we write must be a valid transcript
        self.written.append(path)
        _log.info("recorded %s", path)


def _stream_name(ref: StreamRef) -> str:
    return f"{'s' if ref.opened_by == 'client' else 'e'}{ref.stream_id}"


class _Generalizer:
    """Turns recorded values into variables, captures and matchers."""

    def __init__(self, variables: dict[str, Any]) -> None:
        # Longest values first, and only strings worth naming.
        self.by_value = {v: k for k, v in variables.items() if isinstance(v, str) and len(v) >= 1}
        self.captured: dict[int, str] = {}
        # (field, number) pairs the client has sent: the broker echoing one is not choosing it.
        self.client_numbers: set[tuple[str, int | float]] = set()

    def _saw(self, key: str, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self.client_numbers.add((key, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                self._saw(k, v)
        elif isinstance(value, list):
            for v in value:
                self._saw(key, v)

    def client_value(self, key: str, value: Any) -> Any:
        self._saw(key, value)
        if isinstance(value, str) and value in self.by_value:
            return "${" + self.by_value[value] + "}"
        if key in _ASSIGNED and isinstance(value, int) and value in self.captured:
            return "${" + self.captured[value] + "}"
        if isinstance(value, dict):
            return {k: self.client_value(k, v) for k, v in value.items()}
        return value

    def broker_value(self, key: str, value: Any) -> Any:
        if key in _ASSIGNED and isinstance(value, int):
            name = self.captured.get(value)
            if name is not None:
                return "${" + name + "}"
            name = f"subscription_{len(self.captured) + 1}"
            self.captured[value] = name
            return {"$capture": name, "$example": value}
        if key in _VARYING:
            return {"$any": True, "$example": value}
        if isinstance(value, str) and value in self.by_value:
            return "${" + self.by_value[value] + "}"
        if isinstance(value, dict):
            return {k: self.broker_value(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.broker_value(key, v) for v in value]
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and (key, value) not in self.client_numbers
        ):
            return {"$type": json_type(value), "$example": value}
        return value


def _idle_streams(events: list[_Event]) -> set[StreamRef]:
    busy: set[StreamRef] = set()
    seen: set[StreamRef] = set()
    for event in events:
        seen.add(event.ref)
        if event.frame is not None and event.frame.name not in _AUTH_TYPES:
            busy.add(event.ref)
    return seen - busy


def transcript_of(
    case_id: str, events: list[_Event], variables: dict[str, Any], *, keep_idle: bool = False
) -> dict[str, Any] | None:
    """The transcript document of one recorded connection (None if nothing is left)."""
    skip = set() if keep_idle else _idle_streams(events)
    general = _Generalizer(variables)
    steps: list[dict[str, Any]] = []
    started: set[StreamRef] = set()
    messages: set[str] = set()
    layouts: set[str] = set()
    for event in events:
        ref = event.ref
        if ref in skip:
            continue
        name = _stream_name(ref)
        if ref not in started:
            started.add(ref)
            if ref.opened_by == "client":
                direction = "uni" if ref.unidirectional else "bidi"
                steps.append({"open": {"stream": name, "direction": direction}})
            else:
                steps.append({"accept": {"stream": name}})
        to_broker = event.direction == TO_BROKER
        if event.kind == "frame":
            assert event.frame is not None
            spec = spec_of(event.frame)
            if spec.kind == "message":
                messages.add(spec.type_name)
            elif spec.kind == "binary":
                layouts.add(spec.type_name)
            body = dict(spec.body)
            if spec.kind == "binary":
                convert = general.client_value if to_broker else general.broker_value
                body["fields"] = {k: convert(k, v) for k, v in body["fields"].items()}
            elif spec.kind == "message":
                convert = general.client_value if to_broker else general.broker_value
                body = {k: (v if k == "type" else convert(k, v)) for k, v in body.items()}
            action = "send" if to_broker else "expect"
            steps.append({action: {"stream": name, spec.kind: body}})
        elif to_broker:
            if event.kind == "fin":
                steps.append({"finish": {"stream": name}})
            else:
                steps.append({"reset": {"stream": name, "code": event.code or 0}})
        elif event.kind == "fin":
            steps.append({"expect_end": {"stream": name}})
        else:
            steps.append({"expect_reset": {"stream": name, "code": event.code or 0}})
    if not any("send" in s or "expect" in s for s in steps):
        return None
    return {
        "id": case_id,
        "title": f"recorded session {case_id}",
        "section": "Recorded sessions",
        "requirement": "The target MUST answer this recorded client session as the recorded "
        "broker did, up to the fields that vary between brokers.",
        "recorded": "felix-conformance record",
        "exercises": {"messages": sorted(messages), "layouts": sorted(layouts)},
        "steps": steps,
    }


def record_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="felix-conformance record",
        description="Relay clients to a broker and write what they exchanged as transcripts. "
        "Clients must trust OUT/recorder-ca.pem.",
    )
    p.add_argument("--listen", required=True, metavar="HOST:PORT")
    p.add_argument("--upstream", metavar="HOST:PORT", help="the broker (default: the fixture's)")
    p.add_argument("--ca-file", type=Path, help="CA of the upstream broker")
    p.add_argument("--server-name", default="localhost")
    p.add_argument("--fixture", type=Path, help="fixture document: upstream and variable names")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--out", type=Path, required=True, metavar="DIR")
    p.add_argument("--name", default="recorded", help="case id prefix")
    p.add_argument("--keep-idle", action="store_true", help="keep auth-only streams")
    return p


def recorder_from_args(argv: list[str]) -> tuple[Recorder, str, int]:
    """The recorder the command line describes, and where it listens."""
    args = record_parser().parse_args(argv)
    variables: dict[str, Any] = {}
    if args.fixture is not None:
        upstream = target_from_fixture(args.fixture, server_name=args.server_name)
        variables = dict(upstream.variables)
    else:
        if args.upstream is None or args.ca_file is None:
            raise ValueError("need --fixture, or --upstream and --ca-file")
        host, port = parse_host_port(args.upstream)
        upstream = Target(host, port, args.ca_file.read_bytes(), args.server_name)
    if args.upstream is not None and args.fixture is not None:
        host, port = parse_host_port(args.upstream)
        upstream = Target(host, port, upstream.ca_pem, args.server_name, upstream.variables)
    for pair in args.set:
        name, _, value = pair.partition("=")
        variables[name] = value
    recorder = Recorder(
        upstream,
        args.out,
        variables=with_defaults(variables),
        name=args.name,
        keep_idle=args.keep_idle,
    )
    listen_host, listen_port = parse_host_port(args.listen)
    return recorder, listen_host, listen_port


def main_record(argv: list[str]) -> int:
    recorder, host, port = recorder_from_args(argv)
    logging.basicConfig(level=logging.INFO)
    return asyncio.run(_record(recorder, host, port))


async def _record(recorder: Recorder, host: str, port: int) -> int:
    bound = await recorder.start(host, port)
    print(f"recording on {bound[0]}:{bound[1]}; clients trust {recorder.out / 'recorder-ca.pem'}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await recorder.close()
    for path in recorder.written:
        print(f"wrote {path}")
    return 0
