"""Everything the protocol's tables name is in the generated tables, with the same numbers.

`tests/vectors/protocol-tables.yaml` is a record of those tables (messages and their
direction, frame flags, feature bits, error codes, retry classes) kept apart from
`spec/`, so a message, flag, feature or error code missing from the catalogue, or
carrying another number, fails a test by name.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

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

from ..support.paths import VECTORS

TABLES: dict[str, Any] = yaml.safe_load((VECTORS / "protocol-tables.yaml").read_text())


def test_every_message_of_the_index() -> None:
    facts: dict[str, str] = TABLES["messages"]
    assert len(facts) == 78
    assert set(facts) == set(MESSAGE_CLASSES)
    for name, direction in facts.items():
        expected = CLIENT_TO_BROKER if direction == "client_to_broker" else BROKER_TO_CLIENT
        assert name in expected, name
    assert (COUNTS["client_to_broker"], COUNTS["broker_to_client"]) == (38, 40)


def test_every_flag_bit() -> None:
    facts: dict[str, int] = TABLES["flags"]
    assert len(facts) == 15
    assert {f.name: int(f) for f in Flag} == facts
    assert KNOWN_FLAGS == 0x7FFF
    assert ORIGINAL_V1_FLAGS == 0x0007
    assert len(FLAG_INFO) == 15


def test_every_feature_bit() -> None:
    facts = {
        name: bit << 32 if word == "hi" else bit for name, (word, bit) in TABLES["features"].items()
    }
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
    codes: dict[str, list[Any]] = TABLES["error_codes"]
    assert len(codes) == 15
    for name, (number, default) in codes.items():
        code = ERROR_CODE_BY_NAME[name]
        assert int(code) == number
        assert code.default_retry.wire == default
    # Known to the official client beyond the protocol document's table.
    assert (ErrorCode.REVOKED, ErrorCode.STALE_WIDTH) == (16, 17)
    classes: dict[str, int] = TABLES["retry_classes"]
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
