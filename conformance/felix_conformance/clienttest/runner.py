"""Running client cases: per case a fresh scripted broker and a fresh adapter
process; the result goes into the same `RunReport` the broker kit reports."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from felix_transport import generate_ca

from ..model import Case, Level
from ..verdicts import CaseResult, RunReport, Verdict
from .adapter import Adapter, AdapterError
from .broker import ScriptedBroker
from .cases import CLIENT_CASES, NAMESPACE, TENANT, TOKEN, ClientCase, ClientUnsupportedError
from .link import SilentLink

__all__ = ["as_case", "run_client_case", "run_client_cases", "select_client_cases"]

_log = logging.getLogger(__name__)
CASE_TIMEOUT = 60.0


def as_case(case: ClientCase) -> Case:
    """The report's view of a client case (the reports render `Case`s)."""
    return Case(
        id=case.id, title=case.title, section=case.section, requirement=case.requirement,
        level=case.level, messages=case.messages, layouts=(), flags=(), features=(),
        error_codes=(), required_features=(), required_flags=0, setup_vars=(),
        timeout=CASE_TIMEOUT, steps=(), source="felix_conformance.clienttest.cases",
    )  # fmt: skip


def select_client_cases(
    include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> list[ClientCase]:
    return [
        c
        for c in CLIENT_CASES
        if (not include or any(fnmatch.fnmatchcase(c.id, g) for g in include))
        and not any(fnmatch.fnmatchcase(c.id, g) for g in exclude)
    ]


async def run_client_case(case: ClientCase, command: str, scratch: Path) -> CaseResult:
    started = time.monotonic()
    peers: list[ScriptedBroker] = []
    addresses: list[str] = []
    ca = generate_ca("Felix conformance client-tester CA")
    for peer_script in case.peers:
        peer = ScriptedBroker(peer_script(()), ca=ca)
        peer_host, peer_port = await peer.start()
        peers.append(peer)
        addresses.append(f"{peer_host}:{peer_port}")
    broker = ScriptedBroker(case.script(addresses), ca=ca)
    broker.peers = peers
    ca_file = scratch / f"{case.id}-ca.pem"
    ca_file.write_bytes(broker.ca_pem)
    host, port = await broker.start()
    if case.link:  # the client reaches the broker through a link that can go silent
        broker.link = SilentLink((host, port))
        host, port = await broker.link.start()
    adapter = Adapter(command)
    replies: list[dict[str, Any]] = []
    verdict, detail = Verdict.FAIL, ""
    stderr = ""
    try:
        async with asyncio.timeout(CASE_TIMEOUT):
            await adapter.start()
            connect = {
                "op": "connect", "addr": f"{host}:{port}", "ca_file": str(ca_file),
                "server_name": "localhost", "tenant_id": TENANT, "token": TOKEN,
                "namespace": NAMESPACE,
            }  # fmt: skip
            first = await adapter.call(connect)
            if not first["ok"]:
                raise AdapterError(f"the client could not connect: {first['error']['message']}")
            for op in case.ops:
                if op["op"] == "idle":  # the kit's own step: the client is left alone
                    broker.log.note("kit", f"idle for {op['seconds']} s")
                    await asyncio.sleep(float(op["seconds"]))
                    continue
                if op["op"] == "await_link":  # the kit's own step: until the link is back
                    await _link_back(broker, float(op["seconds"]))
                    continue
                replies.append(await adapter.call(op))
            await asyncio.sleep(0.1)  # let the broker see what the client sent last
            try:
                problem = case.judge(broker, replies)
            except ClientUnsupportedError as exc:
                verdict, detail = Verdict.UNSUPPORTED, str(exc)
            else:
                verdict = Verdict.PASS if problem is None else Verdict.FAIL
                detail = problem or ""
            await adapter.call({"op": "close"})
    except AdapterError as exc:
        if verdict not in (Verdict.PASS, Verdict.UNSUPPORTED):
            # What the client put on the wire explains more than the adapter's silence.
            breaches = "; ".join(broker.violations)
            verdict = Verdict.FAIL
            detail = f"{breaches} (then adapter: {exc})" if breaches else f"adapter: {exc}"
    except TimeoutError:
        verdict, detail = Verdict.FAIL, f"case did not finish within {CASE_TIMEOUT:g}s"
    finally:
        stderr = await adapter.stop()
        await broker.close()
        if broker.link is not None:
            broker.link.close()
            stats = broker.link.stats
            broker.log.note(
                "link",
                f"relayed {stats.relayed}, silenced {stats.silenced}, refused {stats.refused}",
            )
        for peer in peers:
            await peer.close()
    log = broker.log.text()
    for number, peer in enumerate(peers, 1):
        log += f"-- peer broker {number} ({addresses[number - 1]}):\n" + peer.log.text()
    log += "".join(f"{line}\n" for line in adapter.transcript)
    if stderr.strip():
        log += "adapter stderr (tail):\n" + stderr[-4000:]
    if case.level is Level.INFO and verdict in (Verdict.PASS, Verdict.FAIL):
        verdict, detail = Verdict.INFORMATIONAL, f"observed: {detail or 'behaved as described'}"
    return CaseResult(
        as_case(case), verdict, detail, duration=time.monotonic() - started, wire_log=log
    )


async def _link_back(broker: ScriptedBroker, at_most: float) -> None:
    """Wait (polling, at most `at_most` seconds) until the broker's link is not silent."""
    link = broker.link
    deadline = time.monotonic() + at_most
    while link is not None and link.silent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    broker.log.note("kit", "the link is back")


async def run_client_cases(
    cases: Sequence[ClientCase],
    command: str,
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> RunReport:
    report = RunReport(command, 0, 0, subject="client")
    with tempfile.TemporaryDirectory(prefix="felix-client-test-") as scratch:
        for case in cases:
            result = await run_client_case(case, command, Path(scratch))
            _log.info("%s: %s %s", case.id, result.verdict.value, result.detail)
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    return report
