"""Everything the facts file names is in the generated tables, with the same numbers.

The facts file (shared/reference/protocol-facts.md) is parsed here, so a message,
flag, feature or error code missing from the catalogue fails a test by name.
"""

from __future__ import annotations

import re

import pytest

from felix_wire.catalogue import COUNTS, DECISIONS
from felix_wire.errors import ERROR_CODE_BY_NAME, ErrorCode, RetryClass
from felix_wire.features import (
    FEATURE_EXTENDED,
    FEATURE_INFO,
    KNOWN_FEATURES_HI,
    KNOWN_FEATURES_LO,
    Feature,
)
from felix_wire.flags import FLAG_INFO, KNOWN_FLAGS, ORIGINAL_V1_FLAGS, Flag
from felix_wire.messages import BROKER_TO_CLIENT, CLIENT_TO_BROKER, MESSAGE_CLASSES

from ..conftest import SHARED

FACTS = (SHARED / "reference" / "protocol-facts.md").read_text()


def _section(title: str) -> str:
    start = FACTS.index(title)
    end = FACTS.index("\n## ", start + 1)
    return FACTS[start:end]


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def test_every_message_of_the_facts_index() -> None:
    index = FACTS[FACTS.index("### 5.0 Index") : FACTS.index("Request-id rules")]
    facts = {row[0].strip("`"): row[1] for row in _rows(index)}
    assert len(facts) == 78
    assert set(facts) == set(MESSAGE_CLASSES)
    for name, direction in facts.items():
        expected = CLIENT_TO_BROKER if direction.startswith("C") else BROKER_TO_CLIENT
        assert name in expected, name
    assert (COUNTS["client_to_broker"], COUNTS["broker_to_client"]) == (38, 40)


def test_every_flag_bit() -> None:
    rows = _rows(_section("### 2.1 Frame flag bits"))
    facts = {
        row[1].strip("`"): int(row[0].strip("`"), 16)
        for row in rows
        if re.fullmatch(r"`0x[0-9A-F]{4}`", row[0])
    }
    assert len(facts) == 15
    assert {f.name: int(f) for f in Flag} == facts
    assert KNOWN_FLAGS == 0x7FFF
    assert ORIGINAL_V1_FLAGS == 0x0007
    assert len(FLAG_INFO) == 15


def test_every_feature_bit() -> None:
    rows = _rows(_section("### 6.3 Feature bits"))
    facts: dict[str, int] = {}
    for row in rows:
        name = row[1].strip("`")
        bit = row[0].strip("`")
        hi = re.match(r"_hi (0x[0-9a-fA-F]+)", bit)
        if hi:
            facts[name] = int(hi.group(1), 16) << 32
        elif bit.startswith("0x"):
            facts[name] = int(bit.replace("_", ""), 16)
    facts.pop("FEATURE_EXTENDED")
    assert len(facts) == 32  # 31 low-word features + FEATURE_INSPECT
    for name, value in facts.items():
        assert FEATURE_INFO[name].value == value, name
    assert FEATURE_EXTENDED == 0x8000_0000
    assert KNOWN_FEATURES_LO & 0x7FFF_FFFF == 0x7FFF_FFFF
    # Seed-only features are catalogued: publish_width with the bit the official client
    # uses (decision publish-width), stream_deleted without a value (never negotiated).
    assert FEATURE_INFO["FEATURE_PUBLISH_WIDTH"].value == 0x4 << 32
    assert FEATURE_INFO["FEATURE_STREAM_DELETED"].value is None
    assert KNOWN_FEATURES_HI == 0xF
    assert Feature.FEATURE_INSPECT == 1 << 32


def test_every_error_code_and_retry_class() -> None:
    section = _section("## 8. Error codes")
    retry_names = {r.wire for r in RetryClass}
    codes = {
        row[0].strip("`"): (int(row[1]), row[2])
        for row in _rows(section)
        if row[1].strip().isdigit() and row[2] in retry_names
    }
    assert len(codes) == 15
    for name, (number, default) in codes.items():
        code = ERROR_CODE_BY_NAME[name]
        assert int(code) == number
        assert code.default_retry.wire == default
    # Known to the official client beyond the protocol document's table.
    assert (ErrorCode.REVOKED, ErrorCode.STALE_WIDTH) == (16, 17)
    classes = {
        row[0].strip("`"): int(row[1]) for row in _rows(section) if row[0].strip("`") in retry_names
    }
    assert classes == {r.wire: int(r) for r in RetryClass}
    assert len(classes) == 5


@pytest.mark.parametrize(
    "decision",
    [
        "cache-put-answer",
        "acked-json-publish-answer",
        "cache-get-request-id-type",
        "publish-error-detail-null",
        "subscribed-offsets",
        "ack-default",
        "unknown-type-without-unsupported",
        "group-poll-wait-ms",
        "cache-put-if-ttl",
        "group-discard-redrive-answer",
        "group-info-widths",
        "subscription-id-on-requests",
        "publish-width",
        "stream-deleted",
    ],
)
def test_section_14_choices_are_recorded_as_data(decision: str) -> None:
    assert DECISIONS[decision].choice
