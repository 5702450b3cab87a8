"""One dispatch table from request type to handler, shared by every service.

Each capability service registers its handlers at start (`register` methods in
streams/, cache/, groups/, discovery/); the session hands every request that
passed the protocol core to `DispatchTable.dispatch`, which looks the request's
exact type up (generated message classes, and the binary `PublishBatchFrame`)
and runs its handler with the request's `RequestContext`.

Two ways to run a handler:

- inline (the default): awaited by the stream's reader, so requests on one
  stream run in the order they came (publishes and their answers, PL2);
- concurrent: run as its own task under the connection's request bound
  (`ConnectionState.spawn_request`), so one slow request (a long poll, a write
  waiting for fsync) holds back nothing else; answers then go out in
  completion order, matched by request_id.

A concurrent type may also register `ready`: a plain function that builds the
answer at once when it needs no wait (a cache get from memory) and returns None
when it would wait. While a request slot is free, the dispatcher tries it
first and writes its answer from the reader, with no task (a task per request
was a large share of a cache request's cost); at the bound it takes the
concurrent path as before, so the bound still holds the reader back. The
answer is then simply the first to complete, which is what completion order
allows. `ready` may also return a `ReadyAnswer`: its `frame` with an `unsent`
callback run if the frame could not be written (a group poll hands its claims
back), or no frame at all: the service took the request and answers it itself
shortly, without a task of the request's own (a group ack, answered by the loop
pass's group-log commit once the ack is durable). A service that answers later
bounds what it holds itself and observes `felix_request_seconds` for it.

A handler that raises what it did not expect (a bug) still answers: `internal`,
naming the request_id, logged once and counted in
`felix_request_internal_errors_total{type}` (`answer_refused`).

A known client request type with no handler is answered as not served:
`unsupported` to a client that negotiated FEATURE_UNSUPPORTED, otherwise an
`invalid_request` error. Which types are deliberately never served, and why,
is `NOT_SERVED`; tests check that the two together cover the catalogue.
A table built with `withheld` features (the broker's `withhold_*` knobs) takes
no handler for a type the catalogue gates on one of them: such requests are
answered as not served too, whoever registers a handler.

The serve / forward / redirect seam. Every request passes `Placement.place`
before its handler runs: the one place where, per request, a broker decides
whether it serves the request here, forwards it to the shard's owner, or
redirects the client. A standalone broker owns every shard, so its placement
(`STANDALONE`) always answers `SERVE_HERE`; a fleet member's placement
(felix_broker/fleet/placement.py) also answers `FORWARD` (the owner serves it
and this broker relays the owner's answer), `REDIRECT` (the client is told who
leads: `not_leader`, or its error and refusal forms) and `UNAVAILABLE` (no
broker serves the shard now: `shard_unavailable` with its reason), and
answers those itself (`Placement.elsewhere`). A request whose decision is not
`SERVE_HERE` never reaches this broker's handler.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from felix_broker.metrics import BrokerMetrics
from felix_broker.session.context import RequestContext
from felix_transport import ConnectionClosedError, StreamClosedError
from felix_wire.binary import PublishBatchFrame
from felix_wire.errors import ErrorCode
from felix_wire.features import Feature
from felix_wire.gating import MESSAGE_GATES
from felix_wire.messages import Message, Publish, PublishBatch, Unsupported

__all__ = [
    "NOT_SERVED",
    "STANDALONE",
    "DispatchTable",
    "Handler",
    "Placement",
    "PlacementDecision",
    "ReadyAnswer",
    "Request",
    "Standalone",
    "answer_refused",
    "not_served_answer",
    "type_name",
]

_log = logging.getLogger(__name__)

Request = Message | PublishBatchFrame
R = TypeVar("R", bound=Request)
Handler = Callable[[R, RequestContext], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class ReadyAnswer:
    """What a `ready` function returns beyond a bare frame (see the module docs)."""

    frame: bytes | None
    """The answer to write now; None: the service answers the request itself, later."""
    unsent: Callable[[], None] | None = None
    """Run when `frame` could not be written (the stream or connection went)."""


# The answer when it is ready without waiting, else None (then the handler runs).
Ready = Callable[[R, RequestContext], "bytes | ReadyAnswer | None"]

# Client-to-broker message types this broker never dispatches, and why. A type in
# the catalogue that is neither handled nor listed here fails the completeness test.
NOT_SERVED: Mapping[str, str] = {
    "auth": "consumed by the session protocol itself (session/protocol.py), never dispatched",
    "topology": "cluster only: a standalone broker has no topology (FEATURE_TOPOLOGY)",
}


def type_name(kind: type[Any]) -> str:
    """The wire name of a request type (the binary publish frame is `publish_batch_frame`)."""
    if kind is PublishBatchFrame:
        return "publish_batch_frame"
    return str(kind.__struct_config__.tag)


class PlacementDecision(enum.Enum):
    """What a broker does with one request (see the module docs)."""

    SERVE_HERE = "serve_here"
    FORWARD = "forward"  # served by the shard's owner; its answer is relayed
    REDIRECT = "redirect"  # the client is sent to the shard's owner
    UNAVAILABLE = "unavailable"  # no broker serves the shard now


class Placement(Protocol):
    """Decides, per request, where it is served, and answers what is not served here."""

    def place(self, request: Request, ctx: RequestContext) -> PlacementDecision: ...

    async def elsewhere(
        self, decision: PlacementDecision, request: Request, ctx: RequestContext
    ) -> None:
        """Answer a request `place` did not keep here (forward, redirect, refuse)."""
        ...


class Standalone:
    """A standalone broker owns every shard it knows: everything is served here."""

    def place(self, request: Request, ctx: RequestContext) -> PlacementDecision:
        return PlacementDecision.SERVE_HERE

    async def elsewhere(
        self, decision: PlacementDecision, request: Request, ctx: RequestContext
    ) -> None:
        raise AssertionError(f"a standalone broker serves everything here, not {decision}")


STANDALONE = Standalone()


class _Timer(Protocol):
    def observe(self, amount: float) -> None: ...


class _Untimed:
    def observe(self, amount: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class _Route:
    handler: Callable[[Any, RequestContext], Coroutine[Any, Any, None]]
    concurrent: bool
    name: str
    timer: _Timer
    ready: Callable[[Any, RequestContext], bytes | ReadyAnswer | None] | None = None


class DispatchTable:
    """Request type -> handler. Registering a type twice is a programming error.

    With `metrics`, each handled request's time from dispatch to the end of its
    handler (its answer written, or queued in order for a publish) is observed in
    `felix_request_seconds{type}`; the label child is taken once, at register. Every
    request answered as not served is counted in `felix_request_not_served_total{type}`."""

    def __init__(
        self,
        placement: Placement = STANDALONE,
        *,
        metrics: BrokerMetrics | None = None,
        withheld: int = 0,
        handler_fault: Callable[[], bool] | None = None,
    ) -> None:
        # Keyed by the request's exact class (generated classes are never subclassed).
        self._routes: dict[type[Any], _Route] = {}
        self._placement = placement
        self._metrics = metrics
        self._withheld = withheld
        self._withheld_names: dict[type[Any], str] = {}
        # Test mode only (the fault file's handler_fault): while it says so, every
        # handler fails as a bug would, so that the catch-all's answer can be checked.
        self._handler_fault = handler_fault

    def register(
        self,
        kind: type[R],
        handler: Handler[R],
        *,
        concurrent: bool = False,
        ready: Ready[R] | None = None,
    ) -> None:
        """`ready` (concurrent types only): see the module docs; it must answer
        exactly as `handler` would when it returns a frame."""
        if ready is not None and not concurrent:
            raise ValueError("ready is for concurrent handlers (inline ones need no task)")
        name = type_name(kind)
        if kind in self._routes or kind in self._withheld_names:
            raise ValueError(f"{name} already has a handler")
        gate = MESSAGE_GATES.get(name)
        if gate is not None and gate.features & self._withheld:
            withheld = Feature(gate.features & self._withheld).name
            self._withheld_names[kind] = f"{name} is not served here: {withheld} is withheld"
            return
        metrics = self._metrics
        timer: _Timer = _Untimed() if metrics is None else metrics.request_timer(name)
        self._routes[kind] = _Route(handler, concurrent, name, timer, ready)

    def wrap(self, kind: type[R], wrapper: Callable[[Handler[R]], Handler[R]]) -> None:
        """Replace `kind`'s handler with `wrapper(handler)` (a gate in front of it: the
        fleet's feature switches). A type without a handler is left alone."""
        route = self._routes.get(kind)
        if route is not None:
            # The gate runs in front of the handler only, so the ready path is
            # dropped: every request of a wrapped type goes through the gate.
            self._routes[kind] = _Route(
                wrapper(route.handler), route.concurrent, route.name, route.timer
            )

    def handler_for(self, kind: type[R]) -> Handler[R] | None:
        """The handler registered for `kind` (an owner runs forwarded requests with it)."""
        route = self._routes.get(kind)
        return None if route is None else route.handler

    def handled(self) -> frozenset[str]:
        """The wire names of every type with a handler."""
        return frozenset(route.name for route in self._routes.values())

    async def dispatch(self, request: Request, ctx: RequestContext) -> None:
        route = self._routes.get(type(request))
        if route is None:
            assert not isinstance(request, PublishBatchFrame)  # always has a route
            if self._metrics is not None:
                self._metrics.requests_not_served.labels(type=type_name(type(request))).inc()
            reason = self._withheld_names.get(type(request))
            await ctx.write(not_served_answer(ctx, request, reason))
            return
        decision = self._placement.place(request, ctx)
        if decision is not PlacementDecision.SERVE_HERE:
            await self._placement.elsewhere(decision, request, ctx)
            return
        started = time.perf_counter()
        if (
            route.ready is not None
            and not self._faulted()
            and not ctx.connection.request_slots.locked()
            and await self._answer_ready(route, request, ctx, started)
        ):
            return
        if route.concurrent:
            timed = _timed(self._run(route, request, ctx), route.timer, started)
            await ctx.connection.spawn_request(timed, route.name, ctx.io)
        else:
            try:
                await self._run(route, request, ctx)
            finally:
                route.timer.observe(time.perf_counter() - started)

    def _faulted(self) -> bool:
        return self._handler_fault is not None and self._handler_fault()

    async def _answer_ready(
        self, route: _Route, request: Request, ctx: RequestContext, started: float
    ) -> bool:
        """Answer from `route.ready` if it has the answer now; False: run the handler.
        A bug in it is answered `internal`, as in `_run`. The request's time is
        observed here, unless the service answers it later (then it does)."""
        assert route.ready is not None
        try:
            answer = route.ready(request, ctx)
        except Exception as exc:
            ctx.connection.metrics.internal_errors.labels(type=route.name).inc()
            _log.error("%s request failed", route.name, exc_info=exc)
            with contextlib.suppress(StreamClosedError, ConnectionClosedError):
                await answer_refused(ctx, request, ErrorCode.INTERNAL, "internal error")
            route.timer.observe(time.perf_counter() - started)
            return True
        if answer is None:
            return False
        unsent: Callable[[], None] | None = None
        frame: bytes
        if isinstance(answer, ReadyAnswer):
            if answer.frame is None:
                return True  # the service answers it (and times it) itself
            frame, unsent = answer.frame, answer.unsent
        else:
            frame = answer
        try:
            await ctx.write(frame)
        except (StreamClosedError, ConnectionClosedError):
            # The client went: nobody is left to answer; what the answer handed out
            # goes back.
            if unsent is not None:
                unsent()
        route.timer.observe(time.perf_counter() - started)
        return True

    async def _run(self, route: _Route, request: Request, ctx: RequestContext) -> None:
        """The handler, with every unexpected exception answered `internal`.

        Handlers answer every error they expect; anything else is a bug, and the
        client still gets an answer (`internal`, naming the request_id), the
        exception is logged once and counted in felix_request_internal_errors_total.
        The stream or connection going away is not an error: there is nobody left
        to answer (an inline handler's caller ends the stream).
        """
        try:
            if self._faulted():
                raise HandlerFaultError(f"{route.name} failed by the test fault handler_fault")
            await route.handler(request, ctx)
        except (StreamClosedError, ConnectionClosedError):
            if not route.concurrent:
                raise
        except Exception as exc:
            ctx.connection.metrics.internal_errors.labels(type=route.name).inc()
            _log.error("%s request failed", route.name, exc_info=exc)
            with contextlib.suppress(StreamClosedError, ConnectionClosedError):
                await answer_refused(ctx, request, ErrorCode.INTERNAL, "internal error")


