"""What a request handler is given: one `RequestContext` type for every service.

A context names the stream a request arrived on (`StreamIO`: ordered writes and
the queue of in-order publish answers), the connection it belongs to
(`ConnectionState`: its tasks, subscriptions and in-flight request bound) and
the stream's protocol core (principal, negotiated flags and features, and the
answer builders that shape every frame to what the client announced).

Bounds kept here:

- `StreamIO.answers` holds at most `publish_window` pending publish answers;
  a publish that finds it full waits, and so does the stream's reader.
- `ConnectionState.request_slots` admits at most `max_inflight_requests_per_conn`
  requests running as their own tasks (cache and group requests) per
  connection; the dispatcher takes a slot before it starts one, so at the bound
  the stream that carried the next request is not read until one finishes, and
  QUIC flow control holds the client back. A long poll holds its slot while it
  waits (at most `group_max_wait_ms`): a client that keeps more long polls open
  on one connection than the bound delays its other requests by up to that.

A task that ends with an exception (a bug: handlers answer every error they
expect) is logged once, with the request type that started it, and counted in
`felix_task_failures_total{type}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from felix_broker.metrics import BrokerMetrics
from felix_broker.session.protocol import StreamProtocol
from felix_broker.streams.budget import ByteBudget
from felix_common.tokens import Principal
from felix_transport import Connection, ConnectionClosedError, Stream, StreamClosedError

if TYPE_CHECKING:
    from felix_broker.streams.engine import Subscriber

__all__ = ["STREAM_ABANDONED", "AnswerBuilder", "ConnectionState", "RequestContext", "StreamIO"]

_log = logging.getLogger(__name__)

# Application error code on streams we abandon (RESET_STREAM / STOP_SENDING).
STREAM_ABANDONED = 1
# Settled publish answers written together in one stream write, at most.
_ANSWERS_PER_WRITE = 64

AnswerBuilder = Callable[[int | None], bytes]


class StreamIO:
    """Ordered writes on one client stream, and its queue of pending publish answers."""

    def __init__(self, stream: Stream, window: int, *, ack_wait: float) -> None:
        self.stream = stream
        self._ack_wait = ack_wait  # seconds pending answers may take to go out at the end
        self._lock = asyncio.Lock()
        # Answers to acked publishes are written in the order the stream carried the
        # publishes (PL2); at most `window` may be pending (PL3).
        self.answers: asyncio.Queue[tuple[asyncio.Future[int] | None, AnswerBuilder]]
        self.answers = asyncio.Queue(maxsize=max(1, window))
        self._unwritable = False  # the stream went: answers are dropped, not written
        # Answers owed by requests served elsewhere (their own task, or a commit that
        # answers them later): ending the stream waits for them, so a client that sends
        # a request and finishes its side still gets its answer (never unanswered).
        self.owed: set[asyncio.Future[Any]] = set()
        # Once the stream's token has expired (plus the leeway) its authority ends:
        # `expired` refuses further requests, `on_expire` ends what was opened under
        # it (subscriptions register here).
        self.expired = False
        self.on_expire: list[Callable[[], None]] = []

    def expire(self) -> None:
        """The stream's authority ends now (see `expired` and `on_expire`)."""
        if self.expired:
            return
        self.expired = True
        callbacks, self.on_expire = self.on_expire, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                _log.exception("ending what an expired token opened failed")

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await self.stream.write(data)

    async def finish(self) -> None:
        """FIN after whatever is being written."""
        async with self._lock:
            await self.stream.finish()

    def owe(self, answer: asyncio.Future[Any]) -> None:
        """`answer` settles once a request served elsewhere has answered on this stream
        (or given up: the stream went); until then the stream's end waits for it."""
        self.owed.add(answer)
        answer.add_done_callback(self.owed.discard)

    @property
    def answering(self) -> bool:
        """Answers are queued or owed on this stream."""
        return bool(self.owed) or not self.answers.empty()

    async def flush_answers(self) -> None:
        """Wait (at most `ack_wait`) until every queued publish answer is written and
        every answer owed by a request served elsewhere has gone out."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._ack_wait):
                await self.answers.join()
                me = asyncio.current_task()  # a request ending its own stream
                while others := [answer for answer in self.owed if answer is not me]:
                    await asyncio.wait(others)

    async def end(self, *, reset: bool) -> None:
        """End the stream after its pending answers: `reset` abandons it (RESET_STREAM
        and STOP_SENDING), otherwise FIN and STOP_SENDING(0)."""
        await self.flush_answers()
        stream = self.stream
        if reset:
            stream.reset(STREAM_ABANDONED)
            stream.stop_sending(STREAM_ABANDONED)
            return
        with contextlib.suppress(StreamClosedError):
            if stream.writable:
                await self.finish()
        stream.stop_sending(0)

    async def answer_writer(self) -> None:
        """Write each queued publish answer once its publish is settled, in order.

        Answers already settled go out together, in one write (at most
        `_ANSWERS_PER_WRITE`): 32 publishes in flight settled by one worker pass
        cost one stream write, not 32. What is ready is written before waiting for
        a publish that is not settled yet, so no answer waits for a later one."""
        answers = self.answers
        while True:
            item = await answers.get()
            ready: list[bytes] = []
            while True:
                future, build = item
                if future is not None and not future.done() and ready:
                    await self._write_answers(ready)
                    ready = []
                result: int | None = None
                if future is not None:
                    with contextlib.suppress(Exception):
                        result = await future
                ready.append(build(result))
                if answers.empty() or len(ready) >= _ANSWERS_PER_WRITE:
                    break
                item = answers.get_nowait()
            await self._write_answers(ready)

    async def _write_answers(self, ready: list[bytes]) -> None:
        """Write settled answers; once the stream or its connection is gone (a client
        that closed before reading them) the rest are dropped as they settle, so the
        writer never dies with an error nobody retrieves and nothing waits on them."""
        try:
            if not self._unwritable:
                await self.write(ready[0] if len(ready) == 1 else b"".join(ready))
        except (StreamClosedError, ConnectionClosedError):
            self._unwritable = True
        finally:
            for _ in ready:
                self.answers.task_done()


@dataclass
class ConnectionState:
    """What one client connection holds: its tasks, subscriptions and request bound."""

    connection: Connection
    preauth: asyncio.Semaphore
    request_slots: asyncio.Semaphore
    metrics: BrokerMetrics
    authenticated: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    streams: set[StreamIO] = field(default_factory=set)
    subscriptions: dict[Subscriber, str] = field(default_factory=dict)  # -> identity
    # Publish bytes in flight on this connection: per identity, and "" for all of them
    # (streams/budget.py).
    publish_bytes: dict[str, ByteBudget] = field(default_factory=dict)

    def spawn(self, coro: Coroutine[Any, Any, None], kind: str) -> asyncio.Task[None]:
        """Run `coro` until it ends or the connection goes; `kind` names it in logs."""
        task = asyncio.get_running_loop().create_task(coro, name=kind)
        self.tasks.add(task)
        task.add_done_callback(lambda done: self._finished(done, kind))
        return task

    async def spawn_request(self, coro: Coroutine[Any, Any, None], kind: str, io: StreamIO) -> None:
        """Run a request as its own task once a request slot is free (waits at the
        bound); the request's stream `io` does not end before the task has answered."""
        try:
            await self.request_slots.acquire()
        except BaseException:
            coro.close()
            raise
        task = self.spawn(coro, kind)
        task.add_done_callback(lambda _t: self.request_slots.release())
        io.owe(task)

    def _finished(self, task: asyncio.Task[None], kind: str) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.metrics.task_failures.labels(type=kind).inc()
            _log.error("%s task failed", kind, exc_info=exc)

    def identity_count(self, identity: str) -> int:
        return sum(1 for owner in self.subscriptions.values() if owner == identity)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request's view of its stream and connection, shared by every service."""

    proto: StreamProtocol
    io: StreamIO
    connection: ConnectionState

    @property
    def principal(self) -> Principal:
        principal = self.proto.principal
        assert principal is not None, "requests are dispatched only after auth"
        return principal

    @property
    def token(self) -> str:
        """The bearer token the stream authenticated with."""
        token = self.proto.token
        assert token is not None, "requests are dispatched only after auth"
        return token

    def negotiated(self, feature: int) -> bool:
        """Both sides announced `feature`."""
        return self.proto.negotiated(feature)

    def serves(self, feature: int) -> bool:
        """This broker advertised `feature` on the request's stream."""
        return bool(self.proto.server_features & feature)

    async def write(self, data: bytes) -> None:
        """Write an answer on the request's stream (after anything being written)."""
        await self.io.write(data)

    async def answer_in_order(
        self, settled: asyncio.Future[int] | None, build: AnswerBuilder
    ) -> None:
        """Queue a publish answer: written after every earlier one on this stream, once
        `settled` resolves (its result, or None on failure, goes to `build`)."""
        await self.io.answers.put((settled, build))

    def spawn(self, coro: Coroutine[Any, Any, None], kind: str) -> None:
        """A task that lives as long as the connection (an event stream's writer)."""
        self.connection.spawn(coro, kind)

    def open_uni_stream(self) -> Awaitable[Stream]:
        """A broker-opened unidirectional stream (subscriptions and watches)."""
        return self.connection.connection.open_uni_stream()
