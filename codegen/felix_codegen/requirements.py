"""Read, validate and cross-check spec/requirements.yaml.

The requirements file is validated against spec/requirements.schema.json (errors
carry the JSON path of the offending entry), then cross-checked: ids and section
numbers are unique, every requirement names a listed section, and a `decision`
names one of the catalogue's decisions. It has its own digest, kept apart from the
catalogue's `spec_hash`, so rewording a requirement regenerates one module only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

FILE = "requirements.yaml"
SCHEMA = "requirements.schema.json"


class RequirementsError(Exception):
    """spec/requirements.yaml is invalid; the message names the exact path."""


@dataclass(frozen=True)
class Requirement:
    id: str
    section: str
    text: str
    decision: str | None
    open: bool


@dataclass(frozen=True)
class Requirements:
    digest: str
    sections: tuple[tuple[str, str], ...]  # (number, title), in file order
    items: tuple[Requirement, ...]

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The id prefixes (the letters before the number), longest first, so a
        regular expression alternation never stops at a shorter one."""
        found = {r.id.rstrip("0123456789") for r in self.items}
        return tuple(sorted(found, key=lambda p: (-len(p), p)))


def _path(parts: Iterable[Any]) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def load_requirements(spec_dir: Path, decision_ids: Iterable[str]) -> Requirements:
    text = (spec_dir / FILE).read_bytes()
    schema_text = (spec_dir / SCHEMA).read_bytes()
    document = yaml.safe_load(text)
    validator = jsonschema.Draft202012Validator(json.loads(schema_text))
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{FILE}: {_path(e.absolute_path)}: {e.message}" for e in errors[:20]]
        raise RequirementsError("requirements do not match their schema:\n" + "\n".join(lines))

    problems: list[str] = []
    sections = tuple((s["id"], s["title"]) for s in document["sections"])
    numbers = [n for n, _ in sections]
    for i, number in enumerate(numbers):
        if number in numbers[:i]:
            problems.append(f"{FILE}: $.sections[{i}]: duplicate section {number}")
    decisions = set(decision_ids)
    items = []
    seen: set[str] = set()
    for i, raw in enumerate(document["requirements"]):
        where = f"{FILE}: $.requirements[{i}]"
        item = Requirement(
            raw["id"], raw["section"], raw["text"], raw.get("decision"), raw.get("open", False)
        )
        if item.id in seen:
            problems.append(f"{where}: duplicate id {item.id}")
        seen.add(item.id)
        if item.section not in numbers:
            problems.append(f"{where}: unknown section {item.section}")
        if item.decision is not None and item.decision not in decisions:
            problems.append(f"{where}: unknown decision {item.decision}")
        items.append(item)
    if problems:
        raise RequirementsError("requirements cross-references are broken:\n" + "\n".join(problems))

    digest = hashlib.sha256(text + schema_text).hexdigest()
    return Requirements(digest=digest, sections=sections, items=tuple(items))
