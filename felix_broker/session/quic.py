"""The QUIC adapter of the session layer: connections and client streams.

Each client stream is read into its `StreamProtocol` (sans-IO); the core's
outputs are carried out here: frames written, streams ended, and each request
that passed it handed to the `DispatchTable` with its `RequestContext`.
Nothing here knows a request type.

Limits enforced here: at most `preauth_max_streams_per_conn` unauthenticated
streams are read at once per connection (more wait); a connection that
authenticates no stream within `auth_timeout_ms` is closed with code 1, and
every stream that has not authenticated within `auth_timeout_ms` of its opening
is abandoned (RESET_STREAM and STOP_SENDING), whatever its siblings did; the
connection's first authenticated stream makes the transport trust it (lifting
the pre-authentication receive bounds, see felix_transport.connection); a
stream whose request waits for a request slot or for room in its publish
answer queue is not read meanwhile, so QUIC flow control holds the client back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from felix_broker.config import BrokerConfig
from felix_broker.metrics import BrokerMetrics
from felix_broker.session.context import (
    STREAM_ABANDONED,
    ConnectionState,
    RequestContext,
    StreamIO,
)
from felix_broker.session.dispatch import DispatchTable, answer_refused
from felix_broker.session.protocol import (
    Authenticated,
    Dispatch,
    End,
    Send,
    StreamProtocol,
)
from felix_common.tokens import LEEWAY_SECONDS, Principal
from felix_transport import Connection, Stream, StreamClosedError
from felix_transport.events import ConnectionClosedError
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.messages import Auth, Extension, Unsupported

__all__ = ["CLOSE_AUTH_TIMEOUT", "CLOSE_SHUTTING_DOWN", "Session"]

_log = logging.getLogger(__name__)

CLOSE_SHUTTING_DOWN = 0
CLOSE_AUTH_TIMEOUT = 1
# While draining, how often to look whether the stacks delivered the last answers.
_DELIVERY_POLL_S = 0.005

Authenticate = Callable[[Auth], Principal]


class Session:
    """Every client connection of one broker, and the stream loop that feeds dispatch.

    `features` is called per stream: what the broker advertises can grow as
    services start. `on_close` callbacks run once per closed connection (the
    stream service ends its subscriptions there).
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        metrics: BrokerMetrics,
        table: DispatchTable,
        authenticate: Authenticate,
        server_flags: int,
        features: Callable[[], int],
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._table = table
        self._authenticate = authenticate
        self._server_flags = server_flags
        self._features = features
        self.connections: dict[Connection, ConnectionState] = {}
        self.on_close: list[Callable[[ConnectionState], None]] = []
        table.register(Extension, self._extension)

    # -- connections ----------------------------------------------------------------

    async def on_connection(self, connection: Connection) -> None:
        config = self._config
        state = ConnectionState(
            connection,
            preauth=asyncio.Semaphore(config.preauth_max_streams_per_conn),
            request_slots=asyncio.Semaphore(config.max_inflight_requests_per_conn),
            metrics=self._metrics,
        )
        self.connections[connection] = state
        self._metrics.connections.inc()
        self._metrics.connections_accepted.inc()
        if config.auth_timeout_ms > 0:
            state.spawn(self._auth_timeout(state), "auth_timeout")
        try:
            while True:
                try:
                    stream = await connection.accept_stream()
                except ConnectionClosedError:
                    break
                state.spawn(self._serve_stream(state, stream), "stream")
        finally:
            for task in list(state.tasks):
                task.cancel()
            for callback in self.on_close:
                callback(state)
            del self.connections[connection]
            self._metrics.connections.dec()

    async def _auth_timeout(self, state: ConnectionState) -> None:
        try:
            async with asyncio.timeout(self._config.auth_timeout_ms / 1000):
                await state.authenticated.wait()
        except TimeoutError:
            _log.info("closing a connection that did not authenticate in time")
            state.connection.close(CLOSE_AUTH_TIMEOUT, "authentication timeout")

    def close_all(self, code: int, reason: str) -> None:
        for state in list(self.connections.values()):
            state.connection.close(code, reason)

    async def wait_closed(self, timeout: float) -> None:
        waits = [s.connection.wait_closed() for s in self.connections.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.gather(*waits, return_exceptions=True)

    async def flush_answers(self) -> None:
        """Wait until the publish answers queued on every stream are written (each
        stream waits at most `ack_wait_timeout_ms`), then until the QUIC stack has
        delivered what was written (at most as long again): a connection closed
        sooner loses what its stack still held, since a closing stack sends nothing
        but CONNECTION_CLOSE."""
        ios = [io for state in self.connections.values() for io in state.streams]
        await asyncio.gather(*(io.flush_answers() for io in ios), return_exceptions=True)
        bound = self._config.ack_wait_timeout_ms / 1000
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                while any(io.stream.send_backlog for io in ios):
                    await asyncio.sleep(_DELIVERY_POLL_S)

    # -- streams --------------------------------------------------------------------

    def _new_protocol(self, *, publish_only: bool) -> StreamProtocol:
        config = self._config
        features = self._features()
        if config.publish_window <= 0:
            features &= ~int(
                Feature.FEATURE_PUBLISH_PIPELINE | Feature.FEATURE_STREAM_PUBLISH_WINDOW
            )
        return StreamProtocol(
            authenticate=self._authenticate,
            server_flags=self._server_flags,
            server_features=features,
            publish_window=config.publish_window,
            preauth_max_frame_bytes=config.preauth_max_frame_bytes,
            max_frame_bytes=config.max_frame_bytes,
            publish_only=publish_only,
        )

    async def _serve_stream(self, state: ConnectionState, stream: Stream) -> None:
        config = self._config
        proto = self._new_protocol(publish_only=stream.is_unidirectional)
        io = StreamIO(stream, config.publish_window, ack_wait=config.ack_wait_timeout_ms / 1000)
        ctx = RequestContext(proto, io, state)
        state.streams.add(io)
        loop = asyncio.get_running_loop()
        writer = loop.create_task(io.answer_writer())
        preauth = state.preauth
        holding = False
        expiry: asyncio.TimerHandle | None = None
        # Every stream must authenticate within auth_timeout_ms of its opening, whatever
        # its siblings did (waiting for a pre-auth slot counts).
        timeout = config.auth_timeout_ms / 1000
        auth_deadline = asyncio.timeout_at(loop.time() + timeout if timeout > 0 else None)
        try:
            async with auth_deadline:
                await preauth.acquire()
                holding = True
                while True:
                    try:
                        data = await stream.read()
                    except StreamClosedError:
                        return
                    outputs = proto.receive(data) if data else proto.end_of_stream()
                    for output in outputs:
                        if isinstance(output, Send):
                            await io.write(output.data)
                        elif isinstance(output, Authenticated):
                            auth_deadline.reschedule(None)
                            expiry = self._watch_expiry(io, proto)
                            state.authenticated.set()
                            # The connection's first authenticated stream lifts the
                            # transport's pre-authentication receive bounds.
                            state.connection.trust()
                            if holding:
                                preauth.release()
                                holding = False
                        elif isinstance(output, Dispatch):
                            if io.expired:
                                await answer_refused(
                                    ctx,
                                    output.request,
                                    ErrorCode.UNAUTHENTICATED,
                                    "the stream's token has expired",
                                )
                                await io.end(reset=False)
                                return
                            await self._table.dispatch(output.request, ctx)
                        elif isinstance(output, End):
                            await io.end(reset=output.reset)
                            return
                    if not data:
                        return
        except StreamClosedError:
            return
        except TimeoutError:
            if not auth_deadline.expired():
                self._abandon(stream, "stream")
            else:
                self._metrics.auth_timeouts.inc()
                _log.debug("ending a stream that did not authenticate in time")
                stream.reset(STREAM_ABANDONED)
                stream.stop_sending(STREAM_ABANDONED)
        except Exception:
            # A bug outside any handler (those answer `internal` themselves): the
            # client still sees a clean end of the stream rather than silence.
            self._abandon(stream, "stream")
        finally:
            state.streams.discard(io)
            if expiry is not None:
                expiry.cancel()
            if holding:
                preauth.release()
            # Let pending answers out before the writer goes (bounded by the window).
            with contextlib.suppress(Exception):
                if not stream.at_eof or io.answering:
                    await io.flush_answers()
            writer.cancel()

    def _watch_expiry(self, io: StreamIO, proto: StreamProtocol) -> asyncio.TimerHandle:
        """End the stream's authority when its token expires plus the leeway."""
        principal = proto.principal
        assert principal is not None
        remaining = principal.expires_at + LEEWAY_SECONDS - time.time()
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, remaining), self._expire, io)

    def _expire(self, io: StreamIO) -> None:
        self._metrics.token_expiries.inc()
        _log.debug("a stream's token expired: its authority ends")
        io.expire()

    def _abandon(self, stream: Stream, kind: str) -> None:
        self._metrics.internal_errors.labels(type=kind).inc()
        _log.exception("serving a stream failed; abandoning it")
        stream.reset(STREAM_ABANDONED)
        stream.stop_sending(STREAM_ABANDONED)

    # -- session-level requests -----------------------------------------------------

    async def _extension(self, request: Extension, ctx: RequestContext) -> None:
        """No extension is implemented: every one is answered like an unknown type
        (N8), naming the extension and echoing its request_id."""
        if ctx.negotiated(Feature.FEATURE_UNSUPPORTED):
            answer = Unsupported(
                request_type="extension", extension=request.name, request_id=request.request_id
            )
            await ctx.write(ctx.proto.message(answer))
        else:
            await ctx.io.end(reset=False)
