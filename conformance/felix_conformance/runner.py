"""Playing a case's client side against a target, and reaching a verdict.

Before a case runs, its needs are checked against what the target advertised
(anything missing: "unsupported") and against the target's setup, the profile's
streams, caches and tokens (anything missing: "setup", never a fail). Then
its steps run in order within the case timeout; the first step whose
expectation is not met fails the case with the expected and actual values and
the wire log. A target that answers `unsupported` where the case expected
something else has told us it does not serve that request: "unsupported" too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import msgspec

from felix_transport import Connection, ConnectionClosedError, StreamClosedError
from felix_wire.catalogue import FEATURES
from felix_wire.frame import FrameReader
from felix_wire.wire_errors import FrameError

from .frames import build_frame, decode_received, encoding_problems, match_frame
from .matching import MissingVariableError, match, substitute
from .model import CONTROL_URL, Case, Level, Step
from .routing import route_to_owner
from .schema import TranscriptError
from .session import Session
from .target import Advertised, Target, TargetUnreachableError
from .verdicts import CaseResult, RunReport, Verdict
from .wirelog import WireLog

__all__ = ["Unmet", "missing_needs", "run_case", "run_cases"]

_log = logging.getLogger(__name__)


class StepFailedError(Exception):
    def __init__(self, step: Step, problem: str, expected: str = "", actual: str = "") -> None:
        super().__init__(problem)
        self.step = step
        self.expected = expected
        self.actual = actual


class FleetSetupError(Exception):
    """The case needs a broker of the fleet the profile does not name."""


class FaultSetupError(Exception):
    """The target's control endpoint cannot produce the fault the case asks for."""


class TargetUnsupportedError(Exception):
    """The target answered `unsupported` to a request the case needs."""


@dataclass(frozen=True)
class Unmet:
    """Why a case cannot run against this target: the verdict it gets, and the reason."""

    verdict: Verdict  # UNSUPPORTED (not advertised) or SETUP (the profile lacks it)
    reason: str


def missing_needs(case: Case, target: Target, advertised: Advertised) -> Unmet | None:
    """Why the case cannot run against this target, or None.

    A fleet smaller than the case needs (`setup.brokers`) is "setup", before
    anything else: a single broker advertises no cluster features, and saying
    "unsupported" would blame it for a fleet it is not. Not advertising a
    feature or flag the case needs is "unsupported"; a target
    variable the case uses (declared under `setup` or named as `${name}` in a
    step) that the profile does not define is "setup".
    """
    fleet = target.fleet
    if case.min_brokers > len(fleet):
        return Unmet(
            Verdict.SETUP,
            f"the case needs a fleet of {case.min_brokers} brokers; the target's has "
            f"{len(fleet)} (name every broker under `brokers` in --profile, or use the "
            "--fixture of a `felix-broker fixture --brokers N`)",
        )
    missing = [
        name
        for name in case.required_features
        if FEATURES[name].value is None
        or advertised.features & (FEATURES[name].value or 0) != FEATURES[name].value
    ]
    if missing:
        return Unmet(Verdict.UNSUPPORTED, "target did not advertise " + ", ".join(missing))
    if case.required_flags & ~advertised.flags:
        return Unmet(
            Verdict.UNSUPPORTED,
            f"target did not advertise flags {case.required_flags & ~advertised.flags:#06x}",
        )
    needed = dict.fromkeys((*case.setup_vars, *case.variables))
    absent = [name for name in needed if name not in target.variables]
    if absent:
        why = [target.unavailable.get(name, "not in the profile") for name in absent]
        return Unmet(
            Verdict.SETUP,
            "target setup lacks "
            + ", ".join(f"{name} ({reason})" for name, reason in zip(absent, why, strict=True))
            + "; name it in --profile or --set NAME=VALUE",
        )
    return None


