"""The kit's cluster cases (transcripts/cluster): they pass against
`felix-broker fixture --brokers 3` reached through the fixture or through the profile
written from it, and come out "setup" (never "fail", never "unsupported") against a
single broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from felix_conformance.cli import EXIT_OK, main
from felix_conformance.corpus import load_corpus, select
from felix_conformance.model import parse_case
from felix_conformance.profile import load_profile, profile_from_fixture
from felix_conformance.runner import run_case
from felix_conformance.target import Target, probe, target_from_fixture
from felix_conformance.verdicts import Verdict

CLUSTER = ["cluster.*"]


def _cluster_ids() -> set[str]:
    return {case.id for case in select(load_corpus(), CLUSTER, strict=True)}


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    code = main([*args, "-t", *CLUSTER, "--json", str(report)])
    return code, json.loads(report.read_text())


def _verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in report["cases"]}


@pytest.mark.timeout(240)
def test_cluster_cases_pass_against_a_three_broker_fleet(fleet_file: Path, tmp_path: Path) -> None:
    code, report = _run(tmp_path, "--fixture", str(fleet_file))
    problems = [
        (c["id"], c["verdict"], c["detail"], c["wire_log"])
        for c in report["cases"]
        if c["verdict"] != "pass"
    ]
    assert problems == []
    assert code == EXIT_OK
    assert set(_verdicts(report)) == _cluster_ids()
    assert len(_cluster_ids()) >= 6


@pytest.mark.timeout(240)
def test_the_profile_written_from_a_fleet_fixture_runs_the_cluster_cases(
    fleet_file: Path, tmp_path: Path
) -> None:
    """The documented way to point the kit at a fleet: `profile --fixture`, then
    `--profile`; the profile carries every broker's address."""
    profile_path = tmp_path / "profile.yaml"
    assert main(["profile", "--fixture", str(fleet_file), "--out", str(profile_path)]) == EXIT_OK
    document = yaml.safe_load(profile_path.read_text())
    addrs = json.loads(fleet_file.read_text())["addrs"]
    assert document["brokers"] == addrs and len(addrs) == 3
    assert document["target"] == addrs[0]
    assert load_profile(profile_path).variables["brokers"] == addrs
    code, report = _run(tmp_path, "--profile", str(profile_path))
    assert set(_verdicts(report).values()) == {"pass"}, report["cases"]
    assert code == EXIT_OK


@pytest.mark.timeout(240)
def test_without_brokers_in_the_profile_the_fleet_is_discovered(
    fleet_file: Path, tmp_path: Path
) -> None:
    """A profile naming no `brokers`: discovery learns the fleet from topology_view."""
    document = profile_from_fixture(fleet_file)
    del document["brokers"]
    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(document))
    code, report = _run(tmp_path, "--profile", str(profile_path))
    assert set(_verdicts(report).values()) == {"pass"}, report["cases"]
    assert any(note.startswith("brokers: 3 from topology_view") for note in report["notes"])
    assert code == EXIT_OK


@pytest.mark.timeout(120)
def test_cluster_cases_are_setup_against_a_single_broker(
    fixture_file: Path, tmp_path: Path
) -> None:
    code, report = _run(tmp_path, "--fixture", str(fixture_file))
    verdicts = _verdicts(report)
    assert set(verdicts) == _cluster_ids()
    assert set(verdicts.values()) == {"setup"}, report["cases"]
    assert all("fleet of 2 brokers" in c["detail"] for c in report["cases"])
    assert code == EXIT_OK
    # A single-broker fixture names no fleet, so its profile names none either.
    assert "brokers" not in profile_from_fixture(fixture_file)


_OTHER_THAN_SELF = {
    "id": "kit.other-than-the-only-broker",
    "title": "asks for a broker other than the only one",
    "section": "kit",
    "requirement": "none: checks the kit's own verdict",
    "exercises": {},
    "steps": [
        {"open": {"stream": "s1", "broker": {"other_than": "${self}"}}},
        {"send": {"stream": "s1", "message": {"type": "topology"}}},
    ],
}


async def test_asking_for_a_broker_the_fleet_lacks_is_setup(fixture_file: Path) -> None:
    """A fleet with no broker other than the one named: the target's setup, not a fail."""
    target = target_from_fixture(fixture_file)
    target = Target(
        target.host,
        target.port,
        target.ca_pem,
        target.server_name,
        {**target.variables, "self": target.address, "brokers": [target.address]},
    )
    case = parse_case(_OTHER_THAN_SELF, "inline")
    result = await run_case(case, target, await probe(target))
    assert result.verdict is Verdict.SETUP
    assert "no broker of the fleet other than" in result.detail


