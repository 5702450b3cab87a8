"""JSON Schema documents per message, derived from the catalogue.

For people writing other implementations: one self-contained Draft 2020-12
schema per message type, with the catalogue's presence rules (required fields,
null where the protocol writes null), integer ranges and shared shapes under
`$defs`. Gates and notes ride along as `description` text.
"""

from __future__ import annotations

from typing import Any

from .model import INT_RANGES, Catalogue, JsonField, Shape, TypeRef


def _scalar(name: str) -> dict[str, Any]:
    if name in INT_RANGES:
        lo, hi = INT_RANGES[name]
        return {"type": "integer", "minimum": lo, "maximum": hi}
    if name == "bool":
        return {"type": "boolean"}
    if name == "str":
        return {"type": "string"}
    if name == "b64":
        return {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
        }
    return {}  # json: any value


class _Builder:
    def __init__(self, cat: Catalogue) -> None:
        self.cat = cat
        self.shapes = {s.name: s for s in cat.shapes}
        self.enums = {e.name: e for e in cat.enums}
        self.defs: dict[str, Any] = {}

    def type_schema(self, ref: TypeRef) -> dict[str, Any]:
        if ref.name in self.shapes:
            self.define(self.shapes[ref.name])
            item: dict[str, Any] = {"$ref": f"#/$defs/{ref.name}"}
        elif ref.name in self.enums:
            enum = self.enums[ref.name]
            item = {"type": "string"} if enum.open else {"enum": list(enum.values)}
        else:
            item = _scalar(ref.name)
        return {"type": "array", "items": item} if ref.is_list else item

    def field_schema(self, fd: JsonField) -> dict[str, Any]:
        schema = self.type_schema(fd.type)
        if fd.presence in ("optional", "optional_null", "nullable"):
            schema = {"anyOf": [schema, {"type": "null"}]}
        if fd.presence == "default":
            schema = {**schema, "default": fd.default}
        text = " ".join(
            x
            for x in (
                fd.doc,
                f"Sent only when the peer announced {', '.join(fd.gate)}." if fd.gate else None,
                f"Note: {fd.note}." if fd.note else None,
            )
            if x
        )
        if text:
            schema = {**schema, "description": text}
        return schema

    def object_schema(
        self, fields: tuple[JsonField, ...], tag: tuple[str, str] | None
    ) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        if tag:
            properties[tag[0]] = {"const": tag[1]}
            required.append(tag[0])
        for fd in fields:
            properties[fd.name] = self.field_schema(fd)
            if fd.presence == "required":
                required.append(fd.name)
        return {"type": "object", "properties": properties, "required": required}

    def define(self, shape: Shape) -> None:
        if shape.name in self.defs:
            return
        self.defs[shape.name] = {}  # placeholder against recursion
        if shape.kind == "struct":
            tag = self.cat.tagged_variant_of.get(shape.name)
            schema = self.object_schema(shape.fields, tag)
            if shape.one_of:
                schema["minProperties"] = 1
                schema["maxProperties"] = 1
        elif shape.kind == "union":
            self.define(self.shapes[shape.object or ""])
            schema = {
                "anyOf": [{"enum": list(shape.literals)}, {"$ref": f"#/$defs/{shape.object}"}]
            }
        else:
            for _tag, variant in shape.variants:
                self.define(self.shapes[variant])
            schema = {"oneOf": [{"$ref": f"#/$defs/{v}"} for _t, v in shape.variants]}
        if shape.doc:
            schema["description"] = shape.doc
        self.defs[shape.name] = schema


def message_schemas(cat: Catalogue) -> dict[str, dict[str, Any]]:
    out = {}
    for msg in cat.messages:
        builder = _Builder(cat)
        schema: dict[str, Any] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"felix-wire/{msg.name}.json",
            "title": msg.name,
            "description": f"{msg.doc} Direction: {msg.direction}."
            + (f" Gate: {', '.join(msg.gate)}." if msg.gate else ""),
        }
        schema.update(builder.object_schema(msg.fields, ("type", msg.name)))
        if builder.defs:
            schema["$defs"] = builder.defs
        out[msg.name] = schema
    return out