class HandlerFaultError(RuntimeError):
    """A handler failed on purpose (the test fault handler_fault)."""


async def _timed(handling: Coroutine[Any, Any, None], timer: _Timer, started: float) -> None:
    try:
        await handling
    finally:
        timer.observe(time.perf_counter() - started)


async def answer_refused(ctx: RequestContext, request: Request, code: ErrorCode, text: str) -> None:
    """Refuse a request with `code` whatever its type (an unexpected failure:
    `internal`; an expired token: `unauthenticated`).

    An acked publish gets its publish answer (in order with the stream's other
    publish answers); an unacked one is owed nothing. Any other request gets an
    `error` naming its request_id in the message.
    """
    proto = ctx.proto
    request_id = getattr(request, "request_id", None)
    about = f"{text} (request_id {request_id})" if request_id is not None else text
    if isinstance(request, PublishBatchFrame | Publish | PublishBatch):
        if request_id is None or proto.publish_only:
            return
        binary = isinstance(request, PublishBatchFrame)
        answer = proto.publish_answer(request_id, binary=binary, error=(code, about))
        await ctx.answer_in_order(None, lambda _r: answer)
        return
    await ctx.write(proto.error(code, about))


def not_served_answer(ctx: RequestContext, request: Message, reason: str | None = None) -> bytes:
    """A known request this broker does not serve (its feature is not advertised)."""
    request_type = str(type(request).__struct_config__.tag)
    proto = ctx.proto
    if proto.negotiated(Feature.FEATURE_UNSUPPORTED):
        request_id = getattr(request, "request_id", None)
        return proto.message(Unsupported(request_type=request_type, request_id=request_id))
    text = reason or f"{request_type} is not served by this broker"
    return proto.error(ErrorCode.INVALID_REQUEST, text)
