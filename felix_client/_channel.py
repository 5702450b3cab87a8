"""One authenticated client stream: the asyncio adapter of a `Session`.

A `Channel` owns a transport stream and its `Session`: it writes the frames the
session builds (one writer at a time, so frames never interleave and positional
answers keep their order), runs one reader task that feeds the session and
resolves the futures its events name, and bounds acked publishes in flight by
count (the broker's publish window) and by bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from felix_transport import Connection, Stream, StreamClosedError
from felix_wire.binary import PublishAckFrame
from felix_wire.features import Capabilities
from felix_wire.messages import AckMode, Message

from ._session import (
    Answered,
    Authenticated,
    AuthRefused,
    Closed,
    Offer,
    Refused,
    Session,
    SessionEvent,
    Unsolicited,
)
from .errors import ClientTimeoutError, ConnectionLostError

__all__ = ["Channel", "TokenSource"]

logger = logging.getLogger(__name__)

TokenSource = Callable[[], Awaitable[str]]
Answer = Message | PublishAckFrame


class _Budget:
    """Acked publishes in flight on one stream, bounded by count and by bytes.

    Waiters are served first come, first served, so publishes leave in the order
    their callers asked (asyncio.Lock is FIFO too). One publish larger than the
    byte bound still goes alone: a big batch is slowed, never refused."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max(1, max_count)
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, size: int) -> bool:
        if self.count >= self.max_count:
            return False
        return self.count == 0 or self.bytes + size <= self.max_bytes

    async def acquire(self, size: int) -> None:
        if not self._waiters and self._fits(size):
            self._take(size)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(size)  # granted just as the caller gave up
            else:
                self._waiters.remove(entry)
            raise

    def _take(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        while self._waiters and self._fits(self._waiters[0][0]):
            size, future = self._waiters.popleft()
            if not future.done():
                self._take(size)
                future.set_result(None)


class Channel:
    """A client stream after its auth; create with `Channel.open`."""

    def __init__(self, stream: Stream, session: Session, label: str, max_inflight_bytes: int):
        self._stream = stream
        self._session = session
        self.label = label
        self.addr = ""  # the broker's address, set by whoever dialed it
        self._waiters: dict[int, asyncio.Future[Answer]] = {}
        self._write_lock = asyncio.Lock()
        self._auth: asyncio.Future[Authenticated] = asyncio.get_running_loop().create_future()
        self._max_inflight_bytes = max_inflight_bytes
        self._budget = _Budget(256, max_inflight_bytes)
        self._reader: asyncio.Task[None] | None = None
        self._error: Exception | None = None

    @classmethod
    async def open(
        cls,
        connection: Connection,
        *,
        tenant_id: str,
        token: TokenSource,
        offer: Offer,
        label: str,
        timeout: float,
        max_inflight_bytes: int,
        default_window: int,
    ) -> Channel:
        """Open a stream on `connection`, authenticate it and wait for the answer."""
        stream = await connection.open_bidi_stream()
        session = Session(tenant_id, offer=offer)
        channel = cls(stream, session, label, max_inflight_bytes)
        try:
            async with asyncio.timeout(timeout):
                frame = session.auth_frame(await token())
                await stream.write(frame)
                channel._reader = asyncio.get_running_loop().create_task(
                    channel._read_loop(), name=f"felix-{label}-reader"
                )
                authenticated = await asyncio.shield(channel._auth)
        except TimeoutError:
            channel.abandon()
            raise ClientTimeoutError(f"{label}: no auth answer within {timeout} s") from None
        except BaseException:
            channel.abandon()
            raise
        # The broker's window bounds acked publishes per stream (PL3); without
        # pipelining the client keeps its own bound.
        channel._budget.max_count = authenticated.publish_window or default_window
        logger.debug(
            "%s: authenticated, server flags %#06x features %#x window %s",
            label,
            authenticated.capabilities.flags,
            authenticated.capabilities.features,
            authenticated.publish_window,
        )
        return channel

    # -- state -----------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        caps = self._session.capabilities
        assert caps is not None, "a Channel exists only after auth"
        return caps

    @property
    def closed(self) -> bool:
        return self._session.closed

    @property
    def load(self) -> int:
        """Requests waiting for an answer (to pick the least busy channel)."""
        return len(self._waiters)

    # -- requests --------------------------------------------------------------------

    async def call(self, build: Callable[[int], Message], timeout: float) -> Message:
        """Send one request and wait for its answer (or its typed refusal)."""
        session = self._session
        # session.request checks the gates before it registers or builds a frame, so
        # nothing is written for a request the broker did not advertise.
        future = await self._send(functools.partial(session.request, build))
        answer = await self._wait(future, timeout)
        assert not isinstance(answer, PublishAckFrame)
        return answer

    async def publish(
        self,
        *,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        ack: AckMode,
        single: bool,
        timeout: float,
        on_sent: Callable[[], None] | None = None,
    ) -> Answer | None:
        """Send one publish; wait for its answer when acked. Acked publishes are
        pipelined: many may be in flight, answers are matched by request id.
        `on_sent` is called once the frame is written (or failed to be), before
        the answer is awaited."""
        session = self._session

        def build() -> tuple[int | None, bytes]:
            return session.publish(
                namespace=namespace,
                stream=stream,
                payloads=payloads,
                key=key,
                ack=ack,
                single=single,
            )

        if ack is AckMode.NONE:
            try:
                await self._send(build)
            finally:
                if on_sent is not None:
                    on_sent()
            return None
        size = sum(len(p) for p in payloads)
        try:
            await self._budget.acquire(size)
        except BaseException:
            if on_sent is not None:
                on_sent()
            raise
        try:
            try:
                future = await self._send(build)
            finally:
                if on_sent is not None:
                    on_sent()
            return await self._wait(future, timeout)
        finally:
            self._budget.release(size)

    async def send_idempotent(
        self,
        *,
        namespace: str,
        stream: str,
        payloads: list[bytes],
        key: bytes | None,
        producer_id: int,
        sequence: int,
    ) -> asyncio.Future[Answer]:
        """Write one idempotent batch and return the future of its answer (await it
        with `answer`). Not bounded here: the producer bounds its own batches."""
        session = self._session

        def build() -> tuple[int | None, bytes]:
            return session.publish_idempotent(
                namespace=namespace,
                stream=stream,
                payloads=payloads,
                key=key,
                producer_id=producer_id,
                sequence=sequence,
            )

        future = await self._send(build)
        assert future is not None
        return future

    async def answer(self, future: asyncio.Future[Answer], timeout: float) -> Answer:
        """Wait for the answer of a request written by `send_idempotent`."""
        return await self._wait(future, timeout)

    async def _send(
        self, build: Callable[[], tuple[int | None, bytes]]
    ) -> asyncio.Future[Answer] | None:
        """Build (registering the request) and write, under the write lock so that
        the order of registration is the order on the wire."""
        async with self._write_lock:
            if self._error is not None or self.closed:
                raise ConnectionLostError(f"{self.label}: stream is closed ({self._error})")
            request_id, frame = build()
            future: asyncio.Future[Answer] | None = None
            if request_id is not None:
                future = asyncio.get_running_loop().create_future()
                self._waiters[request_id] = future
            try:
                await self._stream.write(frame)
            except StreamClosedError as exc:
                self._unwait(future)
                self.abandon(ConnectionLostError(f"{self.label}: {exc}"))
                raise ConnectionLostError(f"{self.label}: {exc}") from exc
            except Exception as exc:
                # The transport failed underneath (a connection closing as it was
                # written to): the stream is as lost as after StreamClosedError.
                self._unwait(future)
                self.abandon(ConnectionLostError(f"{self.label}: {exc}"))
                raise ConnectionLostError(f"{self.label}: write failed: {exc}") from exc
            except asyncio.CancelledError:
                # Whether the frame left is unknown, so answers without a request id
                # could no longer be matched by position: retire the stream.
                self._unwait(future)
                self.abandon(ConnectionLostError(f"{self.label}: a write was cancelled"))
                raise
            return future

    async def _wait(self, future: asyncio.Future[Answer] | None, timeout: float) -> Answer:
        assert future is not None
        if future.done():
            return future.result()
        # One timer handle that fails the future itself, rather than an
        # asyncio.timeout scope per request (which cancels and uncancels the
        # waiting task): the same outcome, a fraction of the per-request cost.
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, future, timeout)
        try:
            # Not shielded: a cancelled wait cancels the future, which the reader
            # then skips (it only resolves futures that are not done).
            return await future
        except asyncio.CancelledError:
            self._drop(future)
            raise
        finally:
            timer.cancel()

    def _expire(self, future: asyncio.Future[Answer], timeout: float) -> None:
        """A request's timeout ran out before its answer: the caller gets
        ClientTimeoutError and a late answer is dropped as unsolicited."""
        if future.done():
            return
        future.set_exception(ClientTimeoutError(f"{self.label}: no answer within {timeout} s"))
        self._drop(future)  # after the exception is set: not cancelled

    def _unwait(self, future: asyncio.Future[Answer] | None) -> None:
        """A request whose write failed: the caller gets the write's error, so its
        answer future is cancelled rather than failed unseen."""
        if future is not None:
            self._drop(future)

    def _drop(self, future: asyncio.Future[Answer]) -> None:
        """The caller gave up: a late answer is then dropped as unsolicited."""
        for request_id, waiter in list(self._waiters.items()):
            if waiter is future:
                del self._waiters[request_id]
                self._session.forget(request_id)
        if not future.done():
            future.cancel()

    # -- reading ---------------------------------------------------------------------

    async def _read_loop(self) -> None:
        stream = self._stream
        try:
            while not self._session.closed:
                data = await stream.read()
                events = self._session.receive(data) if data else self._session.end_of_stream()
                self._handle(events)
        except StreamClosedError as exc:
            self._handle(self._session.abort(ConnectionLostError(f"{self.label}: {exc}")))
        except asyncio.CancelledError:
            self._handle(self._session.abort(ConnectionLostError(f"{self.label}: closed")))
            raise

    def _handle(self, events: list[SessionEvent]) -> None:
        for event in events:
            if isinstance(event, Answered):
                self._resolve(event.request_id, event.answer, None)
            elif isinstance(event, Refused):
                self._resolve(event.request_id, None, event.error)
            elif isinstance(event, Authenticated):
                if not self._auth.done():
                    self._auth.set_result(event)
            elif isinstance(event, AuthRefused):
                if not self._auth.done():
                    self._auth.set_exception(event.error)
            elif isinstance(event, Unsolicited):
                logger.debug("%s: dropped unsolicited %r", self.label, event.value)
            elif isinstance(event, Closed):
                self._closed(event)

    def _resolve(self, request_id: int, answer: Answer | None, error: Exception | None) -> None:
        future = self._waiters.pop(request_id, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert answer is not None
            future.set_result(answer)

    def _closed(self, event: Closed) -> None:
        error = event.error or ConnectionLostError(f"{self.label}: the broker ended the stream")
        if not isinstance(error, ConnectionLostError) and event.lost:
            logger.warning("%s: stream failed: %s", self.label, error)
        self._error = error
        if not self._auth.done():
            self._auth.set_exception(error)
            # Retrieved here: an opener that gave up (cancelled) no longer waits.
            self._auth.exception()
        lost = ConnectionLostError(f"{self.label}: stream ended before the answer ({error})")
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(lost)
        self._waiters.clear()

    # -- closing ---------------------------------------------------------------------

    def abandon(self, error: Exception | None = None) -> None:
        """Stop using the stream now: fail what is pending and reset both sides."""
        self._handle(self._session.abort(error or ConnectionLostError(f"{self.label}: closed")))
        if self._reader is not None:
            self._reader.cancel()
        # A connection closed locally a moment ago may refuse both (its QUIC core
        # is gone before the transport says so): the stream is over either way.
        with contextlib.suppress(Exception):
            self._stream.reset(0)
        with contextlib.suppress(Exception):
            self._stream.stop_sending(0)

    async def aclose(self) -> None:
        """Finish the stream after what was written; answers still pending fail."""
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._handle(self._session.abort(ConnectionLostError(f"{self.label}: closed")))
        with contextlib.suppress(StreamClosedError):
            await self._stream.finish()
        self._stream.stop_sending(0)
