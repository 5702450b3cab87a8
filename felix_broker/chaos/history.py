"""A recorded history: what each client asked, when, and what it was told.

One operation per JSON line. Times are in seconds on one clock shared by every
client of the run (the workload's monotonic clock); `invoke` is when the request
left, `complete` when its answer arrived (absent: no answer ever came, which is an
unknown outcome). Values are unique per run: each write carries a value no other
write carries (a retry of an idempotent write reuses its value on purpose).

Kinds and their fields:

- `append`: `key` (the stream), `value`; `offset` when the ack carried one;
  `expected` for a conditional publish (`publish_if`: only at that tail).
- `commit`: an atomic commit, `writes` (each a key and a value) all or nothing;
  `offset` when acknowledged, `expected` when conditional.
- `read`: `key`, `offset` (first position read), `values` in log order; `tail`
  true when the read ran to the committed tail of its moment.
- `subscribe`: one subscription's whole life: `key`, `offset` (its first
  position), `values` delivered in order.
- `group_poll`: a consumer group's poll of one shard (`key`, `group`): the records
  it claimed, `values` with their `offsets` and delivery `attempts` (same order).
- `group_ack`: `key`, `group`, `offset` acknowledged.
- `group_cursor`: after the run healed, the group's cursor on `key` (`offset`,
  null: none yet) and its dead letters (`offsets`).
- `cache_put`: `key`, `value` (null for a delete).
- `cache_get`: `key`, `value` read (null: absent).
- `final`: after the run healed, the whole log of `key` (`values`), with each
  record's append time in µs (`times`, same order) when the log stores them.

Positions count delivered records only (generation-start records take an
offset on the wire but are never delivered, so they are not positions here).

`outcome` is `ok`, `refused` (with the refusal's `retry` class and `code`) or
`unknown`. Only a refusal of class `retry`, `retry_after` or `redirect`, or a
conditional write's `offset_mismatch` (answered once the condition was judged:
nothing written), says nothing was applied; any other refusal counts as unknown.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from pathlib import Path

import msgspec

__all__ = [
    "DEFINITE_CODES",
    "DEFINITE_REFUSALS",
    "Kind",
    "Operation",
    "Outcome",
    "Write",
    "dump",
    "dumps",
    "load",
    "loads",
]

DEFINITE_REFUSALS = frozenset({"retry", "retry_after", "redirect"})
# Refusal codes that say nothing was applied whatever their class.
DEFINITE_CODES = frozenset({"offset_mismatch"})


class Kind(enum.Enum):
    APPEND = "append"
    COMMIT = "commit"
    READ = "read"
    SUBSCRIBE = "subscribe"
    GROUP_POLL = "group_poll"
    GROUP_ACK = "group_ack"
    GROUP_CURSOR = "group_cursor"
    CACHE_PUT = "cache_put"
    CACHE_GET = "cache_get"
    FINAL = "final"


class Outcome(enum.Enum):
    OK = "ok"
    REFUSED = "refused"
    UNKNOWN = "unknown"


class Write(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str
    value: str


class Operation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    client: str
    kind: Kind
    invoke: float
    outcome: Outcome
    complete: float | None = None
    key: str = ""
    value: str | None = None
    values: list[str] = msgspec.field(default_factory=list)
    writes: list[Write] = msgspec.field(default_factory=list)
    offset: int | None = None
    expected: int | None = None  # a conditional write's expected tail
    group: str = ""  # a consumer group's operations: its name
    offsets: list[int] = msgspec.field(default_factory=list)  # a poll's, a cursor's dead letters
    attempts: list[int] = msgspec.field(default_factory=list)  # a poll's delivery attempts
    times: list[int] = msgspec.field(default_factory=list)  # a final log's append times
    tail: bool = False
    retry: str | None = None
    code: str | None = None

    @property
    def definitely_refused(self) -> bool:
        return self.outcome is Outcome.REFUSED and (
            self.retry in DEFINITE_REFUSALS or self.code in DEFINITE_CODES
        )

    @property
    def may_have_applied(self) -> bool:
        return not self.definitely_refused

    @property
    def end(self) -> float:
        """When the answer came; never, for an unanswered operation."""
        return self.complete if self.complete is not None else float("inf")


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Operation)


def dumps(operations: Iterable[Operation]) -> bytes:
    return b"".join(_ENCODER.encode(op) + b"\n" for op in operations)


def loads(data: bytes) -> list[Operation]:
    """Parse JSON lines; a bad line raises `ValueError` naming its line number."""
    operations: list[Operation] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            operations.append(_DECODER.decode(line))
        except msgspec.ValidationError as exc:
            raise ValueError(f"history line {number}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"history line {number}: not JSON ({exc})") from None
    return operations


def dump(operations: Iterable[Operation], path: Path) -> None:
    path.write_bytes(dumps(operations))


def load(path: Path) -> list[Operation]:
    return loads(path.read_bytes())
