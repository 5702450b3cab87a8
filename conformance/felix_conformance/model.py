"""The typed case model, parsed from a transcript document the schema accepted.

A case is data only: the runner (client side) and the playback server (broker
side) both walk the same steps. Field values inside messages stay as YAML
builtins, because they may hold matchers and `${variables}` that only make sense
at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from felix_wire.catalogue import ERROR_CODES, FEATURES, MESSAGES

from .schema import TranscriptError, validate_document

__all__ = [
    "CONTROL_URL",
    "DEFAULT_CONN",
    "Case",
    "FrameSpec",
    "Level",
    "Step",
    "parse_case",
    "parse_int",
]

DEFAULT_CONN = "c1"
# How long an expect waits when the step names no timeout: long enough for a
# loaded CI machine, short enough that a silent broker fails quickly.
DEFAULT_STEP_TIMEOUT = 3.0
DEFAULT_CASE_TIMEOUT = 30.0
# How long a control step waits for the target's control endpoint to apply a fault.
DEFAULT_CONTROL_TIMEOUT = 10.0
# The target variable naming the control endpoint (profile `control_url`): a case
# with a control step needs it, and gets "setup" without it.
CONTROL_URL = "control_url"

_ERROR_NAMES = {code.wire for code in ERROR_CODES.values()}


class Level(Enum):
    MUST = "must"  # a failure fails the run
    SHOULD = "should"  # run only with --strict; then a failure fails the run
    INFO = "info"  # reported, never fails the run


@dataclass(frozen=True)
class FrameSpec:
    """One frame as written in a transcript: a JSON message, a binary layout, or raw bytes."""

    kind: str  # "message" | "binary" | "raw"
    body: dict[str, Any]

    @property
    def type_name(self) -> str:
        """The message type or binary layout (raw frames have none)."""
        if self.kind == "message":
            return str(self.body["type"])
        if self.kind == "binary":
            return str(self.body["layout"])
        return "raw"


@dataclass(frozen=True)
class Step:
    """One step; `action` is the step's key in the transcript."""

    index: int
    action: str
    stream: str | None = None
    conn: str = DEFAULT_CONN
    frames: tuple[FrameSpec, ...] = ()  # send: one; expect: alternatives
    direction: str = "bidi"
    timeout: float = DEFAULT_STEP_TIMEOUT
    code: int | None = None
    seconds: float = 0.0
    fin: bool = False
    # open: which fleet broker the connection goes to (HOST:PORT text, or
    # {"other_than": HOST:PORT}); None is the target.
    broker: str | dict[str, str] | None = None
    # control: the route of the target's control endpoint to POST to (a fault),
    # and what its JSON answer must match (captures allowed).
    path: str | None = None
    answer: Any = None
    # send: how many copies of the frame go out, in one write (a flood, bounded by
    # MAX_REPEAT); expect: how many frames that match none of the alternatives may
    # come first and are passed over (bounded by MAX_SKIP), e.g. event batches
    # before the end of a subscription.
    repeat: int = 1
    skip: int = 0
    # handshake: the ALPN ids offered (empty: none), whether the broker must
    # accept the handshake, and the ALPN it must then select ("" for none; None
    # when the case does not care).
    alpn: tuple[str, ...] = ()
    accepted: bool = True
    selected: str | None = None
    # expect: the matching JSON message must also be compact, `type` first and
    # its fields in catalogue order (frames.encoding_problems).
    compact: bool = False

    def describe(self) -> str:
        where = self.stream or self.conn
        if self.path is not None:
            return f"step {self.index + 1} control POST {self.path}"
        if self.frames:
            names = " | ".join(f.type_name for f in self.frames)
            return f"step {self.index + 1} {self.action} {names} on {where}"
        return f"step {self.index + 1} {self.action} {where}"


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    section: str
    requirement: str
    level: Level
    messages: tuple[str, ...]
    layouts: tuple[str, ...]
    flags: tuple[int, ...]
    features: tuple[str, ...]
    error_codes: tuple[str, ...]
    required_features: tuple[str, ...]
    required_flags: int
    setup_vars: tuple[str, ...]
    timeout: float
    steps: tuple[Step, ...]
    source: str = ""
    min_brokers: int = 1  # setup.brokers: the fleet the case needs
    recorded: str | None = None
    # Every `${name}` the steps use that no step of the case captures: target variables.
    variables: tuple[str, ...] = ()
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def faults(self) -> bool:
        """Whether the case asks the target's control endpoint for a fault."""
        return any(step.action == "control" for step in self.steps)


def parse_int(value: int | str) -> int:
    return value if isinstance(value, int) else int(value, 16)


