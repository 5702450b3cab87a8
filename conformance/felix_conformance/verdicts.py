"""Verdicts and results of a run.

Following quic-interop-runner and Autobahn: a target that did not advertise a
feature gets "unsupported", not "failed"; a target whose setup lacks what a case
needs (a stream, a cache, a second token the profile does not name) gets
"setup", never "failed"; informational cases are reported and never fail a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .model import Case

__all__ = ["CaseResult", "RunReport", "Verdict"]


class Verdict(Enum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"  # the target did not advertise what the case needs
    SETUP = "setup"  # the target's profile lacks what the case needs
    INFORMATIONAL = "informational"


@dataclass(frozen=True)
class CaseResult:
    case: Case
    verdict: Verdict
    detail: str = ""
    step: str | None = None  # the step that failed
    expected: str | None = None
    actual: str | None = None
    duration: float = 0.0
    wire_log: str = ""


@dataclass
class RunReport:
    """One run's results. The reports render any run: `subject` says what was
    tested ("broker" here; a client tester's run names its client)."""

    target: str
    advertised_flags: int
    advertised_features: int
    results: list[CaseResult] = field(default_factory=list)
    subject: str = "broker"
    notes: list[str] = field(default_factory=list)  # e.g. what discovery found

    def count(self, verdict: Verdict) -> int:
        return sum(1 for r in self.results if r.verdict is verdict)

    @property
    def failed(self) -> bool:
        return any(r.verdict is Verdict.FAIL for r in self.results)
