"""Recorder round trip: the official client publishes and subscribes through the
recorder to the reference broker; the transcript it writes replays green."""

from __future__ import annotations

import asyncio
from pathlib import Path

import felix
import pytest

from felix_conformance.corpus import load_file
from felix_conformance.recorder import Recorder
from felix_conformance.runner import run_case
from felix_conformance.target import Target, probe
from felix_conformance.verdicts import Verdict

pytestmark = pytest.mark.timeout(120)


def _official_client_session(addr: str, target: Target, ca_file: Path) -> bytes | None:
    v = target.variables
    with felix.Client(addr, tenant_id=v["tenant_id"], token=v["token"], ca_file=str(ca_file)) as c:
        events = c.subscribe(v["tenant_id"], v["namespace"], v["memory_stream"])
        c.publish(v["tenant_id"], v["namespace"], v["memory_stream"], b"recorded-payload")
        event = events.next_event(timeout=10)
        events.close()
        return None if event is None else bytes(event.payload)


async def test_recorded_official_client_session_replays(
    reference_target: Target, tmp_path: Path
) -> None:
    recorder = Recorder(reference_target, tmp_path, variables=reference_target.variables)
    host, port = await recorder.start()
    try:
        payload = await asyncio.to_thread(
            _official_client_session,
            f"{host}:{port}",
            reference_target,
            tmp_path / "recorder-ca.pem",
        )
        assert payload == b"recorded-payload"
        for _ in range(100):  # the transcript is written when the relay sees the close
            if recorder.written:
                break
            await asyncio.sleep(0.1)
    finally:
        await recorder.close()
    assert recorder.written, "no transcript written"
    case = load_file(recorder.written[0])
    assert {"subscribe", "subscribed", "event_stream_hello"} <= set(case.messages)
    assert "publish_batch" in case.layouts
    text = recorder.written[0].read_text()
    assert reference_target.variables["token"] not in text  # replaced by ${token}
    advertised = await probe(reference_target)
    result = await run_case(case, reference_target, advertised)
    assert result.verdict is Verdict.PASS, (result.detail, result.wire_log)
