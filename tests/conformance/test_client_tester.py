"""The client tester: felix_client passes it, a correct raw client passes it, and
each deliberately broken client is caught by the case that covers its breach."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from felix_conformance.cli import EXIT_FAILED, EXIT_OK, main
from felix_conformance.clienttest.cases import CLIENT_CASES
from felix_conformance.clienttest.runner import run_client_cases, select_client_cases
from felix_conformance.verdicts import Verdict

REPO = Path(__file__).resolve().parents[2]
PYTHON = shlex.quote(sys.executable)
FELIX_CLIENT_ADAPTER = f"{PYTHON} {REPO / 'conformance/adapters/felix_client_adapter.py'}"
OFFICIAL_ADAPTER = f"{PYTHON} {REPO / 'conformance/adapters/official_felix_adapter.py'}"
RAW_ADAPTER = f"{PYTHON} {REPO / 'tests/conformance/raw_adapter.py'}"
ALL = {c.id for c in CLIENT_CASES}


@pytest.mark.timeout(300)
def test_felix_client_passes_every_client_case(tmp_path: Path) -> None:
    report = tmp_path / "client.json"
    html = tmp_path / "client.html"
    junit = tmp_path / "client.xml"
    code = main(
        ["client", "--adapter", FELIX_CLIENT_ADAPTER, "--json", str(report), "--html", str(html),
         "--junit-xml", str(junit)]
    )  # fmt: skip
    document = json.loads(report.read_text())
    verdicts = {c["id"]: c["verdict"] for c in document["cases"]}
    failed = {
        c["id"]: (c["detail"], c["wire_log"][-20:])
        for c in document["cases"]
        if c["verdict"] != "pass" and c["id"] in verdicts
    }
    assert failed == {}
    assert code == EXIT_OK
    assert document["subject"] == "client" and {c["id"] for c in document["cases"]} == ALL
    assert "felix-conformance: client" in html.read_text()
    assert junit.read_text().count("<testcase") == len(ALL)


@pytest.mark.timeout(400)
async def test_the_official_client_is_reported_case_by_case() -> None:
    """The official client (felix-client 0.6.2) is judged like any other: its three
    gaps are fails naming what it did, not kit errors: acked binary publishes to a
    broker that negotiated nothing (against a plain `ok` a client uses JSON for
    acked publishes), failing the publish on an unknown message type, and an idle
    connection lost to a broker idle timeout shorter than its PING interval; what
    it lacks (a retry policy, gap counts) is unsupported. It reads JSON events,
    owner-named binary refusals, internal and revoked refusals, and keeps a
    per-stream publish window."""
    report = await run_client_cases(CLIENT_CASES, OFFICIAL_ADAPTER)
    verdicts = {r.case.id: (r.verdict, r.detail) for r in report.results}
    assert set(verdicts) == ALL
    legacy_verdict, legacy_detail = verdicts.pop("client.legacy-broker")
    assert legacy_verdict is Verdict.FAIL
    assert "flags 0x0008 the broker did not advertise" in legacy_detail
    # It also gives up on a message type it does not know instead of skipping it.
    unknown_verdict, unknown_detail = verdicts.pop("client.tolerates-unknown")
    assert unknown_verdict is Verdict.FAIL
    assert "Unknown" in unknown_detail
    # It has no retry policy: it reports retry and retry_after refusals with their
    # class and resends nothing, so the resend cases do not apply to it.
    for case_id in ("client.retry-resent", "client.retry-after-waited"):
        verdict, detail = verdicts.pop(case_id)
        assert verdict is Verdict.UNSUPPORTED, (case_id, detail)
        assert "does not resend on its own" in detail
    # It has no conditional publish at all.
    verdict, detail = verdicts.pop("client.conditional-outcome-unknown-not-resent")
    assert verdict is Verdict.UNSUPPORTED, detail
    assert "no conditional publish" in detail
    # Its adapter reports no gap counts (the client has none to give).
    for case_id in ("client.gap-detected", "client.skipped-not-lost"):
        gap_verdict, gap_detail = verdicts.pop(case_id)
        assert gap_verdict is Verdict.UNSUPPORTED, (case_id, gap_detail)
    # It PINGs every 2 s whatever idle timeout the broker asked for (1.5 s here).
    keepalive_verdict, keepalive_detail = verdicts.pop("client.keepalive-idle")
    assert keepalive_verdict is Verdict.FAIL
    assert "connection" in keepalive_detail
    assert {cid: v for cid, (v, _) in verdicts.items()} == dict.fromkeys(verdicts, Verdict.PASS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("mode", "caught"),
    [
        ("none", set()),
        ("no-flags", {"client.connect-negotiates"}),
        ("ungated", {"client.no-ungated-request"}),
        (
            "never-reads",
            {
                "client.publish-refused",
                "client.outcome-unknown-not-resent",
                "client.conditional-outcome-unknown-not-resent",
                "client.retry-resent",
                "client.retry-after-waited",
                "client.fatal-not-resent",
                "client.not-leader-followed",
                "client.unknown-error-code",
                "client.answers-out-of-order",
                "client.subscribe-delivers",
                "client.json-event-delivered",
                "client.skipped-not-lost",
                "client.owner-named-refusal",
                "client.internal-not-resent",
                "client.revoked-not-resent",
                "client.stream-publish-window",
            },
        ),
        ("arrival-order", {"client.answers-out-of-order"}),
        ("binary-always", {"client.legacy-broker"}),
        (
            "resend",
            {
                "client.outcome-unknown-not-resent",
                "client.conditional-outcome-unknown-not-resent",
                "client.fatal-not-resent",
                "client.retry-after-waited",
                "client.internal-not-resent",
                "client.revoked-not-resent",
            },
        ),
        ("strict-types", {"client.tolerates-unknown"}),
        ("ignore-not-leader", {"client.not-leader-followed"}),
        ("no-reconnect", {"client.survives-reset-link", "client.survives-silent-link"}),
        ("impatient", {"client.survives-stalled-link"}),
        ("no-keepalive", {"client.keepalive-idle"}),
        ("resume-latest", {"client.lagged-resumed", "client.shard-moved-resumed"}),
        ("no-gap", {"client.gap-detected"}),
        ("skips-as-gaps", {"client.skipped-not-lost"}),
        ("no-window", {"client.stream-publish-window"}),
        ("binary-events", {"client.json-event-delivered"}),
    ],
)
async def test_each_broken_client_is_caught(mode: str, caught: set[str]) -> None:
    # The correct client ("none") runs every case; a broken one its caught cases and a control.
    control = "client.publish-acked"
    cases = CLIENT_CASES if mode == "none" else select_client_cases([*caught, control])
    selected = {c.id for c in cases}
    report = await run_client_cases(cases, f"{RAW_ADAPTER} --break {mode}")
    failed = {r.case.id for r in report.results if r.verdict is Verdict.FAIL}
    passed = {r.case.id for r in report.results if r.verdict is Verdict.PASS}
    unsupported = {r.case.id for r in report.results if r.verdict is Verdict.UNSUPPORTED}
    assert failed == caught, {r.case.id: r.detail for r in report.results}
    assert passed == selected - caught and not unsupported


@pytest.mark.timeout(150)
async def test_a_broken_adapter_fails_cases_without_hanging_the_tester() -> None:
    cases = select_client_cases(["client.connect-negotiates", "client.publish-acked"])
    started = time.monotonic()
    garbage = await run_client_cases(cases, f"{PYTHON} -c \"print('not json')\"")
    silent = await run_client_cases(cases[:1], f"{PYTHON} -c 'import time; time.sleep(60)'")
    dead = await run_client_cases(cases[:1], f"{PYTHON} -c 'raise SystemExit(3)'")
    # Bounded: a reply timeout (15 s) and an exit grace (5 s) per stuck adapter, no more.
    assert time.monotonic() - started < 110
    assert all(r.verdict is Verdict.FAIL for r in garbage.results)
    assert "not a JSON reply" in garbage.results[0].detail
    assert "no reply to connect" in silent.results[0].detail
    assert "exited before replying" in dead.results[0].detail


def test_client_list_and_selection() -> None:
    assert main(["client", "--adapter", "true", "--list"]) == EXIT_OK
    assert main(["client", "--adapter", "true", "-t", "no-such-case"]) == 2
    assert main(["client", "--adapter", f"{PYTHON} -c pass", "-t", "client.connect-*"]) == (
        EXIT_FAILED
    )
