"""Conditional publishes, atomic commits and committed state (the client's side).

- `publish_if`: append a batch only if it would start exactly at
  `expected_offset` (the routed shard's tail); refused with
  `OffsetMismatchError` (carrying the tail the broker checked) otherwise,
  with nothing written.
- `commit`: one event and the changes to its entity's state as one record on
  the shard the entity key routes to; conditional with `expected_offset`.
- `state_get`: one key of an entity's committed state, with the offset of the
  commit that wrote it (`version`) and the last commit reflected (`as_of`).

Each goes on a stream of its own while in flight (the broker refuses these
with an `error` that names no request), so no refusal is ever matched to the
wrong call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from felix_wire.errors import NotLeaderError
from felix_wire.frame import MAX_FRAME_BYTES
from felix_wire.messages import (
    Commit,
    CommitOk,
    PublishIf,
    PublishOk,
    PublishRefused,
    StateChange,
    StateChangeDelete,
    StateChangePut,
    StateGet,
    StateValue,
)

from .errors import ClientError, PayloadTooLargeError, ProtocolViolationError

if TYPE_CHECKING:
    from .client import Client

__all__ = ["OffsetMismatchError", "StateEntry", "commit", "publish_if", "state_get"]


class OffsetMismatchError(ClientError):
    """A conditional write was refused because the shard's tail is not the
    expected offset; nothing was written. `tail` is the tail the broker checked."""

    def __init__(self, what: str, expected: int, tail: int) -> None:
        super().__init__(f"{what} expected the shard's tail at {expected}, but it is at {tail}")
        self.expected = expected
        self.tail = tail


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One key of an entity's committed state. `value` is None when the key was
    never written or was deleted; `version` is the offset of the commit that
    wrote it; `as_of` the last commit the answer reflects."""

    value: bytes | None
    version: int | None
    as_of: int | None


def _refusal(what: str, expected: int | None, answer: PublishRefused) -> Exception:
    reason = answer.reason
    if not isinstance(reason, str):
        if reason.offset_mismatch is not None and expected is not None:
            return OffsetMismatchError(what, expected, reason.offset_mismatch.tail)
        if reason.not_leader is not None:
            hint = reason.not_leader
            return NotLeaderError(
                f"not the leader; the owner is {hint.node_id} at {hint.addr or 'unknown'}",
                detail={"node_id": hint.node_id, "addr": hint.addr},
            )
    return ProtocolViolationError(f"{what} refused with {reason!r}: {answer.message}")


async def publish_if(
    client: Client,
    ns: str,
    stream: str,
    payloads: Sequence[bytes],
    *,
    expected_offset: int,
    key: bytes | None,
    timeout: float | None,
) -> int:
    batch = list(payloads)
    if not batch:
        raise ValueError("publish_if needs at least one payload")
    if expected_offset < 0:
        raise ValueError("expected_offset is never negative")
    size = sum(len(p) for p in batch)
    if size > MAX_FRAME_BYTES:
        raise PayloadTooLargeError("a conditional publish", size, MAX_FRAME_BYTES)
    answer = await client._exclusive_raw(
        lambda rid: PublishIf(
            tenant_id=client.tenant_id,
            namespace=ns,
            stream=stream,
            payloads=batch,
            key=key,
            expected_offset=expected_offset,
            request_id=rid,
        ),
        timeout=timeout,
        ref=await client._publish_ref(ns, stream, key),  # the key's shard, not shard 0
    )
    if isinstance(answer, PublishRefused):
        raise _refusal("publish_if", expected_offset, answer)
    if not isinstance(answer, PublishOk) or answer.offset is None:
        raise ProtocolViolationError(f"publish_if answered with {answer!r}")
    return answer.offset


def _changes(changes: Mapping[str, bytes | None]) -> list[StateChange]:
    out: list[StateChange] = []
    for name, value in changes.items():
        out.append(
            StateChangeDelete(key=name) if value is None else StateChangePut(key=name, value=value)
        )
    return out


async def commit(
    client: Client,
    ns: str,
    stream: str,
    entity_key: bytes,
    event: bytes,
    *,
    changes: Mapping[str, bytes | None],
    expected_offset: int | None,
    timeout: float | None,
) -> int:
    if expected_offset is not None and expected_offset < 0:
        raise ValueError("expected_offset is never negative")
    state = _changes(changes)
    size = len(event) + sum(len(c.value) for c in state if isinstance(c, StateChangePut))
    if size > MAX_FRAME_BYTES:
        raise PayloadTooLargeError("a commit", size, MAX_FRAME_BYTES)
    answer = await client._exclusive_raw(
        lambda rid: Commit(
            tenant_id=client.tenant_id,
            namespace=ns,
            stream=stream,
            entity_key=entity_key,
            event=event,
            changes=state,
            request_id=rid,
            expected_offset=expected_offset,
        ),
        timeout=timeout,
        ref=await client._publish_ref(ns, stream, entity_key),  # the entity's shard
    )
    if isinstance(answer, PublishRefused):
        raise _refusal("commit", expected_offset, answer)
    if not isinstance(answer, CommitOk):
        raise ProtocolViolationError(f"commit answered with {answer!r}")
    return answer.offset


async def state_get(
    client: Client, ns: str, stream: str, entity_key: bytes, key: str, *, timeout: float | None
) -> StateEntry:
    answer = await client._exclusive_call(
        lambda rid: StateGet(
            tenant_id=client.tenant_id,
            namespace=ns,
            stream=stream,
            entity_key=entity_key,
            key=key,
            request_id=rid,
        ),
        StateValue,
        timeout=timeout,
        ref=await client._publish_ref(ns, stream, entity_key),  # the entity's shard
    )
    return StateEntry(answer.value, answer.version, answer.as_of)
