"""Shared test settings: where the shared reference material lives, hypothesis profiles."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent
# CI lays a copy of shared/ beside the clone; FELIX_SHARED overrides.
SHARED = Path(os.environ.get("FELIX_SHARED", REPO.parent / "shared"))

settings.register_profile(
    "default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
