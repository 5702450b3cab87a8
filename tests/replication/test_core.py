"""The replication core's rules, one scripted situation each."""

from __future__ import annotations

import pytest

from felix_broker.replication.core import (
    Acked,
    Config,
    Effect,
    Entry,
    Fence,
    FenceOk,
    FenceRefused,
    Message,
    PersistBallot,
    Phase,
    PromotionRefused,
    Refused,
    Replica,
    Send,
    Ship,
    ShipRefusal,
    ShipRefused,
)
from felix_wire.errors import ErrorCode, RetryClass
from tests.replication.sim import Cluster


def opened(size: int = 3) -> Cluster:
    cluster = Cluster(size, apply=False)  # no compaction: reads from 0
    cluster.promote("n0")
    cluster.settle()
    cluster.check()
    return cluster


def outcomes(cluster: Cluster) -> dict[str, str]:
    return {op.value or "": op.outcome.value for op in cluster.history if op.value}


def test_a_quorum_write_is_acknowledged_once_a_majority_holds_it_durably() -> None:
    c = opened()
    c.append("n0", b"v1")
    c.sync("n0")
    assert b"v1" not in c.acked  # the leader alone is not a majority
    ship_to_n1 = next(i for i, (to, _) in enumerate(c.network) if to == "n1")
    c.deliver(ship_to_n1)
    for _ in range(10):  # n1's answer reaches n0
        if c.network and c.network[0][0] == "n0":
            c.deliver(0)
    assert b"v1" not in c.acked  # n1 holds it, but not durably yet
    c.network = [(to, m) for to, m in c.network if to != "n2"]
    c.sync("n1")
    c.flush()
    assert c.acked[b"v1"] == (1, 1)  # offset 1: the generation-start record is offset 0
    c.check()
    leader = c.nodes["n0"]
    assert leader is not None and leader.read(0, 10).records == ((1, b"v1"),)


def test_no_majority_within_the_timeout_answers_quorum_timeout() -> None:
    c = opened()
    c.crash("n1")
    c.crash("n2")
    c.append("n0", b"v1")
    c.sync("n0")
    c.tick(c.config.quorum_timeout_ms - 1)
    assert outcomes(c) == {}
    c.tick(1)
    [op] = c.history
    assert (op.outcome.value, op.code, op.retry) == ("refused", "quorum_timeout", "outcome_unknown")
    # The record may still commit: outcome unknown means exactly that.
    c.restart("n1")
    c.settle()
    leader = c.nodes["n0"]
    assert leader is not None and leader.read(0, 10).records == ((1, b"v1"),)


def test_a_just_promoted_leader_is_settling_until_a_majority_confirms() -> None:
    c = Cluster(3, apply=False)
    c.promote("n0")
    leader = c.nodes["n0"]
    assert leader is not None
    assert leader.read(0, 10).code is ErrorCode.NOT_LEADER  # still fencing
    c.flush()
    assert leader.phase is Phase.LEADER and leader.settling
    result = leader.read(0, 10)
    assert (result.code, result.reason) == (ErrorCode.SHARD_UNAVAILABLE, "not_ready")
    c.append("n0", b"v1")  # writes are taken while settling; they wait for the mark
    c.settle()
    assert not leader.settling and b"v1" in c.acked


def test_a_lagging_candidate_refuses_promotion_and_the_shard_stays_unavailable() -> None:
    c = opened()
    c.crash("n2")  # n2 misses v1
    c.append("n0", b"v1")
    c.settle()
    assert b"v1" in c.acked
    c.crash("n0")
    c.restart("n2")
    c.promote("n2")
    c.settle()
    [refusal] = [e for e in c.events if isinstance(e, PromotionRefused)]
    assert refusal.ahead == ("n1",)
    assert c.leaders() == []  # never served short: nobody serves it
    c.append("n2", b"v2")
    assert c.history[-1].code == "not_leader" and c.history[-1].retry == "redirect"
    c.promote("n1")
    c.settle()
    c.check()
    leader = c.nodes["n1"]
    assert leader is not None and [p for _, p in leader.read(0, 10).records] == [b"v1"]


def test_the_old_leader_truncates_what_it_never_shipped_when_it_rejoins() -> None:
    c = opened()
    c.append("n0", b"lost")
    c.network.clear()
    c.sync("n0")
    c.crash("n0")
    c.promote("n1")
    c.settle()
    c.append("n1", b"v2")
    c.settle()
    c.restart("n0")
    old = c.nodes["n0"]
    assert old is not None and old.log[1].payload == b"lost"
    c.settle()
    c.check()
    assert [e.payload for e in old.log] == [b"", b"", b"v2"]
    assert c.disks["n0"].log == old.log


