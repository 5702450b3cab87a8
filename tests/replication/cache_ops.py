"""Hypothesis strategies and helpers for the Quorum cache applier's tests: random
committed cache ops (puts, deletes, conditional writes, expiries, counter adds) and
applying a batch of them through a `CacheApplier`."""

from __future__ import annotations

from hypothesis import strategies as st

from felix_broker.replication.cache import CacheApplier, CacheOutcome, encode_op
from felix_broker.replication.core import Entry
from felix_wire.fleet import CacheOpKind, ReplicatedCacheOp

KEYS = ["a", "b", "c"]

ops = st.lists(
    st.one_of(
        st.builds(
            ReplicatedCacheOp,
            op=st.just(CacheOpKind.PUT),
            key=st.sampled_from(KEYS),
            now_ms=st.integers(1000, 2000),
            value=st.binary(max_size=300),
            ttl_ms=st.one_of(st.none(), st.integers(1, 500)),
        ),
        st.builds(
            ReplicatedCacheOp,
            op=st.sampled_from([CacheOpKind.DELETE]),
            key=st.sampled_from(KEYS),
            now_ms=st.integers(1000, 2000),
        ),
        st.builds(
            ReplicatedCacheOp,
            op=st.sampled_from([CacheOpKind.PUT_IF]),
            key=st.sampled_from(KEYS),
            now_ms=st.integers(1000, 2000),
            value=st.binary(max_size=8),
            version=st.one_of(st.none(), st.integers(0, 30)),
        ),
        st.builds(
            ReplicatedCacheOp,
            op=st.sampled_from([CacheOpKind.DELETE_IF, CacheOpKind.EXPIRE]),
            key=st.sampled_from(KEYS),
            now_ms=st.integers(1000, 2000),
            version=st.integers(0, 30),
        ),
        st.builds(
            ReplicatedCacheOp,
            op=st.just(CacheOpKind.COUNTER_ADD),
            key=st.sampled_from(KEYS),
            now_ms=st.integers(1000, 2000),
            delta=st.integers(-(2**62), 2**62),
        ),
    ),
    max_size=40,
)


async def apply_all(
    applier: CacheApplier, batch: list[ReplicatedCacheOp]
) -> list[CacheOutcome | None]:
    entries = [Entry(1, encode_op(op)) for op in batch]
    numbers = await applier.apply(entries)
    return [applier.take(n) for n in numbers]
