"""The history checker: judges a recorded history (`history.Operation`s) by rules.

Streams are checked as append-only lists, caches as registers. Each rule below is
a `Rule`; a `Verdict` lists every violation found with the operations involved
(their indices in the history), so a failed run says exactly what went wrong.

1. `lost_write`: an acknowledged append (or commit) is missing from the final log.
2. `duplicate`: a value appears twice in a final log, a read or a subscription.
3. `read_not_prefix`: a read is not the final log's slice at its offset.
4. `real_time_order`: an append acknowledged before another was invoked sits after
   it in the final log (a write resent with its value was invoked at its first
   attempt); a tail read misses an append acknowledged before it was
   invoked; a tail read ends before a tail read that completed before it began.
5. `phantom`: a value read, delivered or finally present that no write carried, or
   whose only writes were invoked after the observing operation completed.
6. `refused_appears`: a value whose every write was definitely refused is seen.
7. `stale_cache_read`: a cache get returns a value overwritten by a put that was
   acknowledged before the get was invoked (and invoked after the value's put was
   acknowledged); an absent value counts as the value of a put before the run.
8. `partial_commit`: a commit whose writes are partly present in the final logs.
9. `delivery_order`: a subscription delivers values out of log order.
10. `lost_delivery`: a subscription skips a value of the log between two it
    delivered (or after its first position, before its first delivery).
11. `append_time_order`: a final log's append times decrease somewhere. An append
    time is the leader's clock at append (S13), so a broker whose clock jumps back
    (or a successor whose clock is behind its predecessor's) must hold them flat
    rather than go back: `offset_for_time` is a binary search over them. Nothing
    ties them to real time: a clock jumped forward stamps the future, and that is
    its clock's answer, not a violation.

12. `acked_offset`: an acknowledged write whose ack carried an offset (an append,
    an idempotent batch, a conditional publish, a commit) sits at another
    position of the final log, or a conditional write was acknowledged at an
    offset other than the tail it expected.
13. `group_lost_delivery`: a record of the final log below a consumer group's
    final cursor that no poll of the group delivered (nor is a dead letter).
14. `group_redelivery`: a poll delivers a record whose ack had been acknowledged
    before the poll was invoked.
15. `group_delivery_order`: a poll's first deliveries are not in offset order, or
    a delivered record is not the final log's record at its offset.

Idempotent batches resent after an unknown outcome carry their first value again
(the same producer id and sequence): `duplicate` is the rule that they land once.
A conditional write refused `offset_mismatch` is a definite refusal
(`history.DEFINITE_CODES`): `refused_appears` says it never lands.

A history without a `final` operation for a stream that has writes cannot be
judged for rules 1, 3, 8–10: `check` raises `IncompleteHistory`.
"""

from __future__ import annotations

import enum
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from felix_broker.chaos.history import Kind, Operation, Outcome

__all__ = ["IncompleteHistory", "Rule", "Verdict", "Violation", "check"]


class Rule(enum.Enum):
    LOST_WRITE = "lost_write"
    DUPLICATE = "duplicate"
    READ_NOT_PREFIX = "read_not_prefix"
    REAL_TIME_ORDER = "real_time_order"
    PHANTOM = "phantom"
    REFUSED_APPEARS = "refused_appears"
    STALE_CACHE_READ = "stale_cache_read"
    PARTIAL_COMMIT = "partial_commit"
    DELIVERY_ORDER = "delivery_order"
    LOST_DELIVERY = "lost_delivery"
    APPEND_TIME_ORDER = "append_time_order"
    ACKED_OFFSET = "acked_offset"
    GROUP_LOST_DELIVERY = "group_lost_delivery"
    GROUP_REDELIVERY = "group_redelivery"
    GROUP_DELIVERY_ORDER = "group_delivery_order"


class IncompleteHistory(ValueError):
    """The history lacks what the rules need (a final log for a written stream)."""


@dataclass(frozen=True, slots=True)
class Violation:
    rule: Rule
    detail: str
    operations: tuple[int, ...]


@dataclass(slots=True)
class Verdict:
    operations: int
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def rules(self) -> set[Rule]:
        return {v.rule for v in self.violations}

    def summary(self) -> str:
        if self.ok:
            return f"ok: {self.operations} operations, no violation"
        lines = [f"{len(self.violations)} violations in {self.operations} operations:"]
        lines.extend(
            f"  {v.rule.value}: {v.detail} (ops {list(v.operations)})" for v in self.violations
        )
        return "\n".join(lines)


