"""The wire log of one case: every frame and stream event, in order, with times.

It goes into a failed case's report and, with --log-dir, into one file per case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["WireLog"]


@dataclass
class WireLog:
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def _add(self, where: str, arrow: str, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.lines.append(f"{elapsed:8.3f}s {where:<12} {arrow} {text}")

    def sent(self, where: str, text: str) -> None:
        self._add(where, "->", text)

    def received(self, where: str, text: str) -> None:
        self._add(where, "<-", text)

    def note(self, where: str, text: str) -> None:
        self._add(where, "..", text)

    def text(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")
