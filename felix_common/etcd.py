"""A small typed seam over the etcd v3 client (`aetcd`, asyncio over gRPC).

Everything that talks to etcd goes through `EtcdClient`: the broker's
membership and assignment watcher, the control plane's placer and its etcd
store. It speaks in plain values (`KeyValue`, `WatchEvent`, the
`Compare`/`Put`/`Delete` of a transaction), maps every client failure to
`EtcdUnavailableError` (or `CompactedError` for a watch that starts below the
compaction point), bounds every call by `timeout_s`, and moves to the next
endpoint of the list after a failed call.

Keys are text; values are bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aetcd
import aetcd.exceptions
import aetcd.rpc

__all__ = [
    "CompactedError",
    "Compare",
    "Delete",
    "EtcdClient",
    "EtcdRequestError",
    "EtcdUnavailableError",
    "KeyValue",
    "Put",
    "WatchEvent",
    "lease_clock",
    "parse_endpoints",
    "prefix_end",
]

_log = logging.getLogger(__name__)


class EtcdUnavailableError(Exception):
    """An etcd call failed: etcd down, unreachable, slower than the call's bound, or
    refusing it (`EtcdRequestError`). Callers retry."""


class EtcdRequestError(EtcdUnavailableError):
    """etcd answered and refused the request (an unknown lease, no leader yet during a
    restart, ...): the call failed like any other, but the endpoint is not to blame."""


class CompactedError(Exception):
    """A watch asked for revisions etcd has compacted away: read the prefix again."""

    def __init__(self, compacted_revision: int) -> None:
        super().__init__(f"revisions below {compacted_revision} are compacted")
        self.compacted_revision = compacted_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes  # empty for a delete
    mod_revision: int  # the revision of the change (a delete's own revision)


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: the key's `target` compared with `value`."""

    key: str
    target: Literal["mod_revision", "create_revision", "version", "value"]
    op: Literal["==", "!=", "<", ">"]
    value: int | bytes


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    range_end: str | None = None  # delete [key, range_end); None: the key alone


def lease_clock() -> float:
    """Seconds on a clock that keeps counting while the host is suspended (lease
    deadlines are judged on it)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.clock_gettime(boottime)
    return time.monotonic()


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` as (host, port) pairs; ValueError when malformed."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port, got {item!r}")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


def prefix_end(prefix: str) -> str:
    """The end of the range holding every key that starts with `prefix`."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return "\0"
    raw[-1] += 1
    return raw.decode()


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        version=int(raw.version),
        lease=int(raw.lease),
    )


