"""Read, validate and cross-check the catalogue.

Validation happens in two steps so that every mistake names its place:
1. each YAML file against its part of spec/catalogue.schema.json (shape, spelling,
   allowed values) - errors carry the JSON path of the offending entry;
2. cross-references the schema cannot express (a gate naming a flag that does not
   exist, a field type naming an unknown shape, an answer naming an unknown message,
   a legal flag combination the flag rules forbid, ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema
import yaml

from .fleet import FleetCatalogue, build_fleet, fleet_hash
from .model import (
    SCALARS,
    BinaryEnum,
    BinaryField,
    BinaryLayout,
    BinaryPart,
    Catalogue,
    Decision,
    Enum,
    ErrorCode,
    Feature,
    Flag,
    JsonField,
    Message,
    NameRule,
    RetryClass,
    Shape,
    TypeRef,
)
from .requirements import RequirementsError, load_requirements


class CatalogueError(Exception):
    """The catalogue is invalid; the message names the file and the exact path."""


def _path(parts: Any) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _validate(document: Any, schema: dict[str, Any], definition: str, filename: str) -> None:
    sub_schema = {"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]}
    validator = jsonschema.Draft202012Validator(sub_schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{filename}: {_path(e.absolute_path)}: {e.message}" for e in errors[:20]]
        raise CatalogueError("catalogue does not match its schema:\n" + "\n".join(lines))


def _load_fleet(spec_dir: Path, client_schema: dict[str, Any], cat: Catalogue) -> FleetCatalogue:
    """spec/fleet.yaml, validated by spec/fleet.schema.json (which borrows the client
    catalogue schema's field shapes by reference)."""
    fleet_schema = json.loads((spec_dir / "fleet.schema.json").read_text())
    text = (spec_dir / "fleet.yaml").read_bytes()
    document = yaml.safe_load(text)
    draft = referencing.jsonschema.DRAFT202012
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(
        [(doc["$id"], draft.create_resource(doc)) for doc in (client_schema, fleet_schema)]
    )
    validator = jsonschema.Draft202012Validator(fleet_schema, registry=registry)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"fleet.yaml: {_path(e.absolute_path)}: {e.message}" for e in errors[:20]]
        raise CatalogueError("catalogue does not match its schema:\n" + "\n".join(lines))
    digest = hashlib.sha256(text)
    digest.update(json.dumps(fleet_schema, sort_keys=True).encode())
    return build_fleet(document, cat, fleet_hash(digest.hexdigest().encode(), cat.spec_hash))


def _json_field(raw: dict[str, Any]) -> JsonField:
    return JsonField(
        name=raw["name"],
        type=TypeRef.parse(raw["type"]),
        presence=raw["presence"],
        default=raw.get("default"),
        emit_default=raw.get("emit_default", False),
        gate=tuple(raw.get("gate", ())),
        doc=raw.get("doc"),
        note=raw.get("note"),
    )


def _binary_field(raw: dict[str, Any]) -> BinaryField:
    return BinaryField(
        name=raw["name"],
        type=raw["type"],
        list_name=raw.get("list_name"),
        enum=raw.get("enum"),
        lenient=raw.get("lenient", False),
        when=raw.get("when"),
        empty_is_absent=raw.get("empty_is_absent", False),
        zero_is_absent=raw.get("zero_is_absent", False),
        doc=raw.get("doc"),
        note=raw.get("note"),
    )


def _legal_combinations(layout_flag: Flag, modifiers: list[Flag]) -> list[int]:
    """Every flag value the rules allow for one layout: its bit plus any subset of its
    modifiers whose `requires` are all present and whose `excludes` are all absent."""
    legal = []
    for size in range(len(modifiers) + 1):
        for subset in itertools.combinations(modifiers, size):
            names = {m.name for m in subset}
            if all(set(m.requires) <= names and not (set(m.excludes) & names) for m in subset):
                legal.append(layout_flag.bit | sum(m.bit for m in subset))
    return sorted(legal)


