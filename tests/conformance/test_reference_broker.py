"""The kit against our reference broker: what CI runs. No case may fail, and every
case needing something the broker does not advertise must come out unsupported."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from felix_conformance.cli import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main
from felix_conformance.corpus import load_corpus
from felix_conformance.runner import missing_needs
from felix_conformance.target import Target, probe, shard_owners, target_from_fixture
from felix_conformance.verdicts import Verdict


def _entry(fleet_file: Path, tmp_path: Path, *, owner: bool) -> Path:
    """The fleet's fixture document with the entry broker first (the kit's target):
    the leader of durable_stream's shard 0 (most cases' stream), or a broker leading
    none of durable_stream's, memory_stream's and cache's shard 0 (one leading the
    fewest when every broker leads one), never durable_stream's."""
    document = json.loads(fleet_file.read_text())
    target = target_from_fixture(fleet_file)
    names = [("stream", "durable_stream"), ("stream", "memory_stream"), ("cache", "cache")]
    owners = asyncio.run(shard_owners(target, [(k, document[n]) for k, n in names]))
    leaders = [owners[(k, document[n])][0].addr for k, n in names]
    if owner:
        entry = leaders[0]
    else:
        others = [a for a in document["addrs"] if a != leaders[0]]
        entry = min(others, key=leaders.count)
    document["addrs"] = [entry, *(a for a in document["addrs"] if a != entry)]
    path = tmp_path / "entry.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topology", ["one-broker", "fleet-via-owner", "fleet-via-non-owner"])
def test_whole_kit_passes_against_the_reference_broker(
    topology: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every case against one broker, and against the 3-broker fixture entered at a
    shard's owner and at a non-owner: forwarded requests go through the entry broker,
    leader-served ones to the owner the kit looks up, as a client would."""
    if topology == "one-broker":
        fixture = request.getfixturevalue("fixture_file")
    else:
        fleet = request.getfixturevalue("fleet_file")
        fixture = _entry(fleet, tmp_path, owner=topology == "fleet-via-owner")
    report_path = tmp_path / "report.json"
    junit_path = tmp_path / "report.xml"
    logs = tmp_path / "logs"
    code = main(
        [
            "--fixture", str(fixture), "--json", str(report_path),
            "--junit-xml", str(junit_path), "--log-dir", str(logs),
        ]
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    failed = [
        (c["id"], c["detail"], c["wire_log"]) for c in report["cases"] if c["verdict"] == "fail"
    ]
    assert failed == []
    assert code == EXIT_OK
    assert report["totals"]["pass"] >= 40
    suites = ET.parse(junit_path).getroot()
    assert sum(int(s.get("tests", "0")) for s in suites) == len(report["cases"])
    assert len(list(logs.glob("*.log"))) == len(report["cases"])
    if topology != "one-broker":
        verdicts = {c["id"]: c["verdict"] for c in report["cases"]}
        cluster = {cid: v for cid, v in verdicts.items() if cid.startswith("cluster.")}
        assert cluster and set(cluster.values()) == {"pass"}, cluster
        # Only the publisher layouts lack their stream (the fixture stores no publishers).
        setup = {cid for cid, v in verdicts.items() if v == "setup"}
        assert all(cid.startswith("events.publisher-") for cid in setup), setup
        if topology == "fleet-via-non-owner":
            # The leader-served cases on durable_stream went on to its owner.
            routed = {
                c["id"]
                for c in report["cases"]
                if "the case's connections go" in str(c["wire_log"])
            }
            assert {
                "groups.lifecycle",
                "gated.stream-read",
                "durable.replay-from-an-offset",
            } <= routed


async def test_unadvertised_features_make_cases_unsupported(reference_target: Target) -> None:
    advertised = await probe(reference_target)
    verdicts_expected = {
        case.id: missing_needs(case, reference_target, advertised) for case in load_corpus()
    }
    unmet = {cid: why for cid, why in verdicts_expected.items() if why is not None}
    # The reference broker is standalone: topology is cluster-only, so never advertised.
    assert "discovery.topology" in unmet
    # The fixture names every stream, cache and token: the only setup gap is the
    # fleet the cluster cases need (a single broker is one), and they say so.
    cluster = {case.id for case in load_corpus() if case.min_brokers > 1}
    assert cluster and all(unmet[cid].verdict is Verdict.SETUP for cid in cluster)
    assert all("fleet of" in unmet[cid].reason for cid in cluster)
    # And the publisher layouts need a stream whose broker stores publishers: the
    # fixture's broker stores none, so it names no publisher_stream.
    publisher = {c.id for c in load_corpus() if "publisher_stream" in c.variables}
    assert publisher and all(unmet[cid].verdict is Verdict.SETUP for cid in publisher)
    assert all("publisher_stream" in unmet[cid].reason for cid in publisher)
    rest = {cid: why for cid, why in unmet.items() if cid not in cluster | publisher}
    assert all(why.verdict is Verdict.UNSUPPORTED for why in rest.values()), rest
    assert all("did not advertise" in why.reason for why in rest.values())


@pytest.mark.timeout(60)
def test_exit_codes(fixture_file: Path, tmp_path: Path) -> None:
    assert main(["--list"]) == EXIT_OK
    assert main(["--target", "127.0.0.1:5000"]) == EXIT_USAGE
    assert main(["--fixture", str(fixture_file), "-t", "no-such-case"]) == EXIT_USAGE
    document = json.loads(fixture_file.read_text())
    document["addrs"] = ["127.0.0.1:9"]  # nothing listens there
    unreachable = tmp_path / "unreachable.json"
    unreachable.write_text(json.dumps(document))
    assert main(["--fixture", str(unreachable), "-t", "auth.*"]) == EXIT_UNREACHABLE
    assert main(["coverage"]) == EXIT_OK


@pytest.mark.timeout(300)
def test_the_kit_on_the_other_quic_stack_passes_too(fixture_file: Path, tmp_path: Path) -> None:
    """The kit on aioquic against the broker on qh3 (the session's fixture): the
    verdicts must not depend on which stack either side runs."""
    other = "aioquic" if os.environ.get("FELIX_QUIC_IMPL", "qh3") == "qh3" else "qh3"
    report_path = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "felix_conformance.cli", "--fixture", str(fixture_file),
         "-t", "auth.*", "-t", "publish.*", "-t", "subscribe.*", "-t", "groups.*",
         "-t", "cache.*", "--json", str(report_path)],
        env={**os.environ, "FELIX_QUIC_IMPL": other},
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    failed = [(c["id"], c["detail"]) for c in report["cases"] if c["verdict"] == "fail"]
    assert failed == [], done.stdout[-3000:]
    assert done.returncode == EXIT_OK
    assert report["totals"]["pass"] >= 30


@pytest.mark.timeout(120)
def test_the_new_should_cases_pass_against_the_reference_broker(
    fixture_file: Path, tmp_path: Path
) -> None:
    """SHOULD-level cases run only with --strict (the whole-kit runs leave them out):
    the auth timeout (T9, T11) holds against our broker."""
    report_path = tmp_path / "strict.json"
    code = main(
        ["--fixture", str(fixture_file), "--strict", "-t", "auth.auth-timeout",
         "--json", str(report_path)]
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    assert {c["id"]: c["verdict"] for c in report["cases"]} == {"auth.auth-timeout": "pass"}
    assert code == EXIT_OK
