"""Which catalogue entries the corpus *exercises*: messages, binary layouts,
legal flag values, feature bits, error codes and retry classes, each against
the catalogue's total, and the protocol requirements its cases cite
(requirements.py).

Only what a case really puts on the wire, or provokes the broker into putting
there, counts; what a case merely declares or `requires` does not:

- a message type or layout counts when a step sends it or expects it (an
  expectation with alternatives, `any_of`, provokes none of them for sure, so
  it counts for none);
- a flag value counts when a binary frame a step sends has it (derived from its
  fields, as the encoder does) or a single expected binary frame names it;
- an error code or retry class counts when an expected frame fixes it: `code:
  not_found` / `retry: fatal` in a JSON message, the numbers in a binary ack;
- a feature counts when the case names it under `exercises.features` and the
  case uses it: it offers the bit in an auth it sends, or it sends or expects a
  message (or a field) whose gate is that feature.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from felix_wire.catalogue import BINARY_LAYOUTS, ERROR_CODES, FEATURES, LEGAL_FLAG_VALUES, MESSAGES
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.frame import FrameReader
from felix_wire.gating import FIELD_GATES, MESSAGE_GATES
from felix_wire.wire_errors import WireError

from .frames import build_frame
from .matching import MissingVariableError, is_matcher
from .model import Case, FrameSpec, parse_int
from .requirements import REQUIREMENT_IDS, covered_requirements
from .schema import TranscriptError

__all__ = ["NEEDS", "Coverage", "Dimension", "compute_coverage", "format_coverage"]

_ERROR_NAMES = {c.wire for c in ErrorCode}
_RETRY_NAMES = {r.wire for r in RetryClass}


@dataclass(frozen=True)
class Dimension:
    name: str
    total: tuple[str, ...]
    covered: frozenset[str]

    @property
    def missing(self) -> list[str]:
        return [n for n in self.total if n not in self.covered]

    @property
    def count(self) -> int:
        return sum(1 for n in self.total if n in self.covered)


@dataclass(frozen=True)
class Coverage:
    dimensions: tuple[Dimension, ...]

    def get(self, name: str) -> Dimension:
        return next(d for d in self.dimensions if d.name == name)

    def counts(self) -> dict[str, int]:
        return {d.name: d.count for d in self.dimensions}


def _flag_text(value: int) -> str:
    return f"{value:#06x}"


_VARIABLE = re.compile(r"\$\{(\w+)\}")
_MAX_STAND_IN_VARIABLES = 6  # 2**6 ways to give a frame's variables text or numbers


def _sent_flags(spec: FrameSpec) -> int | None:
    """The frame flags a sent binary frame will carry. Its variables get stand-in
    values, text or a number each (a producer id is a number, a stream name text):
    every way of choosing is tried until one encodes."""
    names = sorted(set(_VARIABLE.findall(json.dumps(spec.body, default=str))))
    if len(names) > _MAX_STAND_IN_VARIABLES:
        names = names[:_MAX_STAND_IN_VARIABLES]
    for numbers in itertools.chain.from_iterable(
        itertools.combinations(names, k) for k in range(len(names) + 1)
    ):
        values = _StandIns(frozenset(numbers))
        try:
            data = build_frame(spec, values)
            (frame,) = FrameReader().feed(data)
        except (TranscriptError, MissingVariableError, WireError, ValueError):
            continue
        return frame.flags
    return None


class _StandIns(Mapping[str, Any]):
    """A stand-in value for every variable: the number 1 for the names given,
    text for the others; enough to encode a frame and read the flags its fields give it."""

    def __init__(self, numbers: frozenset[str]) -> None:
        self._numbers = numbers

    def __getitem__(self, key: str) -> Any:
        return 1 if key in self._numbers else "conformance"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, key: object) -> bool:
        return True


def _fixed(value: Any) -> Any:
    """The value an expectation fixes, or None when it is a matcher."""
    return None if is_matcher(value) else value


def _codes(body: Any, binary: bool) -> Iterable[tuple[str, str]]:
    """("error", name) / ("retry", name) pairs an expected body fixes, at any depth."""
    if isinstance(body, list):
        for item in body:
            yield from _codes(item, binary)
        return
    if not isinstance(body, dict) or is_matcher(body):
        return
    for key, value in body.items():
        fixed = _fixed(value)
        if key == "code":
            if isinstance(fixed, str) and fixed in _ERROR_NAMES:
                yield "error", fixed
            elif binary and isinstance(fixed, int) and fixed in ERROR_CODES:
                yield "error", ERROR_CODES[fixed].wire
        elif key == "retry":
            if isinstance(fixed, str) and fixed in _RETRY_NAMES:
                yield "retry", fixed
            elif binary and isinstance(fixed, int) and fixed in set(RetryClass):
                yield "retry", RetryClass(fixed).wire
        else:
            yield from _codes(value, binary)


def _offered(body: dict[str, Any]) -> int:
    words = 0
    low, high = body.get("client_features"), body.get("client_features_hi")
    if isinstance(low, int | str) and not isinstance(low, bool):
        words |= parse_int(low)
    if isinstance(high, int | str) and not isinstance(high, bool):
        words |= parse_int(high) << 32
    return words


def _gated_features(spec: FrameSpec) -> set[str]:
    if spec.kind != "message":
        return set()
    name = spec.type_name
    gate = MESSAGE_GATES.get(name)
    found = set(gate.names) if gate is not None else set()
    for field_gate in FIELD_GATES.get(name, ()):
        if field_gate.attr in spec.body:
            found.update(field_gate.names)
    return found


@dataclass
class _Exercised:
    messages: set[str]
    layouts: set[str]
    flags: set[str]
    features: set[str]
    errors: set[str]
    retries: set[str]


def _case_exercises(case: Case, into: _Exercised) -> None:
    offered = 0
    gated: set[str] = set()
    for step in case.steps:
        if step.action == "send":
            (spec,) = step.frames
            if spec.kind == "message":
                into.messages.add(spec.type_name)
                if spec.type_name == "auth":
                    offered |= _offered(spec.body)
            elif spec.kind == "binary":
                into.layouts.add(spec.type_name)
                flags = _sent_flags(spec)
                if flags is not None:
                    into.flags.add(_flag_text(flags))
            gated |= _gated_features(spec)
        elif step.action == "expect" and len(step.frames) == 1:
            (spec,) = step.frames
            if spec.kind == "message":
                into.messages.add(spec.type_name)
                codes = _codes(spec.body, binary=False)
            else:
                into.layouts.add(spec.type_name)
                flags_value = _fixed(spec.body.get("flags"))
                if isinstance(flags_value, int | str) and not isinstance(flags_value, bool):
                    into.flags.add(_flag_text(parse_int(flags_value)))
                codes = _codes(spec.body.get("fields", {}), binary=True)
            for kind, name in codes:
                (into.errors if kind == "error" else into.retries).add(name)
            gated |= _gated_features(spec)
    for name in case.features:
        value = FEATURES[name].value
        if name in gated or (value is not None and offered & value == value):
            into.features.add(name)


def compute_coverage(cases: Sequence[Case]) -> Coverage:
    found = _Exercised(set(), set(), set(), set(), set(), set())
    for case in cases:
        _case_exercises(case, found)
    return Coverage(
        (
            Dimension("messages", tuple(MESSAGES), frozenset(found.messages)),
            Dimension("binary layouts", tuple(BINARY_LAYOUTS), frozenset(found.layouts)),
            Dimension(
                "flag values",
                tuple(_flag_text(v) for v in sorted(LEGAL_FLAG_VALUES)),
                frozenset(found.flags),
            ),
            Dimension("features", tuple(FEATURES), frozenset(found.features)),
            Dimension(
                "error codes", tuple(c.wire for c in ERROR_CODES.values()), frozenset(found.errors)
            ),
            Dimension("requirements", REQUIREMENT_IDS, covered_requirements(cases)),
            Dimension("retry classes", tuple(r.wire for r in RetryClass), frozenset(found.retries)),
        )
    )


# What a catalogue entry no case exercises needs before a case can provoke it:
# the kit's own judgement of the reference broker (standalone, the fixture's fleet
# and its limited broker), by dimension. Each says why no case reaches it.
NEEDS: dict[str, dict[str, str]] = {
    "messages": {
        "event": "a broker that sends the JSON event encoding: the reference broker "
        "sends only binary event batches",
        "stream_deleted": "a stream deleted while subscribed; no bit value is known",
    },
    "error codes": {
        "internal": "a broker fault no request provokes in a correct broker",
        "revoked": "a broker that tells a revoked credential from an invalid one: the "
        "protocol's error table has no revoked (only the official client's code table "
        "names 16) and says a refused token is unauthenticated, as the reference broker "
        "answers a token whose key was revoked",
    },
    "features": {
        "FEATURE_STREAM_PUBLISH_WINDOW": "a case filling one stream's window as another "
        "publishes: a target whose acked publishes stay unanswered long enough",
    },
}


def _needs(dimension: str, name: str) -> str:
    """What an entry without a case needs, where the catalogue or the kit knows."""
    if dimension == "features":
        info = FEATURES.get(name)
        if info is None:
            return ""
        if info.value is None:
            return " (no bit value is known: never negotiable)"
        availability = info.availability or ""
        keep = ("cluster", "needs", "grant")
        if any(word in availability for word in keep):
            return f" ({availability})"
    why = NEEDS.get(dimension, {}).get(name)
    return f" ({why})" if why else ""


def format_coverage(coverage: Coverage, *, show_missing: bool = True) -> str:
    """Each dimension's count, what is exercised, and what has no case; a missing
    feature carries what the catalogue says it needs (a cluster, a grant...)."""
    lines = []
    for d in coverage.dimensions:
        lines.append(f"{d.name}: {d.count}/{len(d.total)} exercised")
        lines.append("  exercised: " + (", ".join(n for n in d.total if n in d.covered) or "-"))
        if show_missing:
            missing = [n + _needs(d.name, n) for n in d.missing]
            lines.append("  none: " + (", ".join(missing) or "-"))
    return "\n".join(lines) + "\n"