def load(spec_dir: Path) -> Catalogue:
    schema = json.loads((spec_dir / "catalogue.schema.json").read_text())
    texts = {name: (spec_dir / f"{name}.yaml").read_bytes() for name in ("messages", "features")}
    docs = {name: yaml.safe_load(text) for name, text in texts.items()}
    _validate(docs["messages"], schema, "messages_file", "messages.yaml")
    _validate(docs["features"], schema, "features_file", "features.yaml")
    digest = hashlib.sha256()
    for name in ("messages", "features"):
        digest.update(texts[name])
    digest.update(json.dumps(schema, sort_keys=True).encode())
    cat = _build(docs["messages"], docs["features"], digest.hexdigest())
    fleet = _load_fleet(spec_dir, schema, cat)
    cat = dataclasses.replace(cat, fleet=fleet)
    try:
        requirements = load_requirements(spec_dir, (d.id for d in cat.decisions))
    except RequirementsError as exc:
        raise CatalogueError(str(exc)) from exc
    return dataclasses.replace(cat, requirements=requirements)


def _build(m: dict[str, Any], f: dict[str, Any], spec_hash: str) -> Catalogue:
    problems: list[str] = []

    def check(ok: bool, where: str, what: str) -> None:
        if not ok:
            problems.append(f"{where}: {what}")

    flags = tuple(
        Flag(
            name=r["name"],
            bit=r["bit"],
            kind=r["kind"],
            direction=r["direction"],
            advertised_by=r["advertised_by"],
            doc=r["doc"],
            layout=r.get("layout"),
            modifies=tuple(r.get("modifies", ())),
            requires=tuple(r.get("requires", ())),
            excludes=tuple(r.get("excludes", ())),
            original_v1=r.get("original_v1", False),
        )
        for r in m["flags"]
    )
    flag_names = {fl.name for fl in flags}
    bits = [fl.bit for fl in flags]
    check(len(set(bits)) == len(bits), "messages.yaml: $.flags", "duplicate flag bit")
    for i, fl in enumerate(flags):
        where = f"messages.yaml: $.flags[{i}]"
        check(fl.bit & (fl.bit - 1) == 0, where, f"bit {fl.bit:#06x} is not a single bit")
        for ref in (*fl.modifies, *fl.requires, *fl.excludes):
            check(ref in flag_names, where, f"names unknown flag {ref}")
        if fl.kind == "layout":
            check(fl.layout in m["binary_layouts"], where, f"layout {fl.layout} is not defined")
    flag_sets = {name: tuple(v["flags"]) for name, v in m["flag_sets"].items()}
    for name, members in flag_sets.items():
        for ref in members:
            check(ref in flag_names, f"messages.yaml: $.flag_sets.{name}", f"unknown flag {ref}")
    check(
        set(flag_sets.get("ORIGINAL_V1_FLAGS", ())) == {fl.name for fl in flags if fl.original_v1},
        "messages.yaml: $.flag_sets.ORIGINAL_V1_FLAGS",
        "must list exactly the flags marked original_v1",
    )

    features = tuple(
        Feature(
            name=r["name"],
            bit=r["bit"],
            direction=r["direction"],
            gates=r["gates"],
            also_advertised_by_broker=r.get("also_advertised_by_broker", False),
            also_offered_by_client=r.get("also_offered_by_client", False),
            availability=r.get("availability"),
            source=r.get("source"),
            note=r.get("note"),
        )
        for r in f["features"]
    )
    feature_bits = [ft.bit for ft in features if ft.bit is not None]
    check(len(set(feature_bits)) == len(feature_bits), "features.yaml: $.features", "duplicate bit")
    feature_names = {ft.name for ft in features} | {f["marker"]["name"]}
    gate_names = flag_names | feature_names

    binary_enums = tuple(
        BinaryEnum(
            name=name,
            values=tuple(raw["values"].items()),
            doc=raw.get("doc"),
            unknown_reads_as=raw.get("unknown_reads_as"),
        )
        for name, raw in m["binary_enums"].items()
    )
    retry_classes = tuple(
        RetryClass(name=r["name"], byte=r["byte"], applied=r["applied"], doc=r["doc"])
        for r in m["retry_classes"]
    )
    retry_names = {rc.name for rc in retry_classes}
    binary_enum_names = {be.name for be in binary_enums} | {"RetryClass"}

    layouts = []
    for name, raw in m["binary_layouts"].items():
        where = f"messages.yaml: $.binary_layouts.{name}"
        check(raw["flag"] in flag_names, where, f"unknown flag {raw['flag']}")
        layout_flag = next((fl for fl in flags if fl.name == raw["flag"]), None)
        if layout_flag is None:
            continue
        check(layout_flag.layout == name, where, f"flag {raw['flag']} selects {layout_flag.layout}")
        modifiers = [fl for fl in flags if raw["flag"] in fl.modifies]
        parts = []
        for j, p in enumerate(raw["parts"]):
            pw = f"{where}.parts[{j}]"
            only_if = (p["only_if"]["field"], p["only_if"]["value"]) if "only_if" in p else None
            part = BinaryPart(
                fields=tuple(_binary_field(x) for x in p.get("fields", ())),
                group=p.get("group"),
                when=p.get("when"),
                only_if=only_if,
                omit_when_zero=p.get("omit_when_zero"),
                records=tuple(_binary_field(x) for x in p.get("records", {}).get("items", ())),
            )
            if part.when:
                check(
                    part.when in {mo.name for mo in modifiers},
                    pw,
                    f"{part.when} does not modify {raw['flag']}",
                )
            for bf in (*part.fields, *part.records):
                if bf.enum:
                    check(bf.enum in binary_enum_names, pw, f"unknown binary enum {bf.enum}")
                if bf.when:
                    check(
                        bf.when in {mo.name for mo in modifiers},
                        pw,
                        f"{bf.when} does not modify {raw['flag']}",
                    )
            if part.records:
                check(
                    part.records[-1].type == "bytes32",
                    pw,
                    "a record item ends with its bytes32 payload",
                )
                for bf in part.records:
                    check(bf.list_name is not None, pw, f"record item {bf.name} needs a list_name")
            if part.group:
                check(bool(part.fields), pw, "a conditional group holds fields")
            parts.append(part)
        check(sum(1 for p in parts if p.is_records) <= 1, where, "at most one records part")
        check(not parts or not any(p.is_records for p in parts[:-1]), where, "records come last")
        legal = _legal_combinations(layout_flag, modifiers)
        if "legal_flag_combinations" in raw:
            listed = sorted(raw["legal_flag_combinations"])
            check(
                listed == legal,
                where,
                f"legal_flag_combinations {[hex(x) for x in listed]} disagree with the flag rules "
                f"{[hex(x) for x in legal]}",
            )
        layouts.append(
            BinaryLayout(
                name=name,
                flag=raw["flag"],
                flag_bit=layout_flag.bit,
                direction=raw["direction"],
                doc=raw["doc"],
                answered=raw.get("answered"),
                parts=tuple(parts),
                modifiers=tuple(modifiers),
                legal_combinations=tuple(legal),
            )
        )
        check(raw["direction"] == layout_flag.direction, where, "direction differs from its flag's")

    enums = []
    for name, raw in m["enums"].items():
        if "values_from" in raw:
            source = m[raw["values_from"]]
            values = tuple(x["name"] for x in source)
        else:
            values = tuple(raw["values"])
        enums.append(
            Enum(name, values, raw.get("open", False), raw.get("doc"), raw.get("unknown_reads_as"))
        )
    enum_names = {e.name for e in enums}

    shapes = []
    tagged_variant_of: dict[str, tuple[str, str]] = {}
    for name, raw in m["shapes"].items():
        shapes.append(
            Shape(
                name=name,
                kind=raw["kind"],
                doc=raw.get("doc"),
                note=raw.get("note"),
                fields=tuple(_json_field(x) for x in raw.get("fields", ())),
                one_of=raw.get("one_of", False),
                literals=tuple(raw.get("literals", ())),
                object=raw.get("object"),
                tag_field=raw.get("tag_field"),
                variants=tuple(raw.get("variants", {}).items()),
            )
        )
        for tag, variant in raw.get("variants", {}).items():
            tagged_variant_of[variant] = (raw["tag_field"], tag)
    shape_names = {s.name for s in shapes}
    type_names = SCALARS | enum_names | shape_names

    def check_fields(fields: tuple[JsonField, ...], where: str) -> None:
        seen = set()
        for k, fd in enumerate(fields):
            fw = f"{where}.fields[{k}]"
            check(fd.name not in seen, fw, f"duplicate field {fd.name}")
            seen.add(fd.name)
            check(fd.type.name in type_names, fw, f"unknown type {fd.type.name}")
            check(fd.name != "type", fw, "'type' is the message tag")
            for g in fd.gate:
                check(g in gate_names, fw, f"gate names unknown flag/feature {g}")

    for s in shapes:
        where = f"messages.yaml: $.shapes.{s.name}"
        check_fields(s.fields, where)
        if s.object:
            check(s.object in shape_names, where, f"unknown object shape {s.object}")
        for _tag, variant in s.variants:
            check(variant in shape_names, where, f"unknown variant shape {variant}")

    messages = []
    for name, raw in m["messages"].items():
        where = f"messages.yaml: $.messages.{name}"
        msg = Message(
            name=name,
            direction=raw["direction"],
            streams=tuple(raw["streams"]),
            answered_by=tuple(raw.get("answered_by", ())),
            gate=tuple(raw.get("gate", ())),
            doc=raw["doc"],
            note=raw.get("note"),
            fields=tuple(_json_field(x) for x in raw["fields"]),
        )
        check_fields(msg.fields, where)
        for g in msg.gate:
            check(g in gate_names, where, f"gate names unknown flag/feature {g}")
        for answer in msg.answered_by:
            check(answer in m["messages"], where, f"answered_by names unknown message {answer}")
            if answer in m["messages"]:
                check(
                    m["messages"][answer]["direction"] != msg.direction,
                    where,
                    f"answer {answer} travels the same way as the request",
                )
        messages.append(msg)

    error_codes = tuple(
        ErrorCode(
            name=r["name"],
            number=r["number"],
            default_retry=r["default_retry"],
            doc=r.get("doc"),
            note=r.get("note"),
            source=r.get("source"),
            detail_reasons=tuple(r.get("detail_reasons", ())),
        )
        for r in m["error_codes"]
    )
    for i, ec in enumerate(error_codes):
        check(
            ec.default_retry in retry_names,
            f"messages.yaml: $.error_codes[{i}]",
            "unknown retry class",
        )
    numbers = [ec.number for ec in error_codes]
    check(len(set(numbers)) == len(numbers), "messages.yaml: $.error_codes", "duplicate number")

    raw_names = m["names"]
    names = NameRule(
        doc=raw_names["doc"],
        kinds=tuple(raw_names["kinds"]),
        alphabet=raw_names["alphabet"],
        min_length=raw_names["min_length"],
        max_length=raw_names["max_length"],
        reserved=tuple(raw_names["reserved"]),
        notes=tuple(raw_names.get("notes", ())),
    )
    check(
        names.min_length <= names.max_length,
        "messages.yaml: $.names",
        "min_length is above max_length",
    )
    for sep in ("/", "\\", "\0"):
        check(
            re.fullmatch(names.pattern, sep * names.min_length) is None,
            "messages.yaml: $.names.alphabet",
            f"admits the path-unsafe character {sep!r}",
        )
    decisions = tuple(Decision(**d) for d in m["decisions"])
    decision_ids = {d.id for d in decisions}
    all_notes = [fd.note for msg in messages for fd in msg.fields] + [msg.note for msg in messages]
    all_notes += [ft.note for ft in features]
    for note in all_notes:
        if note and note.startswith("decision "):
            ref = note.split()[1].rstrip(":")
            check(ref in decision_ids, "note", f"refers to unknown decision {ref}")

    if problems:
        raise CatalogueError("catalogue cross-references are broken:\n" + "\n".join(problems))

    return Catalogue(
        spec_hash=spec_hash,
        frame=m["frame"],
        flags=flags,
        flag_sets=flag_sets,
        layouts=tuple(layouts),
        binary_enums=binary_enums,
        enums=tuple(enums),
        shapes=tuple(shapes),
        retry_classes=retry_classes,
        error_codes=error_codes,
        error_code_unknown_name=m["error_code_unknown_name"],
        routing=m["routing"],
        names=names,
        decisions=decisions,
        messages=tuple(messages),
        features=features,
        marker=f["marker"],
        negotiation=f["negotiation"],
        tagged_variant_of=tagged_variant_of,
    )