def test_a_lapsed_lease_refuses_writes_and_fails_those_waiting() -> None:
    c = opened()
    c.network.clear()
    c.append("n0", b"waiting")
    c.expire_lease("n0")
    c.append("n0", b"refused")
    by_value = {op.value: (op.code, op.retry) for op in c.history}
    assert by_value["waiting"] == ("leadership_lost", "outcome_unknown")
    assert by_value["refused"] == ("shard_unavailable", "retry")
    leader = c.nodes["n0"]
    assert leader is not None
    assert leader.read(0, 10).reason == "fenced"
    c.renew_lease("n0")
    c.append("n0", b"later")
    c.settle()
    assert b"later" in c.acked


def test_a_deposed_leader_steps_down_when_a_newer_generation_answers() -> None:
    c = opened()
    c.crash("n0")
    c.promote("n1")
    c.settle()
    c.restart("n0")  # comes back a follower, whatever its ballot said
    old = c.nodes["n0"]
    assert old is not None and old.phase is Phase.FOLLOWER
    # An old leader that never crashed hears of the newer generation from the first
    # replica it ships to.
    c2 = opened()
    c2.promote("n1")
    for _ in range(100):  # nothing reaches n0: it is not fenced and still leads
        c2.cut_off("n0")
        c2.deliver(0)
    old2 = c2.nodes["n0"]
    assert old2 is not None and old2.phase is Phase.LEADER and old2.generation == 1
    c2.append("n0", b"v")
    c2.flush()
    assert old2.phase is Phase.FOLLOWER and old2.generation == 2
    assert c2.history[-1].code == "leadership_lost"
    c2.check()


def test_a_single_replica_acknowledges_on_its_own_fsync() -> None:
    replica = Replica("a", ("a",))
    effects = replica.promote(7, now=0)
    assert replica.phase is Phase.LEADER and replica.settling
    effects = replica.append(1, [b"x", b"y"], now=0)
    assert not [e for e in effects if isinstance(e, Acked)]
    assert replica.synced(3) == [Acked(1, 1, 2, 7)]
    assert replica.log == [Entry(7, b"", start=True), Entry(7, b"x"), Entry(7, b"y")]


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="not in its replica set"):
        Replica("z", ("a", "b", "c"))
    with pytest.raises(ValueError, match="names a node twice"):
        Replica("a", ("a", "a", "b"))
    with pytest.raises(ValueError, match="positive"):
        Config(quorum_timeout_ms=0)
    replica = Replica("a", ("a",))
    replica.promote(1, now=0)
    assert replica.append(1, [], now=0) == [
        Refused(1, ErrorCode.INVALID_REQUEST, RetryClass.FATAL, "empty")
    ]
    assert replica.promote(1, now=0) == []  # a generation is never taken twice


def test_a_replica_that_knows_a_generation_but_not_its_leader_takes_its_fence() -> None:
    """Regression: a replica told of generation 5 by a refusal (leader unknown) used to
    refuse generation 5's candidate forever, so that candidate could never count it."""
    replica = Replica("b", ("a", "b", "c"))
    replica.promote(3, now=0)
    replica.receive(FenceRefused(5, "c"), now=0)
    assert (replica.generation, replica.leader) == (5, None)
    effects = replica.receive(Fence(5, "a"), now=0)
    assert PersistBallot(5, "a") in effects
    assert Send("a", FenceOk(5, "b", 0, 0)) in effects
    assert replica.receive(Fence(5, "c"), now=0) == [Send("c", FenceRefused(5, "b"))]


# -- shipping: every record once while its ship is unanswered (the throughput collapse)

SHIP_CONFIG = Config(quorum_timeout_ms=60_000, retransmit_ms=200, ship_window=4)


def _ships(effects: list[Effect], to: str) -> list[Ship]:
    return [
        e.message
        for e in effects
        if isinstance(e, Send) and e.to == to and isinstance(e.message, Ship)
    ]


def _offsets(ship: Ship) -> range:
    return range(ship.offset, ship.offset + len(ship.entries))


