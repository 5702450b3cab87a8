"""The checker's rules for guarded and idempotent writes and for consumer groups
(`acked_offset`, `offset_mismatch` as a definite refusal, an idempotent resend
landing once, `group_lost_delivery`, `group_redelivery`, `group_delivery_order`),
each caught on a small made-up history and passed without the fault."""

from __future__ import annotations

from msgspec.structs import replace

from felix_broker.chaos.checker import Rule, check
from felix_broker.chaos.history import Kind, Operation, Outcome, Write

from .test_checker import append, final, only

GROUP = "g"


def at(op: Operation, offset: int, expected: int | None = None) -> Operation:
    return replace(op, offset=offset, expected=expected)


def mismatch(value: str, expected: int, invoke: float = 0, complete: float = 1) -> Operation:
    """A `publish_if` refused `offset_mismatch` (the client's OffsetMismatchError)."""
    return replace(
        append(value, invoke, complete, Outcome.REFUSED), expected=expected, code="offset_mismatch"
    )


def poll(
    values: list[str],
    offsets: list[int],
    invoke: float,
    complete: float,
    attempts: list[int] | None = None,
    outcome: Outcome = Outcome.OK,
) -> Operation:
    return Operation(
        client="m",
        kind=Kind.GROUP_POLL,
        key="s",
        group=GROUP,
        values=values,
        offsets=offsets,
        attempts=attempts or [1] * len(values),
        invoke=invoke,
        complete=complete,
        outcome=outcome,
    )


def ack(offset: int, invoke: float, complete: float, outcome: Outcome = Outcome.OK) -> Operation:
    return Operation(
        client="m",
        kind=Kind.GROUP_ACK,
        key="s",
        group=GROUP,
        offset=offset,
        invoke=invoke,
        complete=complete,
        outcome=outcome,
    )


def cursor(offset: int | None, dead: list[int] | None = None) -> Operation:
    return Operation(
        client="final",
        kind=Kind.GROUP_CURSOR,
        key="s",
        group=GROUP,
        offset=offset,
        offsets=dead or [],
        invoke=100,
        complete=101,
        outcome=Outcome.OK,
    )


WRITES = [at(append("a", 0, 1), 0), at(append("b", 2, 3), 1), at(append("c", 4, 5), 2)]
LOG = final("a", "b", "c")


# -- acknowledged offsets


def test_acknowledged_writes_at_their_offsets_pass() -> None:
    commit = Operation(
        client="c",
        kind=Kind.COMMIT,
        writes=[Write("s", "d")],
        offset=3,
        expected=3,
        invoke=6,
        complete=7,
        outcome=Outcome.OK,
    )
    assert check([*WRITES, commit, final("a", "b", "c", "d")]).ok


def test_an_acknowledged_write_elsewhere_in_the_log() -> None:
    only(Rule.ACKED_OFFSET, [*WRITES[:2], at(append("c", 4, 5), 1), LOG])


def test_an_acknowledged_commit_elsewhere_in_the_log() -> None:
    commit = Operation(
        client="c",
        kind=Kind.COMMIT,
        writes=[Write("s", "d")],
        offset=5,
        invoke=6,
        complete=7,
        outcome=Outcome.OK,
    )
    only(Rule.ACKED_OFFSET, [*WRITES, commit, final("a", "b", "c", "d")])


def test_a_conditional_write_acknowledged_at_another_tail() -> None:
    # The broker appended it (at 2, where the log has it) though it expected tail 1.
    only(Rule.ACKED_OFFSET, [*WRITES[:2], at(append("c", 4, 5), 2, expected=1), LOG])
    assert check([*WRITES[:2], at(append("c", 4, 5), 2, expected=2), LOG]).ok


# -- conditional writes definitely refused


def test_a_publish_if_refused_offset_mismatch_never_appears() -> None:
    only(Rule.REFUSED_APPEARS, [*WRITES[:2], mismatch("c", expected=1), LOG])
    assert check([*WRITES[:2], mismatch("x", expected=1), final("a", "b")]).ok