def _frames(body: dict[str, Any]) -> tuple[FrameSpec, ...]:
    if "any_of" in body:
        return tuple(f for alt in body["any_of"] for f in _frames(alt))
    for kind in ("message", "binary", "raw"):
        if kind in body:
            return (FrameSpec(kind, body[kind]),)
    return ()


def _step(index: int, raw: dict[str, Any]) -> Step:
    ((action, body),) = raw.items()
    if action == "wait":
        return Step(index, action, seconds=float(body))
    if action == "control":
        return Step(
            index,
            action,
            path=body["post"],
            answer=body.get("answer"),
            timeout=float(body.get("timeout", DEFAULT_CONTROL_TIMEOUT)),
        )
    args: dict[str, Any] = {
        "stream": body.get("stream"),
        "conn": body.get("conn", DEFAULT_CONN),
        "frames": _frames(body),
        "direction": body.get("direction", "bidi"),
        "timeout": float(body.get("timeout", DEFAULT_STEP_TIMEOUT)),
        "code": body.get("code"),
        "fin": bool(body.get("fin", False)),
        "broker": body.get("broker"),
        "repeat": int(body.get("repeat", 1)),
        "skip": int(body.get("skip", 0)),
        "compact": bool(body.get("compact", False)),
    }
    if action == "expect_silence":
        args["seconds"] = float(body["for"])
    if action == "handshake":
        args["alpn"] = tuple(body.get("alpn", ()))
        args["accepted"] = body.get("expect", "accepted") == "accepted"
        selected = body.get("selected", ...)
        args["selected"] = None if selected is ... else (selected or "")
    return Step(index, action, **args)


def _check_names(source: str, kind: str, names: list[str], known: set[str]) -> None:
    for name in names:
        if name not in known:
            raise TranscriptError(source, f"unknown {kind} {name!r} (not in the catalogue)")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.-]*)\}")


def _walk_names(value: Any, used: set[str], captured: set[str]) -> None:
    if isinstance(value, str):
        used.update(_VAR.findall(value))
    elif isinstance(value, list):
        for v in value:
            _walk_names(v, used, captured)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k == "$capture":
                captured.add(str(v))
            else:
                _walk_names(v, used, captured)


def target_variables(steps: list[Any]) -> tuple[str, ...]:
    """The `${names}` the steps use minus those they capture themselves, sorted."""
    used: set[str] = set()
    captured: set[str] = set()
    _walk_names(steps, used, captured)
    return tuple(sorted(used - captured))


def parse_case(document: dict[str, Any], source: str) -> Case:
    """Validate a transcript document and build its Case."""
    validate_document(document, source)
    exercises = document.get("exercises", {})
    requires = document.get("requires", {})
    setup = document.get("setup", {})
    _check_names(source, "message", exercises.get("messages", []), set(MESSAGES))
    _check_names(source, "feature", exercises.get("features", []), set(FEATURES))
    _check_names(source, "feature", requires.get("features", []), set(FEATURES))
    _check_names(source, "error code", exercises.get("error_codes", []), _ERROR_NAMES)
    required_flags = 0
    for value in requires.get("flags", []):
        required_flags |= parse_int(value)
    steps = tuple(_step(i, raw) for i, raw in enumerate(document["steps"]))
    streams_known: set[str] = set()
    for step in steps:
        if step.action in ("open", "accept") and step.stream is not None:
            streams_known.add(step.stream)
        elif step.stream is not None and step.stream not in streams_known:
            raise TranscriptError(
                source, f"steps[{step.index}].{step.action}: stream {step.stream!r} is not open"
            )
    return Case(
        id=document["id"],
        title=document["title"],
        section=document["section"],
        requirement=document["requirement"],
        level=Level(document.get("level", "must")),
        messages=tuple(exercises.get("messages", [])),
        layouts=tuple(exercises.get("layouts", [])),
        flags=tuple(parse_int(v) for v in exercises.get("flags", [])),
        features=tuple(exercises.get("features", [])),
        error_codes=tuple(exercises.get("error_codes", [])),
        required_features=tuple(requires.get("features", [])),
        required_flags=required_flags,
        setup_vars=tuple(
            setup.get("streams", []) + setup.get("caches", []) + setup.get("tokens", [])
        ),
        timeout=float(document.get("timeout", DEFAULT_CASE_TIMEOUT)),
        steps=steps,
        source=source,
        min_brokers=int(setup.get("brokers", 1)),
        recorded=document.get("recorded"),
        variables=tuple(
            sorted(
                {*target_variables(document["steps"])}
                | ({CONTROL_URL} if any(s.action == "control" for s in steps) else set())
            )
        ),
        document=document,
    )
