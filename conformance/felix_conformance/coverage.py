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

Client cases (`clienttest.cases`: the kit plays the broker) count what their
script puts on the wire or makes the client send, as each case lists it
(`ClientCase.messages`, `layouts`, `flags`, `features`, `error_codes`,
`retries`), and the requirements their sentences cite. Each exercised entry
says which side exercised it: `broker` (a broker case) or `client` (a client
case).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from felix_wire.catalogue import BINARY_LAYOUTS, ERROR_CODES, FEATURES, LEGAL_FLAG_VALUES, MESSAGES
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.frame import FrameReader
from felix_wire.gating import FIELD_GATES, MESSAGE_GATES
from felix_wire.wire_errors import WireError

from .frames import build_frame
from .matching import MissingVariableError, is_matcher
from .model import Case, FrameSpec, Level, parse_int
from .requirements import (
    NOT_JUDGEABLE,
    REQUIREMENT_IDS,
    cited_requirements,
    covered_requirements,
)
from .schema import TranscriptError

__all__ = ["NEEDS", "SIDES", "Coverage", "Dimension", "compute_coverage", "format_coverage"]

_ERROR_NAMES = {c.wire for c in ErrorCode}
_RETRY_NAMES = {r.wire for r in RetryClass}


SIDES = ("broker", "client")


@dataclass(frozen=True)
class Dimension:
    name: str
    total: tuple[str, ...]
    covered: frozenset[str]
    # entry -> the sides that exercised it (SIDES); every covered entry has one.
    sides: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # entry -> why no case can judge it over the wire; counted apart from missing.
    not_judgeable: Mapping[str, str] = field(default_factory=dict)

    def by_side(self, side: str) -> list[str]:
        return [n for n in self.total if side in self.sides.get(n, frozenset())]

    @property
    def missing(self) -> list[str]:
        return [n for n in self.total if n not in self.covered and n not in self.not_judgeable]

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


def _client_exercises(case: ClientCaseLike, into: _Exercised) -> None:
    into.messages.update(case.messages)
    into.layouts.update(case.layouts)
    into.flags.update(_flag_text(v) for v in case.flags)
    into.features.update(case.features)
    into.errors.update(case.error_codes)
    into.retries.update(case.retries)


class ClientCaseLike(Protocol):
    """What coverage reads of a client case (`clienttest.cases.ClientCase`)."""

    @property
    def messages(self) -> tuple[str, ...]: ...
    @property
    def layouts(self) -> tuple[str, ...]: ...
    @property
    def flags(self) -> tuple[int, ...]: ...
    @property
    def features(self) -> tuple[str, ...]: ...
    @property
    def error_codes(self) -> tuple[str, ...]: ...
    @property
    def retries(self) -> tuple[str, ...]: ...
    @property
    def requirement(self) -> str: ...


def compute_coverage(
    cases: Sequence[Case], client_cases: Sequence[ClientCaseLike] = ()
) -> Coverage:
    """Broker cases (`cases`) and, when given, client cases, each entry with the
    side(s) that exercised it."""
    broker = _Exercised(set(), set(), set(), set(), set(), set())
    for case in cases:
        _case_exercises(case, broker)
    client = _Exercised(set(), set(), set(), set(), set(), set())
    for client_case in client_cases:
        _client_exercises(client_case, client)
    client_requirements = frozenset(
        i for c in client_cases for i in cited_requirements(_as_cited(c.requirement))
    )
    by_side = {"broker": broker, "client": client}

    def dimension(name: str, total: tuple[str, ...], attr: str) -> Dimension:
        sides = {
            entry: frozenset(s for s, found in by_side.items() if entry in getattr(found, attr))
            for entry in total
        }
        sides = {entry: found for entry, found in sides.items() if found}
        return Dimension(name, total, frozenset(sides), sides)

    broker_requirements = covered_requirements(cases)
    requirement_sides = {
        i: frozenset(
            s
            for s, ids in (("broker", broker_requirements), ("client", client_requirements))
            if i in ids
        )
        for i in REQUIREMENT_IDS
    }
    requirement_sides = {i: found for i, found in requirement_sides.items() if found}
    return Coverage(
        (
            dimension("messages", tuple(MESSAGES), "messages"),
            dimension("binary layouts", tuple(BINARY_LAYOUTS), "layouts"),
            dimension(
                "flag values", tuple(_flag_text(v) for v in sorted(LEGAL_FLAG_VALUES)), "flags"
            ),
            dimension("features", tuple(FEATURES), "features"),
            dimension("error codes", tuple(c.wire for c in ERROR_CODES.values()), "errors"),
            Dimension(
                "requirements",
                REQUIREMENT_IDS,
                frozenset(requirement_sides),
                requirement_sides,
                {i: why for i, why in NOT_JUDGEABLE.items() if i not in requirement_sides},
            ),
            dimension("retry classes", tuple(r.wire for r in RetryClass), "retries"),
        )
    )


def _as_cited(requirement: str) -> Case:
    """A stand-in case carrying only a requirement sentence (for its citations)."""
    return Case(
        id="", title="", section="", requirement=requirement, level=Level.MUST, messages=(),
        layouts=(), flags=(), features=(), error_codes=(), required_features=(),
        required_flags=0, setup_vars=(), timeout=1.0, steps=(), source="",
    )  # fmt: skip


# What a catalogue entry no case (broker or client) exercises needs before a case
# can provoke it: the kit's own judgement, by dimension. Each says why no case
# reaches it.
NEEDS: dict[str, dict[str, str]] = {
    "messages": {
        "stream_deleted": "a stream deleted while subscribed; no bit value is known "
        "(decision stream-deleted), so no broker may send it and no client case can "
        "offer it",
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
    """Each dimension's count, what is exercised and by which side (broker cases,
    client cases), and what has none; a missing entry
    carries what the catalogue or the kit says it needs (a cluster, a grant...)."""
    lines = []
    for d in coverage.dimensions:
        per_side = ", ".join(f"{side} {len(d.by_side(side))}" for side in SIDES if d.by_side(side))
        apart = f", {len(d.not_judgeable)} not judgeable over the wire" if d.not_judgeable else ""
        lines.append(
            f"{d.name}: {d.count}/{len(d.total)} exercised"
            + (f" ({per_side})" if per_side else "")
            + apart
        )
        lines.append(
            "  exercised: " + (", ".join(_labelled(d, n) for n in d.total if n in d.covered) or "-")
        )
        if show_missing:
            missing = [n + _needs(d.name, n) for n in d.missing]
            lines.append("  none: " + (", ".join(missing) or "-"))
        if d.not_judgeable:
            lines.append(
                "  not judgeable over the wire: "
                + ", ".join(f"{n} ({why})" for n, why in d.not_judgeable.items())
            )
    return "\n".join(lines) + "\n"


def _labelled(d: Dimension, name: str) -> str:
    """An entry, with the sides that exercised it unless only broker cases did."""
    sides = d.sides.get(name, frozenset())
    if sides == {"broker"}:
        return name
    return f"{name} [{'+'.join(s for s in SIDES if s in sides)}]"