def test_a_refusal_of_unknown_outcome_of_a_publish_if_may_appear() -> None:
    # Only `offset_mismatch` is definite; another refusal of no definite class is not.
    doubtful = replace(mismatch("c", expected=2), code="storage_error")
    assert check([*WRITES[:2], doubtful, LOG]).ok


# -- idempotent batches resent


def test_an_idempotent_batch_resent_after_an_unknown_outcome_lands_once() -> None:
    lost = append("b", 2, 3, Outcome.UNKNOWN)  # the producer ended: in doubt
    resent = at(append("b", 4, 5), 1)  # same id and sequence, answered with its offset
    assert check([WRITES[0], lost, resent, final("a", "b")]).ok
    only(Rule.DUPLICATE, [WRITES[0], lost, resent, final("a", "b", "b")])


# -- consumer groups


GOOD_GROUP = [
    *WRITES,
    poll(["a", "b"], [0, 1], 1, 3.5),
    ack(0, 4, 4.5),
    ack(1, 4.6, 4.8, Outcome.UNKNOWN),
    poll(["b", "c"], [1, 2], 6, 7, attempts=[2, 1]),  # b's ack was not known to land
    ack(1, 8, 9),
    ack(2, 8, 9),
    cursor(3),
    LOG,
]


def test_a_group_that_delivered_everything_below_its_cursor_passes() -> None:
    verdict = check(GOOD_GROUP)
    assert verdict.ok, verdict.summary()


def test_a_record_below_the_cursor_never_delivered() -> None:
    history = [*WRITES, poll(["a"], [0], 1, 3.5), ack(0, 4, 4.5), cursor(2), LOG]
    only(Rule.GROUP_LOST_DELIVERY, history)
    # A poll whose answer never came delivered nothing the checker can count.
    lost_poll = poll(["b"], [1], 5, 6, outcome=Outcome.UNKNOWN)
    only(Rule.GROUP_LOST_DELIVERY, [*history[:-2], lost_poll, *history[-2:]])
    # Below the cursor but dead-lettered, or at the cursor: not owed to the group.
    assert check([*history[:-2], cursor(2, dead=[1]), LOG]).ok
    assert check([*history[:-2], cursor(1), LOG]).ok


def test_a_record_delivered_again_after_its_ack_was_acknowledged() -> None:
    history = [
        *WRITES,
        poll(["a"], [0], 1, 3.5),
        ack(0, 4, 4.5),
        poll(["a"], [0], 5, 6, attempts=[2]),
        cursor(1),
        LOG,
    ]
    only(Rule.GROUP_REDELIVERY, history)
    # The same redelivery racing the ack (invoked before it completed) is allowed.
    assert check([*history[:4], poll(["a"], [0], 4.2, 6, attempts=[2]), *history[-2:]]).ok


def test_first_deliveries_out_of_offset_order() -> None:
    history = [*WRITES, poll(["b", "a"], [1, 0], 6, 7), LOG]
    only(Rule.GROUP_DELIVERY_ORDER, history)
    # Redeliveries come before new records in a poll: not out of order.
    assert check([*WRITES, poll(["b", "a"], [1, 0], 6, 7, attempts=[1, 2]), LOG]).ok


def test_a_record_delivered_under_another_offset() -> None:
    only(Rule.GROUP_DELIVERY_ORDER, [*WRITES, poll(["a", "c"], [0, 1], 6, 7), LOG])


def test_a_resent_batch_keeps_the_place_of_its_first_attempt() -> None:
    # "b" went out at 2 (unknown), landed then; "c" was acknowledged before the resend
    # of "b" began and sits after it: the resend began with its first attempt.
    first = append("b", 2, 3, Outcome.UNKNOWN)
    c = at(append("c", 3.5, 4), 2)
    resent = at(append("b", 5, 6), 1)
    assert check([WRITES[0], first, c, resent, LOG]).ok
    # Without a first attempt before "c" was acknowledged it is out of real-time order.
    only(Rule.REAL_TIME_ORDER, [WRITES[0], c, resent, LOG])
