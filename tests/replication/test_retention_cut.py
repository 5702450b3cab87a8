"""Retention cuts of a Quorum stream (replication/apply.py, decision quorum-retention-cut):
two replicas whose local retention runs at different times, one of them restarted,
judge an idle producer's next numbered batch alike, because the producer table
forgets batches only at the cuts the leader put in the replicated log, and a
replica's own retention never removes records at or above the last cut it applied."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from felix_broker.catalog import StaticCatalog
from felix_broker.config import load_config
from felix_broker.groups.records import GroupChange, Kind
from felix_broker.metrics import BrokerMetrics
from felix_broker.replication.apply import (
    StreamApplier,
    decode_verdict,
    encode_batch,
    encode_retention,
    is_retention_entry,
)
from felix_broker.replication.core import Entry
from felix_broker.replication.groups import encode_changes, is_group_entry
from felix_broker.storage import LogConfig, LogStore
from felix_broker.storage.retention import Retention
from felix_broker.streams.engine import Engine
from felix_broker.streams.producers import Append, Refusal, RefusalReason, payload_digest
from felix_wire.fleet import ReplicatedBatch

from .apply_support import SPEC

pytestmark = pytest.mark.timeout(60)

P = 0xC0DE
AGE_US = 1_000_000  # the stream's retention: records older than a second go
RETENTION = Retention(max_age_us=AGE_US)


def numbered(sequence: int, at_us: int, producer: int = P) -> Entry:
    payloads = [b"n%d" % sequence]
    replicated = ReplicatedBatch(
        timestamp_us=at_us,
        payloads=payloads,
        producer_id=producer,
        sequence=sequence,
        digest=payload_digest(payloads),
    )
    return Entry(1, encode_batch(replicated))


def plain(at_us: int) -> Entry:
    # 200 bytes: a few batches fill a 1 KiB segment, so retention has segments to drop.
    return Entry(1, encode_batch(ReplicatedBatch(timestamp_us=at_us, payloads=[b"p" * 200])))


class Replica:
    """One replica's real stream log, reopened from its folder on `restart`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.store: LogStore | None = None
        self.engine: Engine | None = None
        self.applier: StreamApplier | None = None

    async def open(self) -> StreamApplier:
        config = load_config(environ={}, overrides={"data_dir": str(self.folder)}, cwd=self.folder)
        assert config.durable_storage_dir is not None
        self.store = LogStore(config.durable_storage_dir, config=LogConfig(segment_bytes=1024))
        await self.store.recover_all()
        self.engine = Engine(
            StaticCatalog(streams=[SPEC], caches=[]), config, BrokerMetrics(), self.store
        )
        shard = self.engine.shard(SPEC, 0)
        self.applier = StreamApplier(
            shard, cut_file=self.folder / "replica" / "retention-cut", retention=RETENTION
        )
        return self.applier

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.store is not None:
            await self.store.aclose()
        self.store = self.engine = self.applier = None

    async def restart(self) -> StreamApplier:
        await self.close()
        return await self.open()

    def local_retention(self, now_us: int) -> int:
        """This replica's own retention pass (what the store's task runs, at its time)."""
        assert self.applier is not None and self.applier.shard.log is not None
        return self.applier.shard.log.apply_retention(RETENTION, now_us=now_us)

    @property
    def start(self) -> int:
        assert self.applier is not None and self.applier.shard.log is not None
        return self.applier.shard.log.start_offset


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    leader, follower = Replica(tmp_path / "leader"), Replica(tmp_path / "follower")
    try:
        await leader.open()
        await follower.open()
        yield leader, follower
    finally:
        await leader.close()
        await follower.close()


async def apply_both(replicas: tuple[Replica, Replica], entries: list[Entry]) -> list[int | None]:
    """Apply `entries` on both replicas; their verdicts must agree (returns them)."""
    verdicts = []
    for replica in replicas:
        assert replica.applier is not None
        verdicts.append(await replica.applier.apply(entries))
    assert verdicts[0] == verdicts[1]
    return verdicts[0]


def verdict(value: int | None) -> object:
    assert value is not None
    return decode_verdict(value, reused_refusal=True)


