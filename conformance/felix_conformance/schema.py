"""The transcript JSON Schema shipped with the kit, and validation against it.

Errors name the exact path of the problem (`steps[3].send.message`), because a
transcript is written by hand and a typo must be found without guessing.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

__all__ = ["TranscriptError", "load_schema", "validate_document"]


class TranscriptError(ValueError):
    """A transcript that does not follow the schema or cannot be interpreted."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source


@cache
def load_schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schema/transcript.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def validate_document(document: Any, source: str) -> None:
    """Raise TranscriptError naming the path of the first (deepest) schema error."""
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: -len(e.absolute_path))
    if errors:
        best = jsonschema.exceptions.best_match(errors) or errors[0]
        raise TranscriptError(source, f"{_path(best.absolute_path)}: {best.message}")
