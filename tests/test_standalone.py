"""The repository stands alone: nothing reads material beside the clone, benchmarks do
not lean on the tests, and the licence and notice cover what is vendored."""

from __future__ import annotations

import ast
import re
import subprocess

from .support.paths import REPO, UPSTREAM_VECTORS

# A path to material outside the repository (the old reference folder beside the clone).
# Spelled in pieces so that this file does not itself match the pattern it checks for.
_FOLDER = "sha" + "red"
OUTSIDE = re.compile(rf"\.\./{_FOLDER}|FELIX_{_FOLDER.upper()}|parent\s*/\s*\"{_FOLDER}\"")


def _tracked(*patterns: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *patterns],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return [line for line in listed.stdout.splitlines() if line]


def test_nothing_reads_beside_the_clone() -> None:
    files = _tracked("*.py", "*.yaml", "*.toml", "*.ini", "*.cfg", "Makefile", ".ci/*")
    assert "tests/conftest.py" in files
    found = [
        f"{name}:{number}: {line.strip()}"
        for name in files
        if name != "tests/test_standalone.py"
        for number, line in enumerate((REPO / name).read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_benchmarks_do_not_import_the_tests() -> None:
    offenders = []
    for path in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert offenders == []


def test_licence_and_notice_cover_the_vendored_vectors() -> None:
    licence = (REPO / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
    notice = (REPO / "NOTICE").read_text()
    assert "tests/vectors/upstream/" in notice and "Apache License, Version 2.0" in notice
    provenance = (UPSTREAM_VECTORS / "README.md").read_text()
    assert "felix-wire" in provenance and "Apache" in provenance
