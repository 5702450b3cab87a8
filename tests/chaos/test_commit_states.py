"""The runner's commit-state rule: a shard's committed state is what the last commit
present in its final log wrote."""

from __future__ import annotations

from chaos.run import commit_states
from felix_broker.chaos.history import Kind, Operation, Outcome, Write


def _commit(value: str, outcome: Outcome = Outcome.OK) -> Operation:
    return Operation(
        client="c",
        kind=Kind.COMMIT,
        writes=[Write(key="s/0", value=value)],
        invoke=1,
        complete=2,
        outcome=outcome,
    )


def _final(*values: str) -> Operation:
    return Operation(
        client="f", kind=Kind.FINAL, key="s/0", values=list(values), invoke=9, outcome=Outcome.OK
    )


def test_the_state_of_the_logs_last_commit_passes() -> None:
    history = [_commit("a"), _commit("b", Outcome.UNKNOWN), _final("x", "a", "b", "y")]
    assert commit_states(history, {"s/0": "b"}) == []
    assert commit_states([_final("x")], {"s/0": None}) == []


def test_a_state_behind_the_log_or_from_a_missing_commit_fails() -> None:
    history = [_commit("a"), _commit("b"), _final("a", "b")]
    assert commit_states(history, {"s/0": "a"}) != []  # the event of b without its state
    history = [_commit("a"), _commit("b", Outcome.UNKNOWN), _final("a")]
    assert commit_states(history, {"s/0": "b"}) != []  # b's state without its event
    assert commit_states([_commit("a"), _final()], {"s/0": "a"}) != []