def _opened_leader() -> tuple[dict[str, Replica], list[Ship]]:
    """a leads b and c at generation 1; the ships to b it opened with."""
    nodes = {n: Replica(n, ("a", "b", "c"), SHIP_CONFIG) for n in "abc"}
    leader = nodes["a"]
    [fence] = [e.message for e in leader.promote(1, now=0) if isinstance(e, Send) and e.to == "b"]
    [answer] = [e.message for e in nodes["b"].receive(fence, now=0) if isinstance(e, Send)]
    opening = _ships(leader.receive(answer, now=0), "b")  # a majority (a, b): a opens
    assert leader.phase is Phase.LEADER
    return nodes, opening


def test_a_record_is_never_shipped_again_while_its_ship_is_unanswered() -> None:
    """Regression: every append shipped each follower everything from its last answered
    offset, so N writes in flight put ~N overlapping ships per follower in the outbox
    (each answer triggering one more); the serial per-peer outbox filled with stale
    duplicates, overflowed its bound and only the 200 ms resend moved anything: a
    Quorum stream fell to ~10 acks/s after a few hundred writes."""
    nodes, opening = _opened_leader()
    leader = nodes["a"]
    effects: list[Effect] = []
    for request in range(1, 201):  # 200 writes, no answer from b yet
        effects.extend(leader.append(request, [b"r%d" % request], now=0))
    effects.extend(leader.tick(now=SHIP_CONFIG.retransmit_ms - 1))  # the opening ship's too
    unanswered = [*opening, *_ships(effects, "b")]
    # At most `ship_window` ships wait for an answer, and none repeats a record.
    assert 1 <= len(unanswered) <= SHIP_CONFIG.ship_window
    shipped = [o for ship in unanswered for o in _offsets(ship)]
    assert len(shipped) == len(set(shipped))
    # b answers as it goes (with its fsyncs): each record still reaches it exactly once,
    # the window refills from the answers, and every write is acknowledged.
    follower = nodes["b"]
    queue: list[tuple[str, Message]] = [("b", s) for s in unanswered]
    acked: set[int] = set()
    to_b: list[Ship] = list(unanswered)
    for _ in range(10_000):
        if not queue:
            break
        to, message = queue.pop(0)
        out = nodes[to].receive(message, now=20)
        if to == "b":
            out.extend(follower.synced(follower.length))
        else:
            out.extend(leader.synced(leader.length))
            acked.update(e.request_id for e in out if isinstance(e, Acked))
            to_b.extend(_ships(out, "b"))
        queue.extend((e.to, e.message) for e in out if isinstance(e, Send) and e.to != "c")
    assert not queue
    every = [o for ship in to_b for o in _offsets(ship)]
    assert sorted(every) == list(range(leader.length))
    assert acked == set(range(1, 201))
    assert follower.length == leader.length


def test_an_unanswered_ship_is_shipped_again_from_its_start_after_the_retransmit_delay() -> None:
    nodes, opening = _opened_leader()
    leader = nodes["a"]
    assert [s.offset for s in opening] == [0]  # lost, as is the next one
    lost = _ships(leader.append(1, [b"lost"], now=0), "b")
    assert [s.offset for s in lost] == [1]
    due = SHIP_CONFIG.retransmit_ms
    assert _ships(leader.tick(now=due - 1), "b") == []  # unanswered, not yet due
    [again] = _ships(leader.tick(now=due), "b")  # once, from the oldest unanswered ship
    assert again.offset == 0 and again.entries[-1] == Entry(1, b"lost")
    # A refusal answering a ship sent before the resend is not news: no third copy.
    refused = ShipRefused(1, "b", ShipRefusal.RESUME, resume_at=0)
    assert _ships(leader.receive(refused, now=due + 1), "b") == []
    answers = nodes["b"].receive(again, now=due + 1)
    assert [e.message.matched for e in answers if isinstance(e, Send)] == [2]


# -- consistency Leader (decision `leader-consistency-replication`)

LEADER = Config(quorum_timeout_ms=1000, retransmit_ms=50, leader_acks=True)


def leader_opened() -> Cluster:
    cluster = Cluster(3, config=LEADER)  # applied at once, as a broker does
    cluster.promote("n0")
    cluster.settle()
    cluster.check()
    return cluster


