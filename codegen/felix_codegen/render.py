"""Render the generated layer from the catalogue.

Output is byte-stable: the same catalogue and templates give the same bytes (no
timestamps; every mapping iterated in catalogue order; ruff formats the Python).
"""

from __future__ import annotations

import json
import keyword
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from . import schemas
from .model import INT_RANGES, Catalogue, JsonField, Shape, TypeRef, camel

TEMPLATES = Path(__file__).parent / "templates"

# Python modules of the generated package, in the order they are rendered.
MODULES = (
    "__init__.py",
    "wire_errors.py",
    "frame.py",
    "flags.py",
    "features.py",
    "errors.py",
    "messages.py",
    "binary.py",
    "codec.py",
    "gating.py",
    "routing.py",
    "names.py",
    "catalogue.py",
    "requirements.py",
    "strategies.py",
)
# Rendered from the fleet catalogue (spec/fleet.yaml).
FLEET_MODULES = ("fleet.py", "fleet_strategies.py")

INT_ALIASES = {name: name.upper() for name in INT_RANGES}


def attr_name(name: str) -> str:
    """A catalogue field name as a Python attribute (`from` -> `from_`)."""
    return name + "_" if keyword.iskeyword(name) else name


class Naming:
    """Python spellings of catalogue types, shared by the templates."""

    def __init__(self, cat: Catalogue) -> None:
        self.cat = cat
        self.shapes = {s.name: s for s in cat.shapes}
        self.enums = {e.name: e for e in cat.enums}

    def base_type(self, ref: TypeRef) -> str:
        name = ref.name
        if name in INT_ALIASES:
            return INT_ALIASES[name]
        simple = {"bool": "bool", "str": "str", "b64": "bytes", "json": "Any"}
        if name in simple:
            return simple[name]
        if name in self.enums:
            return "str" if self.enums[name].open else name
        return name

    def py_type(self, ref: TypeRef) -> str:
        base = self.base_type(ref)
        return f"list[{base}]" if ref.is_list else base

    def default_expr(self, fd: JsonField) -> str:
        """The right-hand side of a struct field declaration (empty for required)."""
        rename = f', name="{fd.name}"' if attr_name(fd.name) != fd.name else ""
        if fd.presence == "required":
            return f" = msgspec.field(name={fd.name!r})" if rename else ""
        if fd.presence == "optional":
            return f" = msgspec.field(default=None{rename})" if rename else " = None"
        if fd.presence in ("optional_null", "nullable"):
            # Always written: a factory default is never omitted by omit_defaults.
            return f" = msgspec.field(default_factory=_none{rename})"
        value = fd.default
        if fd.emit_default:
            factory = self._factory(fd, value)
            return f" = msgspec.field(default_factory={factory}{rename})"
        if isinstance(value, list):
            return f" = msgspec.field(default_factory=list{rename})"
        if isinstance(value, dict):
            raise ValueError(f"non-emitted dict default for {fd.name} is not supported")
        return f" = msgspec.field(default={value!r}{rename})" if rename else f" = {value!r}"

    def _factory(self, fd: JsonField, value: Any) -> str:
        if value is False:
            return "_false"
        if value == 0 and not isinstance(value, bool) and isinstance(value, int):
            return "_zero"
        if value == []:
            return "_empty_list"
        if value == {} and fd.type.name in self.shapes:
            return fd.type.name
        raise ValueError(f"unsupported emitted default {value!r} for {fd.name}")

    def annotation(self, fd: JsonField) -> str:
        t = self.py_type(fd.type)
        if fd.presence in ("optional", "optional_null", "nullable"):
            return f"{t} | None"
        return t

    def u64_fields(self, fields: tuple[JsonField, ...]) -> tuple[list[str], list[str]]:
        """(scalar, list) attributes of type u64: msgspec bounds ints only to int64, so
        the generated structs check the u64 ceiling themselves."""
        scalars = [attr_name(f.name) for f in fields if f.type.name == "u64" and not f.type.is_list]
        lists = [attr_name(f.name) for f in fields if f.type.name == "u64" and f.type.is_list]
        return scalars, lists

    def struct_shapes(self) -> list[Shape]:
        return [s for s in self.cat.shapes if s.kind == "struct"]

    def alias_shapes(self) -> list[Shape]:
        return [s for s in self.cat.shapes if s.kind != "struct"]

    def alias_expr(self, s: Shape) -> str:
        if s.kind == "union":
            literals = ", ".join(repr(x) for x in s.literals)
            return f"Literal[{literals}] | {s.object}"
        return " | ".join(v for _tag, v in s.variants)


def _environment(cat: Catalogue) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["camel"] = camel
    env.filters["attr"] = attr_name
    env.filters["hex4"] = lambda v: f"0x{v:04X}"
    env.filters["pyrepr"] = repr
    env.globals.update(
        cat=cat,
        naming=Naming(cat),
        INT_RANGES=INT_RANGES,
        INT_ALIASES=INT_ALIASES,
        spec_hash=cat.spec_hash,
    )
    return env


def render_all(cat: Catalogue) -> dict[str, str]:
    """Every generated file, keyed by its path inside the package."""
    env = _environment(cat)
    out = {name: env.get_template(name + ".j2").render() for name in MODULES}
    fleet = cat.fleet
    if fleet is not None:
        local = {s.name for s in (*fleet.records, *fleet.shapes)} | {u.name for u in fleet.unions}
        for name in FLEET_MODULES:
            out[name] = env.get_template(name + ".j2").render(fleet=fleet, fleet_local=local)
    out["py.typed"] = ""
    for name, document in schemas.message_schemas(cat).items():
        out[f"schemas/{name}.json"] = json.dumps(document, indent=2, sort_keys=True) + "\n"
    return out


def _ruff_format(files: dict[str, str]) -> dict[str, str]:
    """Format the Python sources with ruff so generated diffs stay readable."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, text in files.items():
            if name.endswith(".py"):
                (root / name).write_text(text)
        subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--quiet", "--line-length", "100", str(root)],
            check=True,
        )
        return {
            name: (root / name).read_text() if name.endswith(".py") else text
            for name, text in files.items()
        }


def write(cat: Catalogue, out_dir: Path) -> list[str]:
    """Write the package; returns the relative paths written. Stale files are removed."""
    files = _ruff_format(render_all(cat))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for name, text in sorted(files.items()):
        path = out_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(files)
