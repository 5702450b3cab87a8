"""Which catalogue entries the corpus exercises: messages, binary layouts, legal
flag values, feature bits and error codes, each against the catalogue's total, and
the protocol requirements its cases cite (requirements.py).

An entry counts when a case declares it under `exercises` (or, for features,
`requires`), or when a step sends or expects it (message types, layouts, and
the flags of binary frames written with literal flags).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from felix_wire.catalogue import BINARY_LAYOUTS, ERROR_CODES, FEATURES, LEGAL_FLAG_VALUES, MESSAGES

from .model import Case, parse_int
from .requirements import REQUIREMENT_IDS, covered_requirements

__all__ = ["Coverage", "Dimension", "compute_coverage", "format_coverage"]


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


def _flag_text(value: int) -> str:
    return f"{value:#06x}"


def _step_names(case: Case) -> Iterable[tuple[str, str]]:
    """(kind, name) of every message type, layout and literal binary flag in the steps."""
    for step in case.steps:
        for spec in step.frames:
            if spec.kind == "message":
                yield "message", spec.type_name
            elif spec.kind == "binary":
                yield "layout", spec.type_name
                flags = spec.body.get("flags")
                if isinstance(flags, int | str) and not isinstance(flags, bool):
                    yield "flag", _flag_text(parse_int(flags))


def compute_coverage(cases: Sequence[Case]) -> Coverage:
    messages: set[str] = set()
    layouts: set[str] = set()
    flags: set[str] = set()
    features: set[str] = set()
    errors: set[str] = set()
    for case in cases:
        messages.update(case.messages)
        layouts.update(case.layouts)
        flags.update(_flag_text(v) for v in case.flags)
        features.update(case.features)
        features.update(case.required_features)
        errors.update(case.error_codes)
        for kind, name in _step_names(case):
            {"message": messages, "layout": layouts, "flag": flags}[kind].add(name)
    return Coverage(
        (
            Dimension("messages", tuple(MESSAGES), frozenset(messages)),
            Dimension("binary layouts", tuple(BINARY_LAYOUTS), frozenset(layouts)),
            Dimension(
                "flag values",
                tuple(_flag_text(v) for v in sorted(LEGAL_FLAG_VALUES)),
                frozenset(flags),
            ),
            Dimension("features", tuple(FEATURES), frozenset(features)),
            Dimension(
                "error codes", tuple(c.wire for c in ERROR_CODES.values()), frozenset(errors)
            ),
            Dimension("requirements", REQUIREMENT_IDS, covered_requirements(cases)),
        )
    )


def format_coverage(coverage: Coverage, *, show_missing: bool = True) -> str:
    lines = []
    for d in coverage.dimensions:
        lines.append(f"{d.name}: {d.count}/{len(d.total)}")
        lines.append("  covered: " + (", ".join(n for n in d.total if n in d.covered) or "-"))
        if show_missing:
            lines.append("  missing: " + (", ".join(d.missing) or "-"))
    return "\n".join(lines) + "\n"
