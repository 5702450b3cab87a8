"""The generator: validation errors name the exact path, output is byte-stable and committed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ..support.paths import REPO

sys.path.insert(0, str(REPO / "codegen"))
from felix_codegen.load import CatalogueError, load
from felix_codegen.render import _ruff_format, render_all

SPEC = REPO / "spec"


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    target = tmp_path / "spec"
    shutil.copytree(SPEC, target)
    return target


def _edit(spec: Path, name: str, change) -> None:  # type: ignore[no-untyped-def]
    path = spec / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_typo_fails_with_the_exact_path(spec_copy: Path) -> None:
    def typo(data):  # type: ignore[no-untyped-def]
        data["messages"]["cache_get"]["fields"][4]["presense"] = "optional"

    _edit(spec_copy, "messages", typo)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert "messages.yaml: $.messages.cache_get.fields[4]" in str(info.value)
    assert "presense" in str(info.value)


def test_a_bad_wire_type_fails_with_its_path(spec_copy: Path) -> None:
    def bad(data):  # type: ignore[no-untyped-def]
        data["features"][3]["bit"] = 31

    _edit(spec_copy, "features", bad)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert "features.yaml: $.features[3].bit" in str(info.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["messages"]["error"]["fields"][1].update(gate=["FEATURE_ERROR_CODE"]),
            "unknown flag/feature FEATURE_ERROR_CODE",
        ),
        (
            lambda d: d["messages"]["auth"].update(answered_by=["auth_okay"]),
            "unknown message auth_okay",
        ),
        (
            lambda d: d["messages"]["cache_watch_started"]["fields"][0].update(type="u65"),
            "$.messages.cache_watch_started.fields[0]",
        ),
        (
            lambda d: d["shapes"]["GroupRecord"]["fields"][0].update(type="Offsett"),
            "unknown type Offsett",
        ),
        (
            lambda d: d["binary_layouts"]["publish_batch"].update(legal_flag_combinations=[1, 9]),
            "disagree with the flag rules",
        ),
        (
            lambda d: d["flags"][8].update(requires=["BINARY_PUBLISH_ACKD"]),
            "unknown flag BINARY_PUBLISH_ACKD",
        ),
        (lambda d: d["error_codes"][0].update(number=2), "duplicate number"),
    ],
)
def test_cross_references_are_checked(spec_copy: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    _edit(spec_copy, "messages", change)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["messages"]["hello"]["fields"][0].update(presense="required"),
            "fleet.yaml: $.messages.hello.fields[0]",
        ),
        (
            lambda d: d["records"]["Member"]["fields"][4].update(type="Incarnation"),
            "$.records.Member.fields[4]: unknown type Incarnation",
        ),
        (
            lambda d: d["shapes"]["CacheOp"]["messages"].append("cache_gett"),
            "unknown client message cache_gett",
        ),
        (
            lambda d: d["messages"]["forward_publish"].update(answered_by=["forward_publish"]),
            "travels the same way as the request",
        ),
        (
            lambda d: d["keyspace"]["members"].update(value="Membr"),
            "unknown record Membr",
        ),
        (
            lambda d: d["shapes"].update(ErrorDetail={"kind": "struct", "doc": "x", "fields": []}),
            "already a client catalogue type",
        ),
        (
            lambda d: d["peer"].update(alpn="felix peer"),
            "fleet.yaml: $.peer.alpn",
        ),
    ],
)
def test_the_fleet_catalogue_is_validated(spec_copy: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    _edit(spec_copy, "fleet", change)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert expected in str(info.value)


def test_generation_is_byte_stable_and_matches_the_committed_layer() -> None:
    cat = load(SPEC)
    first = _ruff_format(render_all(cat))
    second = _ruff_format(render_all(load(SPEC)))
    assert first == second
    committed = REPO / "generated" / "felix_wire"
    on_disk = {
        str(p.relative_to(committed)): p.read_text()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk == first, "generated/ drifted from spec/: run `make codegen` and commit"


def test_generated_files_carry_the_header_and_no_timestamp() -> None:
    cat = load(SPEC)
    for name, text in render_all(cat).items():
        if name.endswith(".py"):
            first_line = text.splitlines()[0]
            assert first_line.startswith("# Generated from spec/") and "DO NOT EDIT" in first_line
            # The requirements table carries its own file's digest (rewording one
            # requirement regenerates that module only); every other module the catalogue's.
            assert cat.requirements is not None and cat.fleet is not None
            digest = cat.requirements.digest if name == "requirements.py" else cat.spec_hash
            if name.startswith("fleet"):  # the fleet catalogue's modules carry its digest
                digest = cat.fleet.spec_hash
            assert digest in text.splitlines()[1]


def test_the_cli_validates_only_with_check() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "felix_codegen", "--check"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "codegen"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "78 messages" in result.stdout
    assert f"{len(load(SPEC).requirements.items)} requirements" in result.stdout  # type: ignore[union-attr]


def test_nothing_imports_codegen_at_run_time() -> None:
    """The generator is a build step: no installed package may import it."""
    roots = [
        "generated/felix_wire",
        "felix_transport",
        "felix_broker",
        "felix_client",
        "conformance/felix_conformance",
    ]
    offenders = [
        str(path.relative_to(REPO))
        for root in roots
        for path in (REPO / root).rglob("*.py")
        if "felix_codegen" in path.read_text()
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["requirements"][3].update(txt="typo"),
            "requirements.yaml: $.requirements[3]: Additional properties",
        ),
        (
            lambda d: d["requirements"][0].update(id="t1"),
            "requirements.yaml: $.requirements[0].id",
        ),
        (
            lambda d: d["requirements"][1].update(id=d["requirements"][0]["id"]),
            "requirements.yaml: $.requirements[1]: duplicate id",
        ),
        (
            lambda d: d["requirements"][2].update(section="15.9"),
            "requirements.yaml: $.requirements[2]: unknown section 15.9",
        ),
        (
            lambda d: d["requirements"][2].update(decision="no-such-decision"),
            "requirements.yaml: $.requirements[2]: unknown decision no-such-decision",
        ),
        (
            lambda d: d["requirements"][4].update(text="two lines\nof text."),
            "requirements.yaml: $.requirements[4].text",
        ),
    ],
)
def test_a_bad_requirement_fails_with_its_path(spec_copy: Path, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    _edit(spec_copy, "requirements", change)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("alphabet", "expected"),
    [("A-Za-z/", "$.names.alphabet"), ("A-Z\\\\", "$.names.alphabet")],
)
def test_the_name_rule_cannot_admit_a_path_separator(
    spec_copy: Path, alphabet: str, expected: str
) -> None:
    def loosen(data):  # type: ignore[no-untyped-def]
        data["names"]["alphabet"] = alphabet

    _edit(spec_copy, "messages", loosen)
    with pytest.raises(CatalogueError) as info:
        load(spec_copy)
    assert expected in str(info.value)
