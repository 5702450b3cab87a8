"""Where the tests' data lives: inside the repository, never beside it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "tests" / "vectors"
UPSTREAM_VECTORS = VECTORS / "upstream"
