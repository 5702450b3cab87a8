"""What a replica holds stays bounded over a long run (entries counted, not RSS).

The core keeps in memory only what is not yet applied, committed and durable
(`base`); the disk's floor (`stored_from`) follows what every replica holds; a
follower that fell behind is shipped from the disk (`ShipStored`), and a leader
without a majority refuses appends past `max_uncommitted` (`overloaded`).
"""

from __future__ import annotations

from pathlib import Path

from felix_broker.replication.core import Config, Entry, Phase
from felix_broker.replication.disk import ReplicaDisk
from felix_wire.errors import ErrorCode
from tests.replication.sim import Cluster

WRITES = 3000


def opened(config: Config | None = None) -> Cluster:
    cluster = Cluster(3, config=config)
    cluster.promote("n0")
    cluster.settle()
    return cluster


def held(cluster: Cluster) -> dict[str, int]:
    return {n: len(r.log) for n, r in cluster.nodes.items() if r is not None}


def test_a_long_run_keeps_memory_and_the_disk_floor_bounded() -> None:
    c = opened()
    most = 0
    for i in range(WRITES):
        c.append("n0", f"v{i}".encode())
        if i % 10 == 9:
            c.settle()
            most = max(most, *held(c).values())
    c.settle()
    leader = c.nodes["n0"]
    assert leader is not None and leader.mark is not None
    assert most <= 20, most  # at most a round's writes (and its answers) in memory
    for name, replica in c.nodes.items():
        assert replica is not None
        assert replica.base >= WRITES, (name, replica.base)
        assert replica.stored_from >= WRITES - 20, (name, replica.stored_from)
        assert c.disks[name].floor == replica.stored_from
    assert c.read("n0") == [f"v{i}".encode() for i in range(WRITES)]


def test_a_lagging_follower_is_shipped_from_disk_and_holds_the_disk_floor() -> None:
    c = opened()
    c.crash("n2")
    for i in range(500):
        c.append("n0", f"v{i}".encode())
        if i % 10 == 9:
            c.settle()
            assert max(held(c).values()) <= 20  # memory stays bounded while n2 is away
    c.settle()
    leader = c.nodes["n0"]
    assert leader is not None
    # n2 matched nothing: the disks keep what it lacks (the floor waits for it).
    assert leader.stored_from <= 2 and leader.base >= 500
    c.restart("n2")
    c.settle()
    assert c.stored_ships > 0  # n2 caught up from n0's disk, not its memory
    back = c.nodes["n2"]
    assert back is not None and back.phase is Phase.FOLLOWER
    assert c.full_log(back) == c.full_log(leader)
    c.append("n0", b"after")
    c.settle()
    assert leader.stored_from >= 500  # every replica holds it now: the floor moves
    assert c.disks["n2"].floor >= 500  # and the follower compacted too (told in ships)
    # n2 restarts from its compacted disk and leads: it serves what was committed.
    c.crash("n0")
    c.crash("n2")
    c.restart("n2")
    c.promote("n2")
    c.settle()
    new = c.nodes["n2"]
    assert new is not None and new.phase is Phase.LEADER and new.mark is not None
    assert c.read("n2") == [f"v{i}".encode() for i in range(500)] + [b"after"]


def test_a_leader_without_a_majority_refuses_past_the_uncommitted_bound() -> None:
    c = opened(Config(quorum_timeout_ms=1000, retransmit_ms=50, max_uncommitted=50))
    c.crash("n1")
    c.crash("n2")
    for i in range(200):
        c.append("n0", f"v{i}".encode())
        c.sync("n0")
    leader = c.nodes["n0"]
    assert leader is not None
    assert len(leader.log) - (leader.commit - leader.base) <= 50
    assert leader.length - leader.commit == 50
    refused = [op for op in c.history if op.code == ErrorCode.OVERLOADED.wire]
    assert len(refused) == 150
    assert all(op.retry == "retry_after" for op in refused)


def test_the_disk_compacts_up_to_its_whole_length_and_reads_back(tmp_path: Path) -> None:
    """A floor at the log's very end (every record held everywhere) empties the file;
    a restart reads back the base and nothing else (regression: an index past the end)."""
    disk = ReplicaDisk(tmp_path, compact_every=4)
    disk.recover()
    disk.write(0, [Entry(1, b"", start=True), *(Entry(1, b"r%d" % i) for i in range(5))])
    assert disk.compact(6, lambda e: 0 if e.start else 1)
    disk.write(6, [Entry(2, b"next")])
    disk.close()
    again = ReplicaDisk(tmp_path)
    image = again.recover()
    assert (image.base, image.base_generation, again.weight) == (6, 1, 5)
    assert image.entries == (Entry(2, b"next"),)
    assert again.read(6, 5) == (1, [Entry(2, b"next")])
    again.close()
