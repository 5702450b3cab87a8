"""The catalogue as typed objects: what the templates are rendered from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .requirements import Requirements

if TYPE_CHECKING:
    from .fleet import FleetCatalogue

# JSON wire scalar types and their integer ranges (inclusive).
INT_RANGES: dict[str, tuple[int, int]] = {
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "i64": (-(2**63), 2**63 - 1),
}
SCALARS = frozenset({*INT_RANGES, "bool", "str", "b64", "json"})

# Binary wire types: struct format for fixed-size ones, length width for the rest.
BINARY_FIXED: dict[str, tuple[str, int]] = {
    "u8": ("B", 1),
    "u16": ("H", 2),
    "u32": ("I", 4),
    "u64": ("Q", 8),
}
BINARY_VARIABLE: dict[str, tuple[str, int, bool]] = {
    # type: (length struct format, length size, is UTF-8 text)
    "str8": ("B", 1, True),
    "str16": ("H", 2, True),
    "bytes16": ("H", 2, False),
    "bytes32": ("I", 4, False),
}


def camel(name: str) -> str:
    """`cache_put` -> `CachePut`."""
    return "".join(part.capitalize() for part in name.split("_"))


@dataclass(frozen=True)
class TypeRef:
    """A JSON field type: a scalar, a named enum or shape, or a list of one."""

    name: str
    is_list: bool = False

    @classmethod
    def parse(cls, text: str) -> TypeRef:
        if text.startswith("list[") and text.endswith("]"):
            return cls(text[5:-1], True)
        return cls(text)


@dataclass(frozen=True)
class JsonField:
    name: str
    type: TypeRef
    presence: str  # required | optional | optional_null | nullable | default
    default: Any = None
    emit_default: bool = False
    gate: tuple[str, ...] = ()
    doc: str | None = None
    note: str | None = None

    @property
    def always_emitted(self) -> bool:
        """Fields written even when absent/at their default (null or the default value)."""
        return self.presence in ("optional_null", "nullable") or (
            self.presence == "default" and self.emit_default
        )


@dataclass(frozen=True)
class Message:
    name: str
    direction: str
    streams: tuple[str, ...]
    answered_by: tuple[str, ...]
    gate: tuple[str, ...]
    doc: str
    note: str | None
    fields: tuple[JsonField, ...]

    @property
    def class_name(self) -> str:
        return camel(self.name)


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # struct | union | tagged_union
    doc: str | None = None
    note: str | None = None
    fields: tuple[JsonField, ...] = ()
    one_of: bool = False
    literals: tuple[str, ...] = ()
    object: str | None = None
    tag_field: str | None = None
    variants: tuple[tuple[str, str], ...] = ()  # (tag value, shape name)


@dataclass(frozen=True)
class Enum:
    name: str
    values: tuple[str, ...]
    open: bool
    doc: str | None
    unknown_reads_as: str | None


@dataclass(frozen=True)
class Flag:
    name: str
    bit: int
    kind: str
    direction: str
    advertised_by: str
    doc: str
    layout: str | None = None
    modifies: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    original_v1: bool = False


@dataclass(frozen=True)
class BinaryField:
    name: str
    type: str
    list_name: str | None = None
    enum: str | None = None
    lenient: bool = False
    when: str | None = None
    empty_is_absent: bool = False
    zero_is_absent: bool = False
    doc: str | None = None
    note: str | None = None

    @property
    def absent_able(self) -> bool:
        return self.empty_is_absent or self.zero_is_absent

    @property
    def is_fixed(self) -> bool:
        return self.type in BINARY_FIXED

    @property
    def struct_char(self) -> str:
        return BINARY_FIXED[self.type][0]

    @property
    def size(self) -> int:
        return BINARY_FIXED[self.type][1]

    @property
    def len_char(self) -> str:
        return BINARY_VARIABLE[self.type][0]

    @property
    def len_size(self) -> int:
        return BINARY_VARIABLE[self.type][1]

    @property
    def is_text(self) -> bool:
        return BINARY_VARIABLE[self.type][2]

    @property
    def max_len(self) -> int:
        return (1 << (8 * self.len_size)) - 1


@dataclass(frozen=True)
class BinaryPart:
    fields: tuple[BinaryField, ...] = ()
    group: str | None = None
    when: str | None = None
    only_if: tuple[str, str] | None = None  # (field, enum member name)
    omit_when_zero: str | None = None
    records: tuple[BinaryField, ...] = ()  # item fields of a u32-counted list

    @property
    def is_records(self) -> bool:
        return bool(self.records)

    @property
    def required_fields(self) -> tuple[BinaryField, ...]:
        """Fields that must all be set for the group to be present."""
        return tuple(f for f in self.fields if not f.absent_able)


@dataclass(frozen=True)
class BinaryLayout:
    name: str
    flag: str
    flag_bit: int
    direction: str
    doc: str
    answered: str | None
    parts: tuple[BinaryPart, ...]
    modifiers: tuple[Flag, ...]
    legal_combinations: tuple[int, ...]

    @property
    def class_name(self) -> str:
        # "Frame" keeps binary layouts apart from JSON messages of the same name
        # (binary publish_batch vs the JSON publish_batch message).
        return camel(self.name) + "Frame"

    @property
    def scalar_fields(self) -> tuple[BinaryField, ...]:
        return tuple(f for p in self.parts for f in p.fields)

    @property
    def records_part(self) -> BinaryPart | None:
        return next((p for p in self.parts if p.is_records), None)


@dataclass(frozen=True)
class BinaryEnum:
    name: str
    values: tuple[tuple[str, int], ...]
    doc: str | None
    unknown_reads_as: str | None


@dataclass(frozen=True)
class RetryClass:
    name: str
    byte: int
    applied: str
    doc: str


@dataclass(frozen=True)
class ErrorCode:
    name: str
    number: int
    default_retry: str
    doc: str | None
    note: str | None
    source: str | None
    detail_reasons: tuple[str, ...]

    @property
    def class_name(self) -> str:
        return camel(self.name) + "Error"


@dataclass(frozen=True)
class Feature:
    name: str
    bit: int | None
    direction: str
    gates: str
    also_advertised_by_broker: bool
    also_offered_by_client: bool
    availability: str | None
    source: str | None
    note: str | None

    @property
    def value(self) -> int | None:
        return None if self.bit is None else 1 << self.bit


@dataclass(frozen=True)
class NameRule:
    """The one rule for tenant, namespace, stream, cache and group names."""

    doc: str
    kinds: tuple[str, ...]
    alphabet: str
    min_length: int
    max_length: int
    reserved: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def pattern(self) -> str:
        """The whole-name regular expression (ASCII; matched with fullmatch)."""
        return f"[{self.alphabet}]{{{self.min_length},{self.max_length}}}"


@dataclass(frozen=True)
class Decision:
    id: str
    topic: str
    choice: str
    why: str


@dataclass(frozen=True)
class Catalogue:
    spec_hash: str
    frame: dict[str, Any]
    flags: tuple[Flag, ...]
    flag_sets: dict[str, tuple[str, ...]]
    layouts: tuple[BinaryLayout, ...]
    binary_enums: tuple[BinaryEnum, ...]
    enums: tuple[Enum, ...]
    shapes: tuple[Shape, ...]
    retry_classes: tuple[RetryClass, ...]
    error_codes: tuple[ErrorCode, ...]
    error_code_unknown_name: str
    routing: dict[str, Any]
    names: NameRule
    decisions: tuple[Decision, ...]
    messages: tuple[Message, ...]
    features: tuple[Feature, ...]
    marker: dict[str, Any]
    negotiation: dict[str, Any]
    tagged_variant_of: dict[str, tuple[str, str]] = field(default_factory=dict)
    requirements: Requirements | None = None
    fleet: FleetCatalogue | None = None

    def flag(self, name: str) -> Flag:
        return next(f for f in self.flags if f.name == name)

    def feature(self, name: str) -> Feature:
        return next(f for f in self.features if f.name == name)

    def shape(self, name: str) -> Shape:
        return next(s for s in self.shapes if s.name == name)

    def enum(self, name: str) -> Enum | None:
        return next((e for e in self.enums if e.name == name), None)

    def gate_masks(self, gate: tuple[str, ...]) -> tuple[int, int]:
        """(flag mask, feature mask) a peer must have for a gate."""
        flags = features = 0
        for name in gate:
            if name == self.marker["name"]:
                features |= 1 << self.marker["bit"]
            elif name.startswith("FEATURE_"):
                value = self.feature(name).value
                # A feature without a known bit can never be negotiated: a gate on it
                # is unsatisfiable, which the generated code expresses as bit 63+1.
                features |= value if value is not None else 1 << 64
            else:
                flags |= self.flag(name).bit
        return flags, features
