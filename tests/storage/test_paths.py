"""On-disk folders are built from validated names only and stay under the data directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.storage.paths import UnsafePathError, log_dir, under_root
from felix_broker.storage.store import ShardKey
from felix_wire.names import InvalidNameError
from felix_wire.strategies import hostile_names, valid_names

ROOT = Path("/srv/felix/data")
AREAS = st.sampled_from(["streams", "cache", "groups"])


@given(AREAS, valid_names(), valid_names(), valid_names(), st.integers(0, 2**31))
def test_valid_names_give_a_folder_four_or_five_levels_below_the_root(
    area: str, tenant: str, namespace: str, name: str, shard: int
) -> None:
    path = log_dir(ROOT, area, tenant, namespace, name, shard)  # type: ignore[arg-type]
    relative = path.relative_to(ROOT).parts
    assert relative[-4:] == (tenant, namespace, name, str(shard))
    assert len(relative) == (4 if area == "streams" else 5)


@given(
    AREAS,
    st.integers(0, 2),
    hostile_names(),
    st.lists(valid_names(), min_size=3, max_size=3),
)
def test_a_hostile_name_in_any_position_is_refused(
    area: str, position: int, hostile: str, good: list[str]
) -> None:
    good[position] = hostile
    with pytest.raises(InvalidNameError):
        log_dir(ROOT, area, *good, 0)  # type: ignore[arg-type]


def test_the_issue_cases_no_longer_escape_or_share_a_folder() -> None:
    for tenant, namespace, name in [("..", "..", ".."), ("t", "..", ".."), ("t", ".", "a")]:
        with pytest.raises(InvalidNameError):
            log_dir(ROOT, "cache", tenant, namespace, name, 0)
    with pytest.raises(InvalidNameError):
        log_dir(ROOT, "groups", "t", "..", "..", 0)
    with pytest.raises(InvalidNameError):
        ShardKey("t", "ns", "..", 0)


@pytest.mark.parametrize("shard", [-1, True, 1.0])
def test_bad_shards_are_refused(shard: object) -> None:
    with pytest.raises(ValueError):
        log_dir(ROOT, "streams", "t", "n", "s", shard)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "segments",
    [("..",), ("a", "..", ".."), ("",), ("a/b",), ("/etc",), (".",)],
)
def test_under_root_refuses_whatever_leaves_or_is_the_root(segments: tuple[str, ...]) -> None:
    with pytest.raises(UnsafePathError):
        under_root(ROOT, *segments)


def test_shard_key_builds_its_folder_through_the_one_function(tmp_path: Path) -> None:
    key = ShardKey("t", ".ns", "s", 3)
    assert key.directory(tmp_path) == tmp_path / "t" / ".ns" / "s" / "3"