class _CaseRun:
    def __init__(self, case: Case, target: Target, log: WireLog) -> None:
        self.case = case
        self.variables: dict[str, Any] = dict(target.variables)
        self.session = Session(
            target.connect,
            log,
            lambda address, alpn: target.connect(address, alpn, keepalive=True),
        )
        self.fleet = target.fleet
        self.log = log

    async def run(self) -> None:
        for step in self.case.steps:
            await self.step(step)

    async def step(self, step: Step) -> None:
        action = step.action
        if action == "open":
            address = self._broker(step)
            await self.session.open(step.conn, self._name(step), step.direction, address)
        elif action == "accept":
            try:
                await self.session.accept(step.conn, self._name(step), step.timeout)
            except TimeoutError:
                raise StepFailedError(
                    step, f"the target opened no stream within {step.timeout:g}s"
                ) from None
        elif action == "send":
            await self._send(step)
        elif action == "expect":
            await self._expect(step)
        elif action in ("expect_end", "expect_reset"):
            await self._expect_stream_state(step)
        elif action == "expect_close":
            await self._expect_close(step)
        elif action == "expect_silence":
            event = await self.session.streams[self._name(step)].next_event(step.seconds)
            if event.kind != "timeout":
                raise StepFailedError(step, "expected nothing", "silence", event.describe())
        elif action == "wait":
            await asyncio.sleep(step.seconds)
        elif action == "finish":
            await self.session.streams[self._name(step)].stream.finish()
            self.log.sent(self._name(step), "[FIN]")
        elif action == "stop_sending":
            self.session.streams[self._name(step)].stream.stop_sending(step.code or 0)
            self.log.sent(self._name(step), f"[STOP_SENDING {step.code or 0}]")
        elif action == "reset":
            self.session.streams[self._name(step)].stream.reset(step.code or 0)
            self.log.sent(self._name(step), f"[RESET_STREAM {step.code or 0}]")
        elif action == "close":
            connection = await self.session.connection(step.conn)
            connection.close(step.code or 0)
            self.log.sent(step.conn, f"[CONNECTION_CLOSE {step.code or 0}]")
        elif action == "control":
            await self._control(step)
        elif action == "handshake":
            await self._handshake(step)

    async def _handshake(self, step: Step) -> None:
        """Make connection `step.conn` offering the step's ALPN ids and hold the
        broker to accepting (and selecting `step.selected`) or refusing it. With
        `repeat: N`, N connections (`conn.0` ...) made one after another and held:
        `accepted` needs every one accepted, `refused` one refused (a connection
        cap), after which the held ones are closed and waited out so the broker's
        count is back down before the next case."""
        address = self._broker(step)
        offered = ", ".join(step.alpn) or "no ALPN"
        names = (
            [step.conn] if step.repeat == 1 else [f"{step.conn}.{i}" for i in range(step.repeat)]
        )
        held: list[Connection] = []
        try:
            for name in names:
                try:
                    connection = await self.session.handshake(name, address, step.alpn)
                except TargetUnreachableError as exc:
                    if step.accepted:
                        raise StepFailedError(
                            step,
                            f"handshake of {name} offering {offered} failed: {exc}",
                            "accepted",
                            "refused",
                        ) from None
                    self.log.note(name, f"handshake refused as expected, {len(held)} held: {exc}")
                    return
                held.append(connection)
                selected = connection.alpn_protocol or ""
                if step.accepted and step.selected is not None and selected != step.selected:
                    raise StepFailedError(
                        step,
                        f"the broker selected ALPN {selected or 'none'}",
                        step.selected or "none",
                        selected or "none",
                    )
            if not step.accepted:
                raise StepFailedError(
                    step,
                    f"the broker completed {len(held)} handshake(s) offering {offered}, "
                    "refusing none",
                    "refused",
                    "accepted",
                )
        finally:
            if not step.accepted and step.repeat > 1:
                await self._let_go(held, step.timeout)

    async def _let_go(self, connections: list[Connection], timeout: float) -> None:
        """Close `connections` and wait (at most `timeout`) until each is gone."""
        for connection in connections:
            connection.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for connection in connections:
                    await connection.wait_closed()

    async def _control(self, step: Step) -> None:
        """POST a fault to the target's control endpoint and match its JSON answer.

        409 (the endpoint cannot produce this fault) or an endpoint that cannot be
        reached is the target's setup; any other refusal fails the case, naming it."""
        assert step.path is not None
        url = str(self.variables[CONTROL_URL]).rstrip("/") + step.path
        self.log.sent("control", f"POST {step.path}")
        status, answer = await post_control(url, step.timeout)
        self.log.received("control", f"{status} {_spec_text(answer)}")
        if status == 409:
            raise FaultSetupError(f"the control endpoint cannot produce {step.path}: {answer}")
        if status != 200:
            raise StepFailedError(
                step,
                f"the control endpoint could not apply {step.path}",
                "200",
                f"{status} {answer}",
            )
        if step.answer is not None:
            problems = match(
                substitute(step.answer, self.variables, unknown_as_capture=True),
                answer,
                "answer",
                self.variables,
            )
            if problems:
                raise StepFailedError(
                    step, "; ".join(problems), _spec_text(step.answer), _spec_text(answer)
                )

    async def heal(self) -> str | None:
        """After a case that asked for faults: POST /heal (ends every fault the
        endpoint made); why it failed, or None."""
        url = str(self.variables[CONTROL_URL]).rstrip("/") + "/heal"
        self.log.sent("control", "POST /heal")
        try:
            status, answer = await post_control(url, HEAL_TIMEOUT)
        except FaultSetupError as exc:
            return str(exc)
        self.log.received("control", f"{status} {_spec_text(answer)}")
        return None if status == 200 else f"POST /heal answered {status} {answer}"

    def _broker(self, step: Step) -> str | None:
        """The fleet broker an `open` names (HOST:PORT), None for the target.

        `{other_than: A}` is the first broker of the fleet whose address is not A
        (text equality: the profile's `brokers` must spell addresses the way the
        brokers report them). A fleet with no other broker is the target's setup."""
        if step.broker is None:
            return None
        if isinstance(step.broker, str):
            chosen = substitute(step.broker, self.variables)
            if not isinstance(chosen, str):
                raise StepFailedError(step, f"broker {chosen!r} is not HOST:PORT text")
            return chosen
        avoid = substitute(step.broker["other_than"], self.variables)
        for address in self.fleet:
            if address != avoid:
                return address
        raise FleetSetupError(f"{step.describe()}: no broker of the fleet other than {avoid}")

    @staticmethod
    def _name(step: Step) -> str:
        assert step.stream is not None  # the schema requires it for stream steps
        return step.stream

    async def _send(self, step: Step) -> None:
        io = self.session.streams[self._name(step)]
        (spec,) = step.frames
        data = build_frame(spec, self.variables)
        try:
            # The log shows what really left, decoded the way a receiver would.
            frames = FrameReader().feed(data)
        except FrameError:
            frames = []
        if spec.kind == "raw" or len(frames) != 1:
            text = data.hex()
        else:
            text = decode_received(frames[0].flags, frames[0].payload).describe()
        if step.repeat > 1:
            data, text = data * step.repeat, f"{step.repeat} x {text}"
        try:
            await io.write(data, text, fin=step.fin)
        except StreamClosedError as exc:
            raise StepFailedError(step, f"could not send: {exc}") from None

    async def _expect(self, step: Step) -> None:
        """The next frame must match one of the step's alternatives; with `skip`,
        up to that many frames matching none come first and are passed over."""
        io = self.session.streams[self._name(step)]
        expected = " | ".join(_spec_text(s.body) for s in step.frames)
        for skipped in range(step.skip + 1):
            event = await io.next_event(step.timeout)
            if event.frame is None:
                passed = f" (after passing over {skipped} frames)" if skipped else ""
                raise StepFailedError(
                    step, f"expected a frame, got {event.kind}{passed}", expected, event.describe()
                )
            problems: list[str] = []
            for spec in step.frames:
                found = match_frame(spec, event.frame, self.variables, self.variables)
                if not found and step.compact:
                    encoding = encoding_problems(event.frame)
                    if encoding:
                        raise StepFailedError(
                            step,
                            "; ".join(encoding),
                            "compact JSON, type first, catalogue order",
                            event.frame.payload[:400].decode(errors="replace"),
                        )
                if not found:
                    return
                problems += found
            if event.frame.name == "unsupported":
                break
        frame = event.frame
        assert frame is not None  # every iteration above returned, raised or had a frame
        if frame.name == "unsupported" and not any(
            s.type_name == "unsupported" for s in step.frames
        ):
            raise TargetUnsupportedError(
                f"target answered unsupported to {frame.fields.get('request_type')!r}"
            )
        raise StepFailedError(step, "; ".join(problems), expected, frame.describe())

    async def _expect_stream_state(self, step: Step) -> None:
        io = self.session.streams[self._name(step)]
        event = await io.next_event(step.timeout)
        want = "end" if step.action == "expect_end" else "reset"
        expected = want if step.code is None else f"{want} code {step.code}"
        if event.kind != want:
            raise StepFailedError(step, f"expected stream {want}", expected, event.describe())
        if step.code is not None and event.code != step.code:
            raise StepFailedError(step, "wrong reset code", expected, event.describe())

    async def _expect_close(self, step: Step) -> None:
        connection = await self.session.connection(step.conn)
        try:
            async with asyncio.timeout(step.timeout):
                await connection.wait_closed()
        except TimeoutError:
            raise StepFailedError(
                step, "connection still open", "connection close", "open"
            ) from None
        code = connection.termination.error_code if connection.termination else None
        self.log.received(step.conn, f"[CONNECTION_CLOSE {code}]")
        if step.code is not None and code != step.code:
            raise StepFailedError(step, "wrong close code", f"code {step.code}", f"code {code}")


