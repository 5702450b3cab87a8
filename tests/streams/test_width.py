"""Announced publish widths and the stale_width decision."""

from __future__ import annotations

from felix_broker.streams.width import AnnouncedWidths


def test_keyed_batches_routed_by_another_width_are_stale() -> None:
    widths = AnnouncedWidths()
    assert widths.stale("t", "n", "s", keyed=True, actual=4) is None  # nothing announced
    widths.announce("t", "n", "s", 2)
    assert widths.stale("t", "n", "s", keyed=True, actual=4) == 2
    assert widths.stale("t", "n", "s", keyed=False, actual=4) is None  # unkeyed: shard 0
    assert widths.stale("t", "n", "other", keyed=True, actual=4) is None
    widths.announce("t", "n", "s", 4)
    assert widths.stale("t", "n", "s", keyed=True, actual=4) is None


def test_the_oldest_announcement_goes_past_the_bound() -> None:
    widths = AnnouncedWidths(bound=2)
    widths.announce("t", "n", "a", 1)
    widths.announce("t", "n", "b", 1)
    widths.announce("t", "n", "a", 1)  # refreshed: b is now the oldest
    widths.announce("t", "n", "c", 1)
    assert len(widths) == 2
    assert widths.stale("t", "n", "b", keyed=True, actual=3) is None
    assert widths.stale("t", "n", "a", keyed=True, actual=3) == 1
