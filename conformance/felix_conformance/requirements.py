"""Which protocol requirements a case checks: the ids its requirement sentence cites.

A transcript's `requirement:` sentence ends with the ids it checks, e.g. "... and
keep reading the stream (F2, F3)." Ids resolve in the generated requirements table
(spec/requirements.yaml); a range such as "Q1-Q3" cites every id in it. Section
numbers ("§3.4") name where to read, not a requirement, and count for nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from felix_wire.requirements import CITATION, REQUIREMENTS

from .model import Case

__all__ = [
    "NOT_JUDGEABLE",
    "REQUIREMENT_IDS",
    "cited_requirements",
    "covered_requirements",
    "unknown_citations",
]

# What a case can be held to: every requirement but the open items (what no source
# specifies, stated so that code can cite it).
REQUIREMENT_IDS: tuple[str, ...] = tuple(r.id for r in REQUIREMENTS.values() if not r.open)

# Requirements no case can judge over the wire, with the reason: `coverage` lists
# them apart from the uncovered ones (a case for them would judge nothing).
NOT_JUDGEABLE: dict[str, str] = {
    "T12": "a default listen address is deployment configuration (a target listens "
    "where it was told to), and auth_ok.listener_ports needs a broker on several "
    "UDP ports, which no profile describes",
    "T13": "the plain-HTTP metrics and health listener is outside the QUIC protocol the kit speaks",
    "T14": "a default idle timeout is configuration, and the effective timeout is "
    "the smaller of both peers' (the kit's own included), so no wire shows the "
    "broker's default",
    "T17": "the WebSocket gateway for browsers is outside this protocol",
    "T18": "the inter-broker protocol is outside this one (that a client listener "
    "refuses its ALPN is T2, judged by transport.alpn-internal-only)",
    "PL6": "publish streams per shard, in-flight budgets and idempotent batches in "
    "flight are a reference client's internal conventions, stated as no wire rule",
    "H1": "the HTTP endpoints (/live, /ready, /metrics, ...) are outside the QUIC "
    "protocol the kit speaks",
    "H2": "/backup/offsets is an HTTP endpoint outside the QUIC protocol the kit speaks",
    "CF1": "knob defaults and their FELIX_* variables are documentation and "
    "configuration, never on the wire",
}

_RANGE = re.compile(rf"({CITATION.pattern})\s*[-–]\s*({CITATION.pattern})")
_ID = re.compile(r"([A-Z]+)([0-9]+)")


def _expand(first: str, last: str) -> list[str]:
    """The ids of a range "Q1-Q3"; only the ends when they differ in prefix."""
    a, b = _ID.fullmatch(first), _ID.fullmatch(last)
    if a is None or b is None or a.group(1) != b.group(1) or int(a.group(2)) > int(b.group(2)):
        return [first, last]
    return [f"{a.group(1)}{n}" for n in range(int(a.group(2)), int(b.group(2)) + 1)]


def _citations(text: str) -> list[str]:
    ids: list[str] = []
    for match in _RANGE.finditer(text):
        ids.extend(_expand(match.group(1), match.group(2)))
    ids.extend(m.group(0) for m in CITATION.finditer(_RANGE.sub(" ", text)))
    return list(dict.fromkeys(ids))


def cited_requirements(case: Case) -> tuple[str, ...]:
    """The requirement ids the case's sentence cites, in order, each once."""
    return tuple(i for i in _citations(case.requirement) if i in REQUIREMENTS)


def unknown_citations(case: Case) -> tuple[str, ...]:
    """Ids the case cites that the requirements table does not define."""
    return tuple(i for i in _citations(case.requirement) if i not in REQUIREMENTS)


def covered_requirements(cases: Iterable[Case]) -> frozenset[str]:
    return frozenset(i for case in cases for i in cited_requirements(case))
