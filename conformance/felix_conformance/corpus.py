"""Finding, loading and filtering transcripts.

The shipped corpus lives in the package (`transcripts/**/*.yaml`); `--transcripts
DIR` points at any other folder of the same format.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .model import Case, Level, parse_case
from .schema import TranscriptError

__all__ = ["load_corpus", "load_file", "select", "shipped_dir"]


def shipped_dir() -> Path:
    return Path(str(resources.files(__package__).joinpath("transcripts")))


def load_file(path: Path) -> Case:
    try:
        document: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise TranscriptError(str(path), f"not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise TranscriptError(str(path), "a transcript is a YAML mapping")
    return parse_case(document, str(path))


def load_corpus(directory: Path | None = None) -> list[Case]:
    """Every transcript under `directory` (default: the shipped corpus), by id.

    Ids must be unique: a report or filter naming a case must mean one case.
    """
    root = directory or shipped_dir()
    cases: dict[str, Case] = {}
    for path in sorted(root.rglob("*.yaml")):
        case = load_file(path)
        if case.id in cases:
            raise TranscriptError(
                str(path), f"duplicate case id {case.id!r} ({cases[case.id].source})"
            )
        cases[case.id] = case
    return sorted(cases.values(), key=lambda c: c.id)


def _matches(case_id: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(case_id, g) for g in globs)


def select(
    cases: Sequence[Case],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    strict: bool = False,
) -> list[Case]:
    """The cases a run plays: matching -t globs (all when none), not --exclude,
    and SHOULD-level ones only in strict mode."""
    chosen = []
    for case in cases:
        if include and not _matches(case.id, include):
            continue
        if exclude and _matches(case.id, exclude):
            continue
        if case.level is Level.SHOULD and not strict:
            continue
        chosen.append(case)
    return chosen