def _cancelled_here() -> bool:
    """Whether the running task was asked to stop (as opposed to gRPC cancelling a call)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


_UNAVAILABLE = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.InternalError,
    aetcd.exceptions.WatchTimeoutError,
    TimeoutError,
    OSError,
)


class EtcdClient:
    """One connection to an etcd cluster, with failover along the endpoint list."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], *, timeout_s: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self._endpoints = list(endpoints)
        self._index = 0
        self._timeout = timeout_s
        self._client = self._new_client()
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: set[Any] = set()  # failed channels, closed after the call bound

    @property
    def endpoint(self) -> str:
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    def _new_client(self) -> Any:
        host, port = self._endpoints[self._index]
        timeout = max(1, round(self._timeout))
        return aetcd.Client(host=host, port=port, timeout=timeout)

    def _failover(self, failed: Any) -> None:
        """After a failed call on `failed`: use the next endpoint. The old channel is
        closed once the calls still on it have had their time (closing it at once
        would cancel them)."""
        if failed is not self._client:
            return  # another call has moved on already
        self._index = (self._index + 1) % len(self._endpoints)
        self._client = self._new_client()
        self._retired.add(failed)
        task = asyncio.get_running_loop().create_task(self._close_later(failed))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_later(self, client: Any) -> None:
        await asyncio.sleep(self._timeout)
        self._retired.discard(client)
        await self._close_client(client)

    async def _close_client(self, client: Any) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await client.close()
        except Exception:  # a broken channel may fail to close; it is dropped either way
            _log.debug("closing an etcd channel", exc_info=True)

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call_with(name, lambda client: getattr(client, name)(*args, **kwargs))

    async def _call_with(self, name: str, call: Callable[[Any], Awaitable[Any]]) -> Any:
        client = self._client
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
            async with asyncio.timeout(self._timeout):
                return await call(client)
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise CompactedError(int(exc.compacted_revision)) from None
        except _UNAVAILABLE as exc:
            self._failover(client)
            raise EtcdUnavailableError(f"etcd {name}: {exc}") from exc
        except aetcd.exceptions.ClientError as exc:
            raise EtcdRequestError(f"etcd {name}: {exc}") from exc
        except asyncio.CancelledError:
            if _cancelled_here():
                raise
            # gRPC cancels a call whose channel closed under it: a failed call, not ours.
            self._failover(client)
            raise EtcdUnavailableError(f"etcd {name}: the channel closed") from None

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for client in [*self._retired, self._client]:
            await self._close_client(client)
        self._retired.clear()

    # -- keys ------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        answer = await self._call("get", key.encode())
        return None if answer is None else _kv(answer)

    async def get_prefix(self, prefix: str) -> tuple[int, list[KeyValue]]:
        """Every key under `prefix` (in key order) and the revision the read saw."""
        answer = await self._call("get_prefix", prefix.encode())
        return int(answer.header.revision), [_kv(kv) for kv in answer]

    async def get_range(
        self, start: str, end: str, *, limit: int = 0, revision: int = 0
    ) -> tuple[int, list[KeyValue]]:
        """Keys in [start, end) in key order, at most `limit` (0: all), as of `revision`
        (0: now); and the revision the read saw."""
        request = aetcd.rpc.RangeRequest(
            key=start.encode(), range_end=end.encode(), limit=limit, revision=revision
        )

        async def read(client: Any) -> Any:
            await client.connect()
            try:
                return await client.kvstub.Range(request, metadata=client.metadata)
            except aetcd.rpc.AioRpcError as exc:
                aetcd.exceptions._handle_exception(exc)

        answer = await self._call_with("range", read)
        return int(answer.header.revision), [_kv(kv) for kv in answer.kvs]

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write `key`; the revision of the write (the key's new mod_revision)."""
        answer = await self._call("put", key.encode(), value, lease=lease or None)
        return int(answer.header.revision)

    async def delete(self, key: str) -> bool:
        answer = await self._call("delete", key.encode())
        return bool(answer is not None and answer.deleted)

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> tuple[bool, int]:
        """One transaction: whether every compare held, and the revision after it
        (for a successful write, its keys' new mod_revision)."""
        tx = self._client.transactions
        built = [self._compare(tx, c) for c in compares]
        ok, responses = await self._call(
            "transaction",
            compare=built,
            success=[self._op(tx, op) for op in success],
            failure=[self._op(tx, op) for op in failure],
        )
        revision = 0
        for response in responses:
            kind = response.WhichOneof("response")
            if kind is not None:
                revision = max(revision, int(getattr(response, kind).header.revision))
        return bool(ok), revision

    @staticmethod
    def _compare(tx: Any, compare: Compare) -> Any:
        key = compare.key.encode()
        target: Any = {
            "mod_revision": tx.mod,
            "create_revision": tx.create,
            "version": tx.version,
            "value": tx.value,
        }[compare.target](key)
        if compare.op == "==":
            return target == compare.value
        if compare.op == "!=":
            return target != compare.value
        if compare.op == "<":
            return target < compare.value
        return target > compare.value

    @staticmethod
    def _op(tx: Any, op: Put | Delete) -> Any:
        if isinstance(op, Put):
            return tx.put(op.key.encode(), op.value, lease=op.lease or None)
        end = None if op.range_end is None else op.range_end.encode()
        return tx.delete(op.key.encode(), range_end=end)

    # -- leases ----------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> int:
        lease = await self._call("lease", ttl_s)
        return int(lease.id)

    async def keepalive(self, lease_id: int) -> int:
        """Renew a lease once; its remaining TTL in seconds (0 or less: it expired)."""
        answer = await self._call("refresh_lease", lease_id)
        return 0 if answer is None else int(answer.TTL)

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease (and delete its keys); a lease etcd no longer has is no error."""
        try:
            await self._call("revoke_lease", lease_id)
        except EtcdRequestError as exc:
            if "not found" not in str(exc):
                raise

    # -- watches and maintenance -------------------------------------------------------

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Changes under `prefix` from `start_revision` (inclusive), in revision order.

        Ends by raising: `CompactedError` when `start_revision` is compacted,
        `EtcdUnavailableError` when the stream breaks. Cancel the consumer to stop.
        """
        client = self._client
        watch = await self._call("watch_prefix", prefix.encode(), start_revision=start_revision)
        try:
            async for event in watch:
                kind: Literal["put", "delete"] = "delete" if event.kind == "DELETE" else "put"
                kv = event.kv
                yield WatchEvent(
                    kind=kind,
                    key=bytes(kv.key).decode(),
                    value=b"" if kind == "delete" else bytes(kv.value),
                    mod_revision=int(kv.mod_revision),
                )
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise CompactedError(int(exc.compacted_revision)) from None
        except (*_UNAVAILABLE, aetcd.exceptions.ClientError) as exc:
            self._failover(client)
            raise EtcdUnavailableError(f"etcd watch: {exc}") from exc
        except asyncio.CancelledError:
            if _cancelled_here():
                raise
            self._failover(client)
            raise EtcdUnavailableError("etcd watch: the channel closed") from None
        finally:
            try:
                async with asyncio.timeout(self._timeout):
                    await watch.cancel()
            except Exception:
                _log.debug("cancelling an etcd watch", exc_info=True)
        # The stream ended without an error (the client was closed).
        raise EtcdUnavailableError("etcd watch ended")

    async def compact(self, revision: int) -> None:
        await self._call("compact", revision)
