"""The fleet catalogue (spec/fleet.yaml): etcd record shapes and broker-to-broker messages.

Read after the client catalogue, because its field types may name the client
catalogue's shapes and enums, and its `message_union` shapes embed client
messages whole. Validated like the client catalogue: first against
catalogue.schema.json (`fleet_file`), then cross-references the schema cannot
express (unknown types, unknown embedded messages, answers travelling the wrong
way, a keyspace value naming no record).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .model import SCALARS, Catalogue, Enum, JsonField, Shape, camel

DIRECTIONS = ("dialer_to_listener", "listener_to_dialer")


@dataclass(frozen=True)
class FleetMessage:
    name: str
    direction: str
    answered_by: tuple[str, ...]
    doc: str
    fields: tuple[JsonField, ...]

    @property
    def class_name(self) -> str:
        return camel(self.name)


@dataclass(frozen=True)
class MessageUnion:
    name: str
    doc: str
    messages: tuple[str, ...]  # client message names


@dataclass(frozen=True)
class KeyTemplate:
    name: str
    key: str
    value: str | None
    doc: str

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(p[1:-1] for p in self.key.split("/") if p.startswith("{"))


@dataclass(frozen=True)
class FleetCatalogue:
    spec_hash: str
    alpn: str
    doc: str
    limits: tuple[tuple[str, int, str], ...]
    rules: tuple[str, ...]
    keyspace: tuple[KeyTemplate, ...]
    enums: tuple[Enum, ...]
    records: tuple[Shape, ...]
    shapes: tuple[Shape, ...]  # structs
    unions: tuple[MessageUnion, ...]
    messages: tuple[FleetMessage, ...]
    # Client catalogue names the fleet types use (imported from .messages).
    client_imports: tuple[str, ...]


def fleet_hash(text: bytes, client_hash: str) -> str:
    digest = hashlib.sha256()
    digest.update(text)
    digest.update(client_hash.encode())
    return digest.hexdigest()


def _field(raw: dict[str, Any]) -> JsonField:
    from .load import _json_field  # one field reader for both catalogues

    return _json_field(raw)


def build_fleet(doc: dict[str, Any], client: Catalogue, spec_hash: str) -> FleetCatalogue:
    """Cross-check the (schema-valid) fleet document against the client catalogue."""
    problems: list[str] = []

    def check(ok: bool, where: str, what: str) -> None:
        if not ok:
            problems.append(f"fleet.yaml: {where}: {what}")

    client_messages = {m.name: m for m in client.messages}
    client_shapes = {s.name for s in client.shapes}
    client_enums = {e.name for e in client.enums}
    open_enums = {e.name for e in client.enums if e.open}

    enums = tuple(
        Enum(name, tuple(raw["values"]), False, raw.get("doc"), None)
        for name, raw in doc["enums"].items()
    )
    records = tuple(
        Shape(name=name, kind="struct", doc=raw["doc"], fields=tuple(map(_field, raw["fields"])))
        for name, raw in doc["records"].items()
    )
    shapes = []
    unions = []
    for name, raw in doc["shapes"].items():
        if raw["kind"] == "message_union":
            unions.append(MessageUnion(name, raw["doc"], tuple(raw["messages"])))
        else:
            shapes.append(
                Shape(
                    name=name,
                    kind="struct",
                    doc=raw["doc"],
                    one_of=raw.get("one_of", False),
                    fields=tuple(map(_field, raw["fields"])),
                )
            )
    local = [e.name for e in enums] + [r.name for r in records] + [s.name for s in shapes]
    local += [u.name for u in unions]
    for name in local:
        check(local.count(name) == 1, f"$.{name}", "defined twice")
        check(
            name not in client_shapes and name not in client_enums,
            f"$.{name}",
            "already a client catalogue type (name it differently)",
        )
    local_names = set(local)
    used_client: set[str] = set()

    def check_fields(fields: tuple[JsonField, ...], where: str) -> None:
        seen: set[str] = set()
        for k, fd in enumerate(fields):
            fw = f"{where}.fields[{k}]"
            check(fd.name not in seen, fw, f"duplicate field {fd.name}")
            seen.add(fd.name)
            check(fd.name != "type", fw, "'type' is the message tag")
            check(not fd.gate, fw, "peer fields are never gated (peers negotiate by hello)")
            name = fd.type.name
            if name in client_shapes or name in client_enums:
                if name not in open_enums:  # open enums are plain str in Python
                    used_client.add(name)
            else:
                check(name in SCALARS or name in local_names, fw, f"unknown type {name}")

    for rec in records:
        check_fields(rec.fields, f"$.records.{rec.name}")
    for s in shapes:
        check_fields(s.fields, f"$.shapes.{s.name}")
        if s.one_of:
            check(
                all(f.presence == "optional" for f in s.fields),
                f"$.shapes.{s.name}",
                "every field of a one_of shape is optional",
            )
    for u in unions:
        for name in u.messages:
            check(name in client_messages, f"$.shapes.{u.name}", f"unknown client message {name}")
            if name in client_messages:
                used_client.add(client_messages[name].class_name)
    messages = []
    for name, raw in doc["messages"].items():
        msg = FleetMessage(
            name=name,
            direction=raw["direction"],
            answered_by=tuple(raw.get("answered_by", ())),
            doc=raw["doc"],
            fields=tuple(map(_field, raw["fields"])),
        )
        where = f"$.messages.{name}"
        check_fields(msg.fields, where)
        check(
            camel(name) not in local_names,
            where,
            f"class name {camel(name)} clashes with a type",
        )
        for answer in msg.answered_by:
            other = doc["messages"].get(answer)
            check(other is not None, where, f"answered_by names unknown message {answer}")
            if other is not None:
                check(
                    other["direction"] != msg.direction,
                    where,
                    f"answer {answer} travels the same way as the request",
                )
        messages.append(msg)
    record_names = {r.name for r in records}
    keyspace = []
    for name, raw in doc["keyspace"].items():
        tpl = KeyTemplate(name, raw["key"], raw.get("value"), raw["doc"])
        if tpl.value is not None:
            check(tpl.value in record_names, f"$.keyspace.{name}", f"unknown record {tpl.value}")
        keyspace.append(tpl)
    if problems:
        from .load import CatalogueError

        raise CatalogueError("fleet catalogue cross-references are broken:\n" + "\n".join(problems))
    peer = doc["peer"]
    return FleetCatalogue(
        spec_hash=spec_hash,
        alpn=peer["alpn"],
        doc=peer["doc"],
        limits=tuple((k, v["value"], v["doc"]) for k, v in peer["limits"].items()),
        rules=tuple(peer["rules"]),
        keyspace=tuple(keyspace),
        enums=enums,
        records=records,
        shapes=tuple(shapes),
        unions=tuple(unions),
        messages=tuple(messages),
        client_imports=tuple(sorted(used_client)),
    )