def test_a_fleet_fixture_document_gives_the_target_its_fleet(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read for this")
    document = {"addrs": ["127.0.0.1:1", "127.0.0.1:2"], "ca_file": "ca.pem", "token": "t"}
    path = tmp_path / "fx.json"
    path.write_text(json.dumps(document))
    target = target_from_fixture(path)
    assert target.fleet == ["127.0.0.1:1", "127.0.0.1:2"]
    assert target.address == "127.0.0.1:1"
    assert profile_from_fixture(path)["brokers"] == ["127.0.0.1:1", "127.0.0.1:2"]


_MOVED_CONNECTION = {
    "id": "kit.connection-moved",
    "title": "names another broker for a connection already made",
    "section": "kit",
    "requirement": "none: checks the kit's own verdict",
    "exercises": {},
    "steps": [
        {"open": {"stream": "s1"}},
        {"open": {"stream": "s2", "broker": "${elsewhere}"}},
    ],
}


async def test_a_connection_cannot_move_to_another_broker(fixture_file: Path) -> None:
    """Naming a broker for a connection already made elsewhere is the transcript's
    mistake, reported as such, never a silent second connection."""
    target = target_from_fixture(fixture_file)
    target = Target(
        target.host,
        target.port,
        target.ca_pem,
        target.server_name,
        {**target.variables, "elsewhere": "127.0.0.1:9"},
    )
    result = await run_case(parse_case(_MOVED_CONNECTION, "inline"), target, await probe(target))
    assert result.verdict is Verdict.FAIL
    assert "transcript problem" in result.detail and "already goes to the target" in result.detail


# The fault cases: they ask the fleet's control endpoint (profile `control_url`)
# to fence movable_stream's shard, and heal it after each case whatever its verdict.
FAULTS = ["cluster.shard-moved", "cluster.shard-unavailable-while-fenced"]
FAULT_GLOB = "cluster.shard-*"


@pytest.mark.timeout(240)
def test_the_fault_cases_pass_and_heal_after_themselves(fleet_file: Path, tmp_path: Path) -> None:
    """Run twice in a row: the second run passes only if the first healed the fence
    (a fenced shard refuses the cases' first write)."""
    for _ in range(2):
        report_path = tmp_path / "faults.json"
        code = main(["--fixture", str(fleet_file), "-t", FAULT_GLOB, "--json", str(report_path)])
        report = json.loads(report_path.read_text())
        problems = [
            (c["id"], c["detail"], c["wire_log"]) for c in report["cases"] if c["verdict"] != "pass"
        ]
        assert problems == []
        assert sorted(_verdicts(report)) == FAULTS and code == EXIT_OK
        assert all(any("POST /heal" in line for line in c["wire_log"]) for c in report["cases"])


@pytest.mark.timeout(120)
def test_a_fault_case_that_fails_still_heals(fleet_file: Path) -> None:
    """A case failing right after its fence: the kit heals anyway, so the next
    fault case finds the shard served."""
    broken = {
        "id": "kit.fence-then-fail",
        "title": "fences, then expects what the fence never answers",
        "section": "kit",
        "requirement": "none: checks the kit's own heal",
        "exercises": {},
        "setup": {"streams": ["movable_stream"]},
        "steps": [{"control": {"post": "/fence", "answer": {"node_id": "no-such-node"}}}],
    }
    target = target_from_fixture(fleet_file)

    async def fail_then_pass() -> tuple[Any, Any]:
        advertised = await probe(target)
        failed = await run_case(parse_case(broken, "inline"), target, advertised)
        (moved,) = select(load_corpus(), ["cluster.shard-moved"], strict=True)
        return failed, await run_case(moved, target, advertised)

    failed, moved = asyncio.run(fail_then_pass())
    assert failed.verdict is Verdict.FAIL and "answer.node_id" in failed.detail, failed
    assert "POST /heal" in failed.wire_log
    assert moved.verdict is Verdict.PASS, (moved.detail, moved.wire_log)


# The quorum cases: they ask the fleet's control endpoint to cut quorum_stream's
# leader off from its replicas (POST /partition), and heal it after each case.
QUORUM = ["cluster.quorum-timeout", "cluster.quorum-timeout-binary-ack"]
QUORUM_GLOB = "cluster.quorum-*"


@pytest.mark.timeout(300)
def test_the_quorum_cases_pass_and_heal_after_themselves(fleet_file: Path, tmp_path: Path) -> None:
    """Run twice in a row: each case's first write must be acked by a majority, so the
    second run passes only if the first healed the partition (and the binary case only
    if the JSON case before it healed)."""
    for _ in range(2):
        report_path = tmp_path / "quorum.json"
        code = main(["--fixture", str(fleet_file), "-t", QUORUM_GLOB, "--json", str(report_path)])
        report = json.loads(report_path.read_text())
        problems = [
            (c["id"], c["detail"], c["wire_log"]) for c in report["cases"] if c["verdict"] != "pass"
        ]
        assert problems == []
        assert sorted(_verdicts(report)) == QUORUM and code == EXIT_OK
        for case in report["cases"]:
            log = case["wire_log"]
            assert any("POST /partition" in line for line in log), case["id"]
            assert any("POST /heal" in line for line in log), case["id"]


@pytest.mark.timeout(120)
def test_without_a_quorum_stream_the_quorum_cases_are_setup(
    fleet_file: Path, tmp_path: Path
) -> None:
    """A profile from a fleet fixture names quorum_stream; without it the quorum cases
    are setup (they never partition), while the fence cases still run."""
    document = profile_from_fixture(fleet_file)
    assert document["streams"]["quorum_stream"] == "quorum"
    del document["streams"]["quorum_stream"]
    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(document))
    report_path = tmp_path / "quorum.json"
    code = main(["--profile", str(profile_path), "-t", QUORUM_GLOB, "--json", str(report_path)])
    report = json.loads(report_path.read_text())
    assert sorted(_verdicts(report)) == QUORUM
    assert set(_verdicts(report).values()) == {"setup"}, report["cases"]
    assert all("quorum_stream (not in the profile)" in c["detail"] for c in report["cases"])
    assert not any("POST /partition" in line for c in report["cases"] for line in c["wire_log"])
    assert code == EXIT_OK


