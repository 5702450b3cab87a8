"""Serve mode: the kit plays the broker's side, and a raw client built on
felix_wire + felix_transport (the kit's own runner) gets through the transcript."""

from __future__ import annotations

import pytest

from felix_conformance.corpus import load_corpus, select
from felix_conformance.playback import PlaybackServer
from felix_conformance.runner import run_cases
from felix_conformance.target import Advertised, Target
from felix_conformance.verdicts import Verdict
from felix_wire.flags import KNOWN_FLAGS

pytestmark = pytest.mark.timeout(60)

PLAYABLE = [
    "auth.auth-ok-with-client-flags",
    "publish.binary-acked",
    "publish.json-publish-acked",
    "subscribe.subscribed-then-event-stream-hello",
]


async def test_raw_client_against_played_broker() -> None:
    cases = select(load_corpus(), PLAYABLE)
    # The client side only knows its own values; the server learns them from the wire.
    client_vars = {
        "tenant_id": "t-play", "token": "token-play", "namespace": "ns",
        "memory_stream": "mem", "other_tenant": "x",
    }  # fmt: skip
    server = PlaybackServer(cases, {"namespace": "ns", "memory_stream": "mem"})
    host, port = await server.start()
    try:
        target = Target(host, port, server.ca_pem, "localhost", client_vars)
        # Nothing to probe on a played broker: treat every flag as advertised.
        report = await run_cases(cases, target, Advertised(KNOWN_FLAGS, 0, False))
    finally:
        await server.close()
    client_side = {r.case.id: (r.verdict, r.detail) for r in report.results}
    assert all(v is Verdict.PASS for v, _ in client_side.values()), client_side
    assert [r.case_id for r in server.results] == [c.id for c in cases]
    assert all(r.passed for r in server.results), [(r.case_id, r.detail) for r in server.results]


async def test_a_wrong_client_fails_playback() -> None:
    cases = select(load_corpus(), ["publish.binary-acked"])
    server = PlaybackServer(cases, {"memory_stream": "expected-stream"})
    host, port = await server.start()
    try:
        variables = {"tenant_id": "t", "token": "k", "namespace": "ns", "memory_stream": "other"}
        target = Target(host, port, server.ca_pem, "localhost", variables)
        report = await run_cases(cases, target, Advertised(KNOWN_FLAGS, 0, False))
        await server.finished.wait()
    finally:
        await server.close()
    assert report.results[0].verdict is Verdict.FAIL
    assert not server.results[0].passed
    assert "expected-stream" in server.results[0].detail
