"""How a shard cuts appended records into event batches (Shard.cut), without a network."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from felix_broker.catalog import StreamSpec
from felix_broker.config import load_config
from felix_broker.streams.engine import Chunk, Shard


def shard(max_events: int = 64, max_bytes: int = 65536) -> Shard:
    config = dataclasses.replace(
        load_config(environ={}, overrides={"durable_storage_dir": ""}),
        event_batch_max_events=max_events,
        event_batch_max_bytes=max_bytes,
    )
    return Shard(StreamSpec("t1", "default", "s", durable=False, shards=1), 0, config)


def chunks(sizes: list[int], publishers: list[str | None]) -> list[Chunk]:
    out, offset = [], 0
    for n, (count, publisher) in enumerate(zip(sizes, publishers, strict=True)):
        payloads = [b"%d-%d" % (n, i) for i in range(count)]
        out.append(Chunk(payloads, publisher, offset, list(range(offset, offset + count))))
        offset += count
    return out


def test_a_deliverable_publish_goes_out_as_it_came() -> None:
    (only,) = chunks([64], ["alice"])
    assert shard().cut([only], split_by_publisher=True) == [only]
    assert shard().cut([only], split_by_publisher=True)[0] is only  # not copied
    (plain,) = shard().cut([only], split_by_publisher=False)
    assert plain.payloads is only.payloads and plain.publisher is None


def test_small_publishes_join_whole_and_big_ones_are_cut() -> None:
    cut = shard(max_events=8).cut(chunks([3, 4, 5, 20], [None] * 4), split_by_publisher=False)
    # 3+4 fit together; 5 would overflow 8, so it starts the next batch whole; 20 is
    # over the bound, so it is cut, its first records filling the open batch.
    assert [len(c.payloads) for c in cut] == [7, 8, 8, 8, 1]
    assert [c.base_offset for c in cut] == [0, 7, 15, 23, 31]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    owners=st.lists(st.sampled_from(["a", "b", None]), min_size=8, max_size=8),
    max_events=st.integers(1, 16),
    max_bytes=st.integers(8, 200),
    split=st.booleans(),
)
def test_every_record_once_in_order_within_the_bounds(
    sizes: list[int],
    owners: list[str | None],
    max_events: int,
    max_bytes: int,
    split: bool,
) -> None:
    appended = chunks(sizes, owners[: len(sizes)])
    cut = shard(max_events, max_bytes).cut(appended, split_by_publisher=split)
    flat = [(c.base_offset + i, p) for c in cut for i, p in enumerate(c.payloads)]
    assert flat == [(a.base_offset + i, p) for a in appended for i, p in enumerate(a.payloads)]
    owner_of = {a.base_offset + i: a.publisher for a in appended for i in range(len(a.payloads))}
    for c in cut:
        assert c.timestamps == list(range(c.base_offset, c.base_offset + len(c.payloads)))
        # Within the bounds, except a single record bigger than the byte bound.
        assert len(c.payloads) <= max_events
        assert sum(map(len, c.payloads)) <= max_bytes or len(c.payloads) == 1
        owners_here = {owner_of[c.base_offset + i] for i in range(len(c.payloads))}
        if split:
            assert owners_here == {c.publisher}
        else:
            assert c.publisher is None