async def test_an_idle_producer_is_judged_alike_by_replicas_whose_retention_ran_differently(
    pair: tuple[Replica, Replica],
) -> None:
    leader, follower = pair
    # The producer's first batch, then a second of traffic from others.
    history = [numbered(0, 1_000), *(plain(1_000 + i * 100_000) for i in range(1, 11))]
    await apply_both(pair, history)
    now = 1_000 + 10 * 100_000 + 2 * AGE_US  # everything sealed is past the retention
    # The follower's retention runs now, and it restarts (its table is rebuilt from its
    # log); no cut was replicated yet, so its retention removes nothing.
    assert follower.local_retention(now) == 0
    await follower.restart()
    # The producer resumes after an idle time longer than the retention: both append.
    assert [verdict(v) for v in await apply_both(pair, [numbered(1, now)])] == [Append()]

    # The leader's retention would now move the start: it proposes the cut, which both
    # replicas apply at this place in the log.
    assert leader.applier is not None and follower.applier is not None
    cut = leader.applier.proposed_cut(now + 2 * AGE_US)
    assert cut is not None and cut > 0
    assert follower.applier.proposed_cut(now + 2 * AGE_US) == cut  # same log, same policy
    # Other traffic first, then the cut, so the producer's batches all lie below it.
    later = now + 2 * AGE_US
    await apply_both(pair, [*(plain(later + i) for i in range(8))])
    cut = leader.applier.proposed_cut(later + 2 * AGE_US)
    assert cut is not None
    await apply_both(pair, [Entry(1, encode_retention(cut))])
    assert leader.applier.proposed_cut(later + 2 * AGE_US) is None  # applied: nothing new
    # Local retention may now run up to the cut, on one replica only, never past it.
    assert follower.local_retention(later + 10 * AGE_US) > 0
    assert follower.start <= cut
    await follower.restart()
    assert follower.applier is not None and follower.applier.retained_from == cut
    # Both forgot the producer at the cut: its next batch is unknown on both.
    resumed = await apply_both(pair, [numbered(2, later + 10 * AGE_US)])
    assert [verdict(v) for v in resumed] == [Refusal(RefusalReason.UNKNOWN_PRODUCER)]
    assert leader.start == 0  # the leader's own retention did not run: the same verdict


async def test_without_a_cut_a_replica_keeps_what_its_table_needs(
    pair: tuple[Replica, Replica],
) -> None:
    """The bug this closes: a replica whose retention removed an idle producer's batch
    and then restarted judged its next batch `unknown_producer`, while a replica that
    kept it appended it."""
    leader, follower = pair
    await apply_both(pair, [numbered(0, 1_000), *(plain(2_000 + i) for i in range(12))])
    far = 100 * AGE_US
    follower.local_retention(far)
    await follower.restart()
    leader.local_retention(far)  # the leader's pass too, without a restart
    assert [verdict(v) for v in await apply_both(pair, [numbered(1, far)])] == [Append()]


async def test_a_cut_at_the_stream_logs_end_is_applied_again_after_a_restart(
    pair: tuple[Replica, Replica],
) -> None:
    leader, _ = pair
    assert leader.applier is not None
    entries = [numbered(0, 1_000), Entry(1, encode_retention(1))]
    await leader.applier.apply(entries)
    # The restart walk: a cut after the stream log's last batch is not counted applied.
    assert leader.applier.applied_entries(entries, 0) == 1
    applier = await leader.restart()
    assert applier.retained_from == 1  # kept in its file
    assert applier.shard.marks.producers.next_sequence(P) is None
    # Applying it again changes nothing; a lower cut is ignored.
    await applier.apply([entries[1], Entry(1, encode_retention(0))])
    assert applier.retained_from == 1


def test_entries_are_told_apart() -> None:
    cut = Entry(1, encode_retention(7))
    group = Entry(1, encode_changes([GroupChange(Kind.CURSOR, "g", 3)]))
    batch = plain(1)
    assert is_retention_entry(cut) and not is_group_entry(cut)
    assert is_group_entry(group) and not is_retention_entry(group)
    assert not is_group_entry(batch) and not is_retention_entry(batch)
    assert not is_retention_entry(Entry(1, b"", start=True))