@pytest.mark.timeout(120)
def test_without_a_control_url_the_fault_cases_are_setup(fleet_file: Path, tmp_path: Path) -> None:
    document = profile_from_fixture(fleet_file)
    assert document["control_url"] == json.loads(fleet_file.read_text())["control_url"]
    assert document["streams"]["movable_stream"] == "movable"
    del document["control_url"]
    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(document))
    report_path = tmp_path / "faults.json"
    globs = ["-t", FAULT_GLOB, "-t", QUORUM_GLOB]
    code = main(["--profile", str(profile_path), *globs, "--json", str(report_path)])
    report = json.loads(report_path.read_text())
    assert sorted(_verdicts(report)) == sorted(FAULTS + QUORUM)
    assert set(_verdicts(report).values()) == {"setup"}, report["cases"]
    assert all("control_url (not in the profile)" in c["detail"] for c in report["cases"])
    assert code == EXIT_OK


_FENCE_ONLY = {
    "id": "kit.fence",
    "title": "asks the control endpoint for a fence",
    "section": "kit",
    "requirement": "none: checks the kit's own verdict",
    "exercises": {},
    "steps": [{"control": {"post": "/fence"}}],
}


async def test_a_control_endpoint_that_cannot_fence_is_setup(fixture_file: Path) -> None:
    """A single broker's fixture answers /fence 409 (no fleet to fence with)."""
    target = target_from_fixture(fixture_file)
    assert "control_url" in target.variables
    result = await run_case(parse_case(_FENCE_ONLY, "inline"), target, await probe(target))
    assert result.verdict is Verdict.SETUP, result
    assert "cannot produce /fence" in result.detail and "fleet" in result.detail


async def test_an_unreachable_control_endpoint_is_setup(fixture_file: Path) -> None:
    target = target_from_fixture(fixture_file)
    target = Target(
        target.host,
        target.port,
        target.ca_pem,
        target.server_name,
        {**target.variables, "control_url": "http://127.0.0.1:9"},
    )
    result = await run_case(parse_case(_FENCE_ONLY, "inline"), target, await probe(target))
    assert result.verdict is Verdict.SETUP, result
    assert "cannot be reached" in result.detail


def test_only_a_fleet_fixture_gives_the_profile_a_control_url(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not read for this")
    base = {"addrs": ["127.0.0.1:1"], "ca_file": "ca.pem", "control_url": "http://127.0.0.1:2"}
    single, fleet = tmp_path / "single.json", tmp_path / "fleet.json"
    single.write_text(json.dumps(base))
    fleet.write_text(
        json.dumps(
            {
                **base,
                "addrs": ["127.0.0.1:1", "127.0.0.1:3"],
                "movable_stream": "m",
                "quorum_stream": "q",
            }
        )
    )
    assert "control_url" not in profile_from_fixture(single)
    document = profile_from_fixture(fleet)
    assert document["control_url"] == "http://127.0.0.1:2"
    assert document["streams"]["movable_stream"] == "m"
    assert document["streams"]["quorum_stream"] == "q"
    written = tmp_path / "profile.yaml"
    assert main(["profile", "--fixture", str(fleet), "--out", str(written)]) == EXIT_OK
    loaded = load_profile(written).variables
    assert loaded["control_url"] == "http://127.0.0.1:2" and loaded["movable_stream"] == "m"
    assert loaded["quorum_stream"] == "q"


async def test_a_fault_that_cannot_be_healed_fails_the_case(fixture_file: Path) -> None:
    """A control endpoint that fences but refuses /heal: the case cannot pass, since
    the fault would outlive it (a real HTTP endpoint on loopback)."""

    async def fence(_request: web.Request) -> web.Response:
        return web.json_response({"node_id": "node-1", "addr": "127.0.0.1:1"})

    async def heal(_request: web.Request) -> web.Response:
        return web.json_response({"error": "cannot heal"}, status=500)

    app = web.Application()
    app.router.add_post("/fence", fence)
    app.router.add_post("/heal", heal)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        target = target_from_fixture(fixture_file)
        target = Target(
            target.host,
            target.port,
            target.ca_pem,
            target.server_name,
            {**target.variables, "control_url": f"http://127.0.0.1:{port}"},
        )
        result = await run_case(parse_case(_FENCE_ONLY, "inline"), target, await probe(target))
    finally:
        await runner.cleanup()
    assert result.verdict is Verdict.FAIL, result
    assert "could not be healed" in result.detail and "500" in result.detail
