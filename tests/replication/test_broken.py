"""Each deliberately broken replica is caught twice: by the model's invariants while
it runs, and by the history checker on what its clients saw. The same scripts on
the correct core pass both."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from felix_broker.chaos.checker import Rule, check
from felix_broker.replication.core import Phase, PromotionRefused, Replica
from tests.replication.broken import AcksBeforeMajority, KeepsOnRejoin, PromotesLagging
from tests.replication.sim import Cluster, InvariantViolated


class Run:
    """A scripted run that notes the first invariant violation instead of stopping."""

    def __init__(self, replica: type[Replica]) -> None:
        self.cluster = Cluster(3, replica)
        self.violation: str | None = None

    def step(self, action: Callable[[], object]) -> None:
        action()
        try:
            self.cluster.check()
        except InvariantViolated as exc:
            self.violation = self.violation or str(exc)

    def drop_to(self, name: str) -> None:
        self.cluster.network = [(to, m) for to, m in self.cluster.network if to != name]

    def verdict_rules(self, leader: str) -> set[Rule]:
        replica = self.cluster.nodes[leader]
        assert replica is not None and replica.mark is not None
        return check(self.cluster.final_history(replica)).rules()


def ack_before_majority(run: Run) -> str:
    c = run.cluster
    run.step(lambda: c.promote("n0"))
    run.step(c.settle)
    run.step(lambda: c.append("n0", b"v1"))
    run.step(c.network.clear)  # the ships are lost
    run.step(lambda: c.sync("n0"))  # the broken leader acknowledges here
    run.step(lambda: c.crash("n0"))
    run.step(lambda: c.promote("n1"))
    run.step(c.settle)
    run.step(lambda: c.append("n1", b"v2"))
    run.step(c.settle)
    return "n1"


def promote_lagging(run: Run) -> str:
    c = run.cluster
    run.step(lambda: c.promote("n0"))
    run.step(c.settle)
    run.step(lambda: c.append("n0", b"v1"))
    run.step(lambda: run.drop_to("n2"))  # n2 never gets v1: it lags
    run.step(lambda: c.sync("n0"))
    run.step(lambda: c.deliver(0))  # the ship reaches n1
    run.step(lambda: c.sync("n1"))  # n1's durable answer...
    run.step(c.flush)  # ...reaches n0: v1 is acknowledged
    assert b"v1" in c.acked
    run.step(lambda: c.crash("n0"))
    run.step(lambda: c.promote("n2"))  # the lagging replica
    run.step(c.settle)
    leader = c.nodes["n2"]
    if leader is not None and leader.phase is Phase.LEADER:
        return "n2"
    # The correct core refused: the fleet promotes the replica that is ahead.
    assert any(isinstance(e, PromotionRefused) and e.ahead == ("n1",) for e in c.events)
    run.step(lambda: c.promote("n1"))
    run.step(c.settle)
    return "n1"


def no_truncate_on_rejoin(run: Run) -> str:
    c = run.cluster
    run.step(lambda: c.promote("n0"))
    run.step(c.settle)
    run.step(lambda: c.append("n0", b"v1"))  # written on n0 only
    run.step(c.network.clear)
    run.step(lambda: c.sync("n0"))
    run.step(lambda: c.crash("n0"))  # v1 survives on n0's disk, unacknowledged
    run.step(lambda: c.promote("n1"))
    run.step(c.settle)
    run.step(lambda: c.append("n1", b"v2"))
    run.step(c.settle)
    run.step(lambda: c.read("n1"))  # a reader sees [v2]
    run.step(lambda: c.restart("n0"))  # the old leader rejoins generation 2
    run.step(c.settle)
    run.step(lambda: c.crash("n1"))
    run.step(lambda: c.promote("n0"))
    run.step(c.settle)
    return "n0"


SCRIPTS = {
    "ack_before_majority": (ack_before_majority, AcksBeforeMajority, Rule.LOST_WRITE),
    "promote_lagging": (promote_lagging, PromotesLagging, Rule.LOST_WRITE),
    "no_truncate_on_rejoin": (no_truncate_on_rejoin, KeepsOnRejoin, Rule.READ_NOT_PREFIX),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_broken_replica_is_caught_by_the_model_and_the_checker(name: str) -> None:
    script, broken, rule = SCRIPTS[name]
    run = Run(broken)
    leader = script(run)
    assert run.violation is not None, "the model's invariants missed it"
    assert rule in run.verdict_rules(leader)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_correct_core_passes_the_same_script(name: str) -> None:
    script, _, _ = SCRIPTS[name]
    run = Run(Replica)
    leader = script(run)
    assert run.violation is None, run.violation
    assert run.verdict_rules(leader) == set()