HEAL_TIMEOUT = 10.0


async def post_control(url: str, timeout: float) -> tuple[int, Any]:
    """POST {} to a control endpoint route: its status and JSON answer (text when
    the answer is not JSON). Unreachable, or no answer in time: FaultSetupError."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
            http.post(url, json={}) as response,
        ):
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise FaultSetupError(f"the control endpoint {url} cannot be reached: {exc!r}") from None
    try:
        answer: Any = msgspec.json.decode(text)
    except msgspec.DecodeError:
        answer = text.strip()
    return response.status, answer


def _spec_text(body: Any) -> str:
    text = msgspec.json.encode(body).decode()
    return text if len(text) <= 400 else text[:397] + "..."


async def run_case(case: Case, target: Target, advertised: Advertised) -> CaseResult:
    started = time.monotonic()
    unmet = missing_needs(case, target, advertised)
    if unmet is not None:
        return CaseResult(case, unmet.verdict, unmet.reason)
    log = WireLog()
    # Against a fleet, the case goes where a client that looked up the owner would.
    run = _CaseRun(case, await route_to_owner(case, target, advertised, log), log)
    result: CaseResult
    try:
        async with asyncio.timeout(case.timeout):
            await run.run()
        result = CaseResult(case, Verdict.PASS)
    except StepFailedError as exc:
        result = CaseResult(
            case,
            Verdict.FAIL,
            str(exc),
            step=exc.step.describe(),
            expected=exc.expected or None,
            actual=exc.actual or None,
        )
    except TargetUnsupportedError as exc:
        result = CaseResult(case, Verdict.UNSUPPORTED, str(exc))
    except TimeoutError:
        result = CaseResult(case, Verdict.FAIL, f"case did not finish within {case.timeout:g}s")
    except (FleetSetupError, FaultSetupError) as exc:
        result = CaseResult(case, Verdict.SETUP, str(exc))
    except MissingVariableError as exc:
        # A capture an earlier step should have made, or a variable only known at
        # run time: the case could not be played, which says nothing of the target.
        result = CaseResult(case, Verdict.SETUP, f"cannot play the case: {exc}")
    except TranscriptError as exc:
        result = CaseResult(case, Verdict.FAIL, f"transcript problem: {exc}")
    except (ConnectionClosedError, StreamClosedError, TargetUnreachableError) as exc:
        result = CaseResult(case, Verdict.FAIL, f"connection failed: {exc}")
    finally:
        run.session.close()
    if case.faults:  # whatever the verdict, leave no fault behind for the next case
        unhealed = await run.heal()
        if unhealed is not None and result.verdict is Verdict.PASS:
            result = CaseResult(case, Verdict.FAIL, f"the fault could not be healed: {unhealed}")
    if case.level is Level.INFO and result.verdict in (Verdict.PASS, Verdict.FAIL):
        observed = "behaved as described" if result.verdict is Verdict.PASS else result.detail
        result = CaseResult(case, Verdict.INFORMATIONAL, f"observed: {observed}")
    return replace(result, duration=time.monotonic() - started, wire_log=log.text())


async def run_cases(
    cases: Sequence[Case],
    target: Target,
    advertised: Advertised,
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> RunReport:
    """Every case in order; `on_result` hears of each result as it is reached."""
    report = RunReport(target.address, advertised.flags, advertised.features)
    for case in cases:
        result = await run_case(case, target, advertised)
        _log.info("%s: %s %s", case.id, result.verdict.value, result.detail)
        report.results.append(result)
        if on_result is not None:
            on_result(result)
    return report
