"""The history checker catches each rule's violation on a small made-up history,
and passes the same histories without the fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from felix_broker.chaos.checker import IncompleteHistory, Rule, check
from felix_broker.chaos.history import Kind, Operation, Outcome, Write, dump, load, loads


def append(
    value: str,
    invoke: float,
    complete: float | None,
    outcome: Outcome = Outcome.OK,
    key: str = "s",
    retry: str | None = None,
) -> Operation:
    return Operation(
        client="w",
        kind=Kind.APPEND,
        key=key,
        value=value,
        invoke=invoke,
        complete=complete,
        outcome=outcome if complete is not None or outcome is not Outcome.OK else Outcome.UNKNOWN,
        retry=retry,
    )


def final(*values: str, key: str = "s") -> Operation:
    return Operation(
        client="f", kind=Kind.FINAL, key=key, values=list(values), invoke=99, outcome=Outcome.OK
    )


def read(
    values: list[str], invoke: float, complete: float, offset: int = 0, tail: bool = False
) -> Operation:
    return Operation(
        client="r",
        kind=Kind.READ,
        key="s",
        offset=offset,
        values=values,
        tail=tail,
        invoke=invoke,
        complete=complete,
        outcome=Outcome.OK,
    )


def put(
    value: str | None, invoke: float, complete: float, outcome: Outcome = Outcome.OK
) -> Operation:
    return Operation(
        client="p",
        kind=Kind.CACHE_PUT,
        key="k",
        value=value,
        invoke=invoke,
        complete=complete,
        outcome=outcome,
        retry="retry" if outcome is Outcome.REFUSED else None,
    )


def get(value: str | None, invoke: float, complete: float) -> Operation:
    return Operation(
        client="g",
        kind=Kind.CACHE_GET,
        key="k",
        value=value,
        invoke=invoke,
        complete=complete,
        outcome=Outcome.OK,
    )


def subscribe(values: list[str], offset: int = 0) -> Operation:
    return Operation(
        client="sub",
        kind=Kind.SUBSCRIBE,
        key="s",
        offset=offset,
        values=values,
        invoke=0,
        complete=50,
        outcome=Outcome.OK,
    )


def commit(writes: list[tuple[str, str]], outcome: Outcome = Outcome.OK) -> Operation:
    return Operation(
        client="c",
        kind=Kind.COMMIT,
        writes=[Write(k, v) for k, v in writes],
        invoke=1,
        complete=2,
        outcome=outcome,
    )


GOOD = [
    append("a", 0, 1),
    append("b", 2, 3),
    append("c", 2.5, None),  # never answered: may or may not be there
    read(["a"], 1.5, 1.6, tail=True),
    read(["a", "b"], 4, 5, tail=True),
    subscribe(["a", "b"]),
    put("x", 0, 1),
    put("y", 2, 3),
    get("x", 1.5, 1.6),
    get("y", 4, 5),
    final("a", "b"),
]


def test_a_correct_history_passes() -> None:
    verdict = check(GOOD)
    assert verdict.ok, verdict.summary()
    assert "no violation" in verdict.summary()


def test_the_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    dump(GOOD, path)
    assert load(path) == GOOD
    with pytest.raises(ValueError, match="history line 2"):
        loads(b'{"client":"a","kind":"append","invoke":0,"outcome":"ok"}\n{"kind":"bogus"}\n')


def only(rule: Rule, history: list[Operation]) -> None:
    verdict = check(history)
    assert verdict.rules() == {rule}, verdict.summary()


def test_lost_write() -> None:
    only(Rule.LOST_WRITE, [append("a", 0, 1), append("b", 2, 3), final("b")])


def test_an_unanswered_write_may_be_absent() -> None:
    assert check([append("a", 0, None), final()]).ok


def test_duplicate() -> None:
    only(Rule.DUPLICATE, [append("a", 0, 1), final("a", "a")])


def test_read_not_a_prefix_of_the_final_log() -> None:
    only(
        Rule.READ_NOT_PREFIX,
        [append("a", 0, 1), append("b", 0, 1), read(["b"], 2, 3), final("a", "b")],
    )


def test_real_time_order_of_appends() -> None:
    only(Rule.REAL_TIME_ORDER, [append("a", 0, 1), append("b", 2, 3), final("b", "a")])


def test_real_time_order_tail_read_misses_an_acknowledged_write() -> None:
    only(Rule.REAL_TIME_ORDER, [append("a", 0, 1), read([], 2, 3, tail=True), final("a")])


def test_real_time_order_tail_reads_go_backwards() -> None:
    history = [
        append("a", 0, None),
        read(["a"], 1, 2, tail=True),
        read([], 3, 4, tail=True),
        final("a"),
    ]
    only(Rule.REAL_TIME_ORDER, history)


def test_phantom_never_written() -> None:
    only(Rule.PHANTOM, [append("a", 0, 1), final("a", "z")])


def test_phantom_read_before_its_write_began() -> None:
    only(Rule.PHANTOM, [read(["a"], 0, 1), append("a", 2, 3), final("a")])


def test_definitely_refused_write_appears() -> None:
    refused = append("a", 0, 1, outcome=Outcome.REFUSED, retry="redirect")
    only(Rule.REFUSED_APPEARS, [refused, final("a")])


def test_a_refusal_of_unknown_outcome_may_appear() -> None:
    timed_out = append("a", 0, 1, outcome=Outcome.REFUSED, retry="outcome_unknown")
    assert check([timed_out, final("a")]).ok


def test_stale_cache_read() -> None:
    only(Rule.STALE_CACHE_READ, [put("x", 0, 1), put("y", 2, 3), get("x", 4, 5), final()])


def test_stale_cache_read_of_an_absent_value() -> None:
    only(Rule.STALE_CACHE_READ, [put("x", 0, 1), get(None, 2, 3), final()])


def test_a_concurrent_cache_read_may_see_either_value() -> None:
    assert check([put("x", 0, 1), put("y", 2, 5), get("x", 3, 4), get("y", 3, 4), final()]).ok


def test_cache_phantom_and_refused_put() -> None:
    only(Rule.PHANTOM, [get("q", 0, 1), final()])
    only(Rule.REFUSED_APPEARS, [put("x", 0, 1, Outcome.REFUSED), get("x", 2, 3), final()])


def test_partial_commit() -> None:
    history = [
        commit([("s", "a"), ("t", "b")], outcome=Outcome.UNKNOWN),
        final("a"),
        final(key="t"),
    ]
    only(Rule.PARTIAL_COMMIT, history)


def test_a_whole_commit_passes() -> None:
    assert check([commit([("s", "a"), ("t", "b")]), final("a"), final("b", key="t")]).ok


def test_delivery_order() -> None:
    history = [append("a", 0, 1), append("b", 0, 1), subscribe(["b", "a"]), final("a", "b")]
    only(Rule.DELIVERY_ORDER, history)


def test_lost_delivery() -> None:
    history = [
        append("a", 0, 1),
        append("b", 0, 1),
        append("c", 0, 1),
        subscribe(["a", "c"]),
        final("a", "b", "c"),
    ]
    only(Rule.LOST_DELIVERY, history)
    only(Rule.LOST_DELIVERY, [*history[:3], subscribe(["b", "c"]), history[-1]])
    assert check([*history[:3], subscribe(["b", "c"], offset=1), history[-1]]).ok


def test_append_times_that_go_back_in_a_final_log() -> None:
    writes = [append("a", 0, 1), append("b", 2, 3), append("c", 4, 5)]
    flat = replace(final("a", "b", "c"), times=[10, 10, 30])
    ahead = replace(final("a", "b", "c"), times=[10, 9_000_000, 9_000_000])
    back = replace(final("a", "b", "c"), times=[10, 30, 20])
    # Flat (a clock jumped back, held) and far ahead (jumped forward) keep the rule.
    assert check([*writes, flat]).ok and check([*writes, ahead]).ok
    only(Rule.APPEND_TIME_ORDER, [*writes, back])
    assert "position 2" in check([*writes, back]).summary()


def test_a_history_without_a_final_log_cannot_be_judged() -> None:
    with pytest.raises(IncompleteHistory, match="no final log for 's'"):
        check([append("a", 0, 1)])


def test_the_command_line_judges_a_history_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from felix_broker.chaos.checker import main

    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    dump(GOOD, good)
    dump([append("a", 0, 1), final()], bad)
    assert main([str(good)]) == 0
    assert main([str(bad)]) == 1
    assert "lost_write" in capsys.readouterr().out
    (tmp_path / "broken.jsonl").write_text("not json\n")
    assert main([str(tmp_path / "broken.jsonl")]) == 2
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot judge" in capsys.readouterr().err
