"""Target profiles, the setup verdict, and the HTML report and progress line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from felix_conformance.cli import EXIT_OK, EXIT_USAGE, main
from felix_conformance.corpus import load_corpus, select
from felix_conformance.profile import ProfileError, load_profile
from felix_conformance.reports import Progress, to_html
from felix_conformance.runner import run_cases
from felix_conformance.target import Target, discover, probe
from felix_conformance.verdicts import CaseResult, RunReport, Verdict

pytestmark = pytest.mark.timeout(200)


def test_profile_from_a_fixture_names_what_the_fixture_has(
    fixture_file: Path, felix_fixture: dict[str, object], tmp_path: Path
) -> None:
    out = tmp_path / "profile.yaml"
    assert main(["profile", "--fixture", str(fixture_file), "--out", str(out)]) == EXIT_OK
    profile = load_profile(out)
    for name in ("tenant_id", "token", "memory_stream", "durable_stream", "cache"):
        assert profile.variables[name] == felix_fixture[name]
    assert profile.variables["unauthorized_token"] == felix_fixture["unauthorized_token"]
    assert profile.target == felix_fixture["addrs"][0]  # type: ignore[index]


def test_profile_paths_are_relative_to_the_profile(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "token.txt").write_text("secret-token\n")
    (folder / "profile.yaml").write_text("token_file: token.txt\nca_file: ca.pem\n")
    profile = load_profile(folder / "profile.yaml")
    assert profile.variables["token"] == "secret-token"
    assert profile.ca_file == folder / "ca.pem"


def test_a_profile_typo_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("streams: {memory_streem: events}\n")
    with pytest.raises(ProfileError, match="memory_streem"):
        load_profile(path)
    argv = ["--profile", str(path), "--target", "127.0.0.1:9", "--tenant", "t", "--token", "k"]
    assert main(argv) == EXIT_USAGE


def test_target_without_ca_names_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "127.0.0.1:5000", "--tenant", "t1", "--token", "k"]) == EXIT_USAGE
    assert "--ca-file" in capsys.readouterr().out


async def test_a_stream_the_target_lacks_is_setup_not_fail(reference_target: Target) -> None:
    variables = {**reference_target.variables, "memory_stream": "conformance-not-there"}
    variables.pop("durable_stream")
    target = Target(
        reference_target.host, reference_target.port, reference_target.ca_pem, "localhost",
        variables,
    )  # fmt: skip
    advertised = await probe(target)
    found = await discover(target, advertised)
    assert "memory_stream" in found.target.unavailable
    assert any("does not exist" in n for n in found.notes)
    cases = select(load_corpus(), ["publish.json-*", "durable.*", "auth.auth-ok-*"])
    report = await run_cases(cases, found.target, advertised)
    verdicts = {r.case.id: r for r in report.results}
    assert verdicts["auth.auth-ok-with-client-flags"].verdict is Verdict.PASS
    assert verdicts["publish.json-publish-acked"].verdict is Verdict.SETUP
    assert "conformance-not-there" in verdicts["publish.json-publish-acked"].detail
    assert verdicts["durable.replay-from-an-offset"].verdict is Verdict.SETUP
    assert not report.failed


def test_the_cli_run_with_a_profile_writes_every_report(fixture_file: Path, tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    assert main(["profile", "--fixture", str(fixture_file), "--out", str(profile)]) == EXIT_OK
    document = yaml.safe_load(profile.read_text())
    del document["streams"]["memory_stream"]
    profile.write_text(yaml.safe_dump(document))
    html_path, json_path = tmp_path / "r.html", tmp_path / "r.json"
    code = main(
        ["--profile", str(profile), "-t", "publish.*", "--html", str(html_path),
         "--json", str(json_path)]
    )  # fmt: skip
    assert code == EXIT_OK
    report = json.loads(json_path.read_text())
    assert report["totals"]["setup"] >= 1 and report["totals"]["fail"] == 0
    page = html_path.read_text()
    assert page.count('<details class="case"') == len(report["cases"])
    assert "memory_stream" in page and 'class="v setup"' in page


def _result(case_id: str, verdict: Verdict, log: str = "") -> CaseResult:
    (case,) = select(load_corpus(), [case_id], strict=True)
    return CaseResult(case, verdict, f"reason <{verdict.value}>", wire_log=log)


def test_html_report_is_self_contained_and_escaped() -> None:
    report = RunReport("127.0.0.1:1", 0x19, 0x2800, notes=["a <note>"])
    report.results += [
        _result("auth.auth-ok-with-client-flags", Verdict.PASS, "0.001s s1 -> <auth>\n"),
        _result("publish.json-publish-acked", Verdict.FAIL, "0.002s s1 <- error\n"),
        _result("gated.counters", Verdict.UNSUPPORTED),
    ]
    page = to_html(report)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "http" not in page.split("<style>")[1].split("</style>")[0]
    assert "&lt;auth&gt;" in page and "<auth>" not in page and "a &lt;note&gt;" in page
    assert page.count("<summary>wire log") == 2  # cases that did not run have none
    assert '<details class="case" id="publish.json-publish-acked" open>' in page
    for r in report.results:
        assert r.case.requirement.replace("'", "&#x27;").replace('"', "&quot;") in page


def test_progress_line_rewrites_on_a_terminal_and_appends_otherwise() -> None:
    results = [
        _result("auth.auth-ok-with-client-flags", Verdict.PASS),
        _result("gated.counters", Verdict.SETUP),
    ]
    tty, plain = io.StringIO(), io.StringIO()
    for stream, is_tty in ((tty, True), (plain, False)):
        progress = Progress(stream, 2, tty=is_tty)
        for r in results:
            progress.update(r)
        progress.done()
    assert tty.getvalue().count("\r\x1b[K") == 2 and tty.getvalue().endswith("\n")
    assert plain.getvalue().splitlines() == [
        "[1/2] pass 1 | pass auth.auth-ok-with-client-flags",
        "[2/2] pass 1 setup 1 | setup gated.counters",
    ]