def test_a_leader_write_is_acknowledged_and_readable_at_the_leaders_own_disk() -> None:
    c = leader_opened()
    c.append("n0", b"v1")
    c.network.clear()  # nothing reaches a follower
    assert b"v1" not in c.acked  # not durable here yet
    c.sync("n0")
    assert c.acked[b"v1"] == (1, 1)
    leader = c.nodes["n0"]
    assert leader is not None
    assert leader.read(0, 10).records == ((1, b"v1"),)
    # The majority mark has not moved: followers apply only what a majority holds.
    assert leader.commit == 1 and leader.apply_to == 2 and leader.applied_length == 2
    c.settle()
    assert leader.commit == 2
    for name in ("n1", "n2"):
        follower = c.nodes[name]
        assert follower is not None and c.full_log(follower) == c.full_log(leader)
        assert follower.apply_to == 2  # a follower applies the commit mark


def test_the_most_caught_up_live_replica_is_promoted_and_keeps_what_was_shipped() -> None:
    c = leader_opened()
    c.append("n0", b"shipped")
    c.settle()
    c.append("n0", b"to-n1-only")
    c.sync("n0")
    c.flush(apart="n2")
    c.append("n0", b"never-shipped")
    c.sync("n0")
    c.network.clear()
    assert {b"shipped", b"to-n1-only", b"never-shipped"} <= set(c.acked)
    c.crash("n0")
    c.promote("n2")  # behind n1: refused, n1 named ahead
    c.settle()
    [refusal] = [e for e in c.events if isinstance(e, PromotionRefused)]
    assert refusal.ahead == ("n1",)
    c.promote("n1")
    c.settle()
    c.check()
    leader = c.nodes["n1"]
    assert leader is not None
    served = c._compacted_values(leader) + [p for _, p in leader.read(0, 10).records]
    assert served == [b"shipped", b"to-n1-only"]


def test_a_deposed_leader_cuts_its_applied_unshipped_suffix_without_restarting() -> None:
    c = leader_opened()
    c.append("n0", b"shipped")
    c.settle()
    c.append("n0", b"never-shipped")
    c.sync("n0")
    c.network.clear()
    old = c.nodes["n0"]
    assert old is not None and old.applied_length == 3 and old.commit == 2
    c.expire_lease("n0")
    c.promote("n1")
    c.flush(apart="n0")
    c.append("n1", b"new")
    c.settle()  # n0 hears the new generation: its record at 2 is not the leader's
    c.check()
    assert old.phase is Phase.FOLLOWER and old.generation == c.nodes["n1"].generation  # type: ignore[union-attr]
    assert [e.payload for e in c.full_log(old)] == [b"", b"shipped", b"", b"new"]
    assert not any(e for e in c.events if type(e).__name__ == "Halted")  # cut, not halted


def test_a_leader_write_held_by_a_majority_first_is_acknowledged_before_it_is_applied() -> None:
    """Regression (bench/replication.py's leader3 cell): followers that fsync before
    the leader moved the commit mark past a write whose ack still waited for the
    leader's own fsync, so the write was applied first and acknowledged without its
    stream offset. The mark never trails the commit now."""
    c = leader_opened()
    c.append("n0", b"v1")
    for _ in range(20):  # ships reach the followers, which fsync; answers reach n0
        if not c.network:
            break
        c.deliver(0)
        c.sync("n1")
        c.sync("n2")
    leader = c.nodes["n0"]
    assert leader is not None and leader.synced_length < leader.length  # n0 not synced
    assert leader.commit == 2
    assert b"v1" in c.acked
    assert leader.mark is not None and leader.mark >= leader.commit


def test_a_follower_that_lost_unsynced_records_in_a_crash_is_shipped_them_again() -> None:
    # Found by the model in Leader mode (TestLeaderReplicaSet): the leader counted a
    # follower's received-but-unsynced records as held by every replica, compacted its
    # disk past them and, after the follower's crash, kept shipping from its old
    # `matched`, which the follower refused forever (a ship/refuse loop, never caught up).
    c = Cluster(3)
    c.promote("n0")
    c.settle()
    for i in range(5):
        c.append("n0", f"v{i}".encode())
    c.sync("n0")
    c.flush()  # n1 and n2 receive everything and answer; only n2 syncs it
    c.sync("n2")
    c.flush()
    leader = c.nodes["n0"]
    assert leader is not None and leader.commit == 6
    c.crash("n1")  # loses the five records it never synced
    c.restart("n1")
    c.settle()
    assert not c.network, "the leader and n1 never stopped exchanging ships"
    follower = c.nodes["n1"]
    assert follower is not None and c.full_log(follower) == c.full_log(leader)
    c.check()
