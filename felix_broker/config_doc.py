"""Render docs/configuration.md from the knobs of `felix_broker.config`.

    python -m felix_broker.config_doc            # rewrite docs/configuration.md
    python -m felix_broker.config_doc --check    # exit 1 if it is out of date

Every knob, its default, its environment variables and what it does (or why
this broker ignores it) comes from the knob's metadata, so the reference
cannot drift from the code (tests/broker/test_config_doc.py checks it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from enum import StrEnum
from pathlib import Path

from felix_broker.config import BrokerConfig

__all__ = ["DOC_PATH", "render"]

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

_HEAD = """\
# Broker configuration

Generated from `felix_broker/config.py` by `python -m felix_broker.config_doc`;
do not edit by hand (a test compares it with the code).

Precedence, lowest to highest: built-in defaults, the YAML file given with
`--config` (top-level keys are the knob names, plus the `catalog:` section),
`FELIX_*` environment variables (where a knob has two, the first wins), and
`--set key=value` on the command line. Anything wrong fails at start naming
the key and the source. Durations are in the unit their name ends with, sizes
in bytes; relative paths are resolved against the working folder.

A knob marked **ignored** is accepted (so configurations written for other
Felix brokers load) but this broker does not use it; setting it to anything
but its default logs one warning at start saying why.

| knob | default | environment | what it does |
|---|---|---|---|
"""


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if value in ("", ()):
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, StrEnum):
        return value.value
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    rows: list[str] = []
    for f in dataclasses.fields(BrokerConfig):
        knob = f.metadata.get("knob")
        if knob is None:
            continue
        default = "`<data_dir>/durable`" if f.name == "durable_storage_dir" else None
        if default is None:
            default = f"`{_default(f.default)}`"
        env = ", ".join(f"`{name}`" for name in knob.env) or "-"
        what = knob.doc
        if knob.enum is not None:
            what += " One of: " + ", ".join(f"`{m.value}`" for m in knob.enum) + "."
        if knob.ignored is not None:
            what = (
                f"**ignored** by this broker: {knob.ignored}. (Its meaning elsewhere: {knob.doc})"
            )
        rows.append(f"| `{f.name}` | {default} | {env} | {_cell(what)} |")
    return _HEAD + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is out of date: run python -m felix_broker.config_doc")
            return 1
        return 0
    DOC_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