class _Check:
    def __init__(self, history: Sequence[Operation]) -> None:
        self.history = history
        self.verdict = Verdict(len(history))
        self.finals: dict[str, list[str]] = {}
        self.positions: dict[str, dict[str, int]] = {}
        self.writers: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.puts: dict[str, list[int]] = defaultdict(list)
        for index, op in enumerate(history):
            if op.kind is Kind.FINAL:
                if op.key in self.finals:
                    raise IncompleteHistory(f"two final logs for {op.key!r}")
                self.finals[op.key] = list(op.values)
            elif op.kind is Kind.APPEND and op.value is not None:
                self.writers[(op.key, op.value)].append(index)
            elif op.kind is Kind.COMMIT:
                for write in op.writes:
                    self.writers[(write.key, write.value)].append(index)
            elif op.kind is Kind.CACHE_PUT:
                self.puts[op.key].append(index)
        written = {key for key, _ in self.writers}
        missing = sorted(written - set(self.finals))
        if missing:
            raise IncompleteHistory(f"no final log for {', '.join(map(repr, missing))}")
        for key, values in self.finals.items():
            self.positions[key] = {}
            for position, value in enumerate(values):
                self.positions[key].setdefault(value, position)

    def fail(self, rule: Rule, detail: str, *ops: int) -> None:
        self.verdict.violations.append(Violation(rule, detail, tuple(ops)))

    # -- rules over streams

    def seen(self, key: str, values: Sequence[str], observer: int | None) -> None:
        """Phantoms, refused values and duplicates among values observed on `key`."""
        counts: dict[str, int] = defaultdict(int)
        for value in values:
            counts[value] += 1
        where = (observer,) if observer is not None else ()
        for value, count in counts.items():
            if count > 1:
                self.fail(Rule.DUPLICATE, f"{key}: {value!r} appears {count} times", *where)
            writers = self.writers.get((key, value), [])
            if not writers:
                self.fail(Rule.PHANTOM, f"{key}: {value!r} was never written", *where)
                continue
            if all(self.history[w].definitely_refused for w in writers):
                self.fail(
                    Rule.REFUSED_APPEARS,
                    f"{key}: {value!r} appears though its write was refused",
                    *where,
                    *writers,
                )
            if observer is not None:
                done = self.history[observer].end
                if all(self.history[w].invoke > done for w in writers):
                    self.fail(
                        Rule.PHANTOM,
                        f"{key}: {value!r} seen before it was written",
                        observer,
                        *writers,
                    )

    def finals_rules(self) -> None:
        for key, values in self.finals.items():
            self.seen(key, values, None)
        for index, op in enumerate(self.history):
            if op.kind is not Kind.FINAL:
                continue
            back = next(
                (i for i, (a, b) in enumerate(itertools.pairwise(op.times), start=1) if b < a),
                None,
            )
            if back is not None:
                self.fail(
                    Rule.APPEND_TIME_ORDER,
                    f"{op.key}: position {back} was appended at {op.times[back]} µs, "
                    f"before position {back - 1} ({op.times[back - 1]} µs)",
                    index,
                )

    def acknowledged(self) -> None:
        for (key, value), writers in self.writers.items():
            acked = [w for w in writers if self.history[w].outcome is Outcome.OK]
            if acked and value not in self.positions[key]:
                self.fail(Rule.LOST_WRITE, f"{key}: acknowledged {value!r} is lost", *acked)

    def offsets(self) -> None:
        for index, op in enumerate(self.history):
            if op.outcome is not Outcome.OK or op.offset is None:
                continue
            if op.kind is Kind.APPEND and op.value is not None:
                writes = [(op.key, op.value)]
            elif op.kind is Kind.COMMIT:
                writes = [(w.key, w.value) for w in op.writes]
            else:
                continue
            if op.expected is not None and op.offset != op.expected:
                self.fail(
                    Rule.ACKED_OFFSET,
                    f"{op.key or writes[0][0]}: a write conditional on tail {op.expected} "
                    f"was acknowledged at {op.offset}",
                    index,
                )
                continue
            for key, value in writes:
                position = self.positions[key].get(value)
                if position is not None and position != op.offset:
                    self.fail(
                        Rule.ACKED_OFFSET,
                        f"{key}: {value!r} acknowledged at {op.offset}, at {position} in the log",
                        index,
                    )

    def commits(self) -> None:
        for index, op in enumerate(self.history):
            if op.kind is not Kind.COMMIT or not op.writes:
                continue
            present = [w for w in op.writes if w.value in self.positions.get(w.key, {})]
            if present and len(present) != len(op.writes):
                self.fail(
                    Rule.PARTIAL_COMMIT,
                    f"{len(present)} of {len(op.writes)} writes present",
                    index,
                )

    def order(self) -> None:
        """Appends acknowledged before another's invocation come first in the log."""
        by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> (op, position)
        # A write sent again with its value (an idempotent batch resent after an
        # unknown outcome) began when its first attempt did: it may sit there.
        began: dict[int, float] = {}
        for (key, value), writers in self.writers.items():
            position = self.positions[key].get(value)
            if position is not None:
                first = min(self.history[w].invoke for w in writers)
                acked = [w for w in writers if self.history[w].outcome is Outcome.OK]
                by_key[key].extend((w, position) for w in acked)
                began.update((w, first) for w in acked)
        for key, entries in by_key.items():
            for earlier, later in self._sweep(entries, entries, lambda e, p: e > p, began):
                self.fail(
                    Rule.REAL_TIME_ORDER,
                    f"{key}: acknowledged before the other began, yet after it in the log",
                    earlier,
                    later,
                )

    def _sweep(
        self,
        done: list[tuple[int, int]],
        begun: list[tuple[int, int]],
        bad: Callable[[int, int], bool],
        began: dict[int, float] | None = None,
    ) -> list[tuple[int, int]]:
        """Pairs (d, b) where `d` completed before `b` was invoked (at `began[b]`
        when given) and `bad(d's number, b's number)` holds for the largest number
        among such `d`: one sweep in time order rather than every pair."""
        starts = began or {}

        def invoked(index: int) -> float:
            return starts.get(index, self.history[index].invoke)

        by_end = sorted(done, key=lambda e: self.history[e[0]].end)
        found: list[tuple[int, int]] = []
        best: tuple[int, int] | None = None
        at = 0
        for index, number in sorted(begun, key=lambda e: invoked(e[0])):
            invoke = invoked(index)
            while at < len(by_end) and self.history[by_end[at][0]].end < invoke:
                if best is None or by_end[at][1] > best[1]:
                    best = by_end[at]
                at += 1
            if best is not None and bad(best[1], number):
                found.append((best[0], index))
        return found

    def reads(self) -> None:
        tails: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> (op, end)
        for index, op in enumerate(self.history):
            if op.kind is not Kind.READ or op.outcome is not Outcome.OK:
                continue
            self.seen(op.key, op.values, index)
            start = op.offset or 0
            final = self.finals.get(op.key, [])
            if final[start : start + len(op.values)] != op.values:
                self.fail(
                    Rule.READ_NOT_PREFIX,
                    f"{op.key}: read at {start} is not the final log's slice",
                    index,
                )
            if op.tail:
                tails[op.key].append((index, start + len(op.values)))
        for key, reads in tails.items():
            for earlier, later in self._sweep(reads, reads, lambda e, n: n < e):
                self.fail(
                    Rule.REAL_TIME_ORDER,
                    f"{key}: a tail read ends before one that completed before it began",
                    earlier,
                    later,
                )
            acked = [
                (w, self.positions[key][value])
                for (k, value), writers in self.writers.items()
                if k == key and value in self.positions[key]
                for w in writers
                if self.history[w].outcome is Outcome.OK
            ]
            for write, read in self._sweep(acked, reads, lambda p, end: p >= end):
                self.fail(
                    Rule.REAL_TIME_ORDER,
                    f"{key}: a tail read misses a write acknowledged before it began",
                    read,
                    write,
                )

    def subscriptions(self) -> None:
        for index, op in enumerate(self.history):
            if op.kind is not Kind.SUBSCRIBE:
                continue
            self.seen(op.key, op.values, index)
            positions = self.positions.get(op.key, {})
            at = [positions[v] for v in op.values if v in positions]
            if any(b <= a for a, b in itertools.pairwise(at)):
                self.fail(Rule.DELIVERY_ORDER, f"{op.key}: delivered out of log order", index)
                continue
            expected = op.offset or 0
            for position in at:
                if position != expected:
                    self.fail(
                        Rule.LOST_DELIVERY,
                        f"{op.key}: positions {expected}..{position - 1} never delivered",
                        index,
                    )
                    break
                expected = position + 1

    # -- consumer groups

    def groups(self) -> None:
        delivered: dict[tuple[str, str], set[str]] = defaultdict(set)
        acks: dict[tuple[str, str, int], float] = {}  # (key, group, offset) -> first ack's end
        polls: list[int] = []
        for index, op in enumerate(self.history):
            if op.kind is Kind.GROUP_ACK and op.outcome is Outcome.OK and op.offset is not None:
                at = (op.key, op.group, op.offset)
                acks[at] = min(acks.get(at, op.end), op.end)
            if op.kind is not Kind.GROUP_POLL or op.outcome is not Outcome.OK:
                continue
            polls.append(index)
            delivered[(op.key, op.group)].update(op.values)
            self.seen(op.key, op.values, index)
            final = self.finals.get(op.key, [])
            firsts = [o for o, a in zip(op.offsets, op.attempts, strict=False) if a <= 1]
            if any(b <= a for a, b in itertools.pairwise(firsts)):
                self.fail(
                    Rule.GROUP_DELIVERY_ORDER,
                    f"{op.key}: group {op.group!r} first deliveries out of offset order",
                    index,
                )
            for value, offset in zip(op.values, op.offsets, strict=False):
                if value in self.positions.get(op.key, {}) and (
                    offset >= len(final) or final[offset] != value
                ):
                    self.fail(
                        Rule.GROUP_DELIVERY_ORDER,
                        f"{op.key}: group {op.group!r} got {value!r} as offset {offset}, "
                        f"the final log holds it at {self.positions[op.key][value]}",
                        index,
                    )
        for index in polls:
            op = self.history[index]
            for offset in op.offsets:
                acked = acks.get((op.key, op.group, offset))
                if acked is not None and acked < op.invoke:
                    self.fail(
                        Rule.GROUP_REDELIVERY,
                        f"{op.key}: group {op.group!r} got offset {offset} again after its "
                        "ack was acknowledged",
                        index,
                    )
        for index, op in enumerate(self.history):
            if op.kind is not Kind.GROUP_CURSOR or op.offset is None:
                continue
            log = self.finals.get(op.key)
            if log is None:
                raise IncompleteHistory(f"a group cursor on {op.key!r} without its final log")
            seen = delivered[(op.key, op.group)]
            dead = set(op.offsets)
            missing = [
                p for p, value in enumerate(log[: op.offset]) if value not in seen and p not in dead
            ]
            if missing:
                self.fail(
                    Rule.GROUP_LOST_DELIVERY,
                    f"{op.key}: group {op.group!r}'s cursor is at {op.offset}, yet "
                    f"{len(missing)} record(s) below it were never delivered "
                    f"(first at {missing[0]})",
                    index,
                )

    # -- caches

    def caches(self) -> None:
        for index, op in enumerate(self.history):
            if op.kind is not Kind.CACHE_GET or op.outcome is not Outcome.OK:
                continue
            puts = self.puts.get(op.key, [])
            sources = [p for p in puts if self.history[p].value == op.value]
            if op.value is not None:
                if not sources:
                    self.fail(Rule.PHANTOM, f"cache {op.key}: {op.value!r} never put", index)
                    continue
                if all(self.history[p].definitely_refused for p in sources):
                    self.fail(
                        Rule.REFUSED_APPEARS,
                        f"cache {op.key}: {op.value!r} read though its put was refused",
                        index,
                        *sources,
                    )
                    continue
                if all(self.history[p].invoke > op.end for p in sources):
                    self.fail(Rule.PHANTOM, f"cache {op.key}: read before put", index)
                    continue
            # Every write of the value ended by `last` (the absent value: before the run);
            # stale if a put of another value began after that and was acknowledged
            # before this get began.
            ends = [self.history[p].end for p in sources]
            last = max(ends) if ends else float("-inf")
            newer = [
                p
                for p in puts
                if self.history[p].outcome is Outcome.OK
                and self.history[p].value != op.value
                and self.history[p].invoke > last
                and self.history[p].end < op.invoke
            ]
            if newer:
                self.fail(
                    Rule.STALE_CACHE_READ,
                    f"cache {op.key}: read {op.value!r} after a newer put was acknowledged",
                    index,
                    *newer,
                )


def check(history: Sequence[Operation]) -> Verdict:
    """Judge `history` by every rule; raises `IncompleteHistory` if it cannot."""
    run = _Check(history)
    run.finals_rules()
    run.acknowledged()
    run.offsets()
    run.commits()
    run.order()
    run.reads()
    run.subscriptions()
    run.groups()
    run.caches()
    return run.verdict


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m felix_broker.chaos.checker HISTORY.jsonl`: print the verdict; exit 0
    when the history keeps every rule, 1 when it breaks one, 2 when it cannot be judged."""
    import argparse
    import sys
    from pathlib import Path

    from felix_broker.chaos.history import load

    parser = argparse.ArgumentParser(prog="python -m felix_broker.chaos.checker")
    parser.add_argument("history", type=Path, help="a history file (JSON lines)")
    args = parser.parse_args(argv)
    try:
        verdict = check(load(args.history))
    except (OSError, ValueError) as exc:
        print(f"cannot judge {args.history}: {exc}", file=sys.stderr)
        return 2
    print(verdict.summary())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
