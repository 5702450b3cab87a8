"""Which sealed segments a retention policy removes: a pure decision, no file access."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Retention", "segments_to_delete"]


@dataclass(frozen=True, slots=True)
class Retention:
    """Keep at most ``max_bytes`` of segment files and records younger than ``max_age_us``.

    None means unbounded. Both limits apply to whole segments: a segment goes
    only when all of it is past a limit, so a log may keep up to one segment
    more than the bounds suggest.
    """

    max_bytes: int | None = None
    max_age_us: int | None = None

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {self.max_bytes}")
        if self.max_age_us is not None and self.max_age_us < 0:
            raise ValueError(f"max_age_us must be >= 0, got {self.max_age_us}")


def segments_to_delete(
    sizes: Sequence[int],
    last_timestamps_us: Sequence[int],
    *,
    retention: Retention,
    now_us: int,
) -> int:
    """How many of the oldest segments to delete (segments listed oldest first).

    The last segment is the active one and is never counted, so a log always
    keeps its tail and with it the next offset across restarts.
    """
    sealed = len(sizes) - 1
    by_size = 0
    if retention.max_bytes is not None:
        total = sum(sizes)
        while by_size < sealed and total > retention.max_bytes:
            total -= sizes[by_size]
            by_size += 1
    by_age = 0
    if retention.max_age_us is not None:
        horizon = now_us - retention.max_age_us
        while by_age < sealed and last_timestamps_us[by_age] < horizon:
            by_age += 1
    return max(by_size, by_age)
