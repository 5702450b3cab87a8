"""Round trips of the fleet catalogue (spec/fleet.yaml): every peer message in a frame,
every etcd record, and the etcd key spellings.

Parametrized over the generated tables, so a message or record added to the fleet
catalogue gets its property test by regeneration alone.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_wire import FrameReader
from felix_wire.fleet import (
    PEER_MESSAGE_CLASSES,
    RECORD_CLASSES,
    Assignment,
    AssignmentState,
    ForwardRefusal,
    LeaderHint,
    Member,
    StaleRoute,
    assignments_key,
    decode_assignment,
    decode_drain,
    decode_finalizedfeature,
    decode_member,
    decode_movecopied,
    decode_peer_message,
    decode_promotionrefusal,
    encode_peer_message,
    encode_record,
    members_key,
    parse_assignments_key,
    parse_members_key,
    placer_key,
)
from felix_wire.fleet_strategies import PEER_MESSAGE_STRATEGIES, RECORD_STRATEGIES
from felix_wire.frame import HEADER_SIZE, frame_bytes
from felix_wire.messages import CacheGet, Unknown
from felix_wire.wire_errors import MalformedJsonError, MessageFieldError

DECODE_RECORD = {
    "Member": decode_member,
    "Assignment": decode_assignment,
    "Drain": decode_drain,
    "FinalizedFeature": decode_finalizedfeature,
    "MoveCopied": decode_movecopied,
    "PromotionRefusal": decode_promotionrefusal,
}


@pytest.mark.parametrize("message_type", sorted(PEER_MESSAGE_CLASSES))
def test_peer_message_round_trip(message_type: str) -> None:
    @given(PEER_MESSAGE_STRATEGIES[message_type])
    def check(message: Any) -> None:
        payload = encode_peer_message(message)
        assert payload.startswith(b'{"type":"' + message_type.encode() + b'"')
        assert decode_peer_message(payload) == message
        frame = frame_bytes(0, payload)
        (read,) = FrameReader().feed(frame)
        assert decode_peer_message(frame[HEADER_SIZE:]) == message
        assert read.payload == payload

    check()


@pytest.mark.parametrize("record", sorted(RECORD_CLASSES))
def test_record_round_trip(record: str) -> None:
    @given(RECORD_STRATEGIES[record])
    def check(value: Any) -> None:
        assert DECODE_RECORD[record](encode_record(value)) == value

    check()


def test_every_record_has_a_decoder() -> None:
    assert set(DECODE_RECORD) == set(RECORD_CLASSES)


def test_a_forwarded_cache_op_carries_the_client_request_whole() -> None:
    from felix_wire.fleet import ForwardCacheOp

    op = CacheGet(tenant_id="t", namespace="n", cache="c", key="k", request_id=7)
    message = ForwardCacheOp(
        request_id=1, token="tok", client_flags=1, client_features=2, shard=0, generation=3, op=op
    )
    payload = encode_peer_message(message)
    assert b'"op":{"type":"cache_get","tenant_id":"t"' in payload
    decoded = decode_peer_message(payload)
    assert isinstance(decoded, ForwardCacheOp) and decoded.op == op


def test_a_refusal_holds_exactly_one_reason() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ForwardRefusal()
    hint = LeaderHint(node_id="b", generation=1)
    with pytest.raises(ValueError, match="exactly one"):
        ForwardRefusal(not_leader=hint, stale_route=StaleRoute(generation=2))
    with pytest.raises(msgspec.ValidationError, match="exactly one"):
        msgspec.json.decode(b"{}", type=ForwardRefusal)


def test_unknown_peer_types_and_bad_fields_are_told_apart() -> None:
    unknown = decode_peer_message(b'{"type":"replicate","request_id":4}')
    assert unknown == Unknown("replicate", {"type": "replicate", "request_id": 4}, 4)
    with pytest.raises(MessageFieldError) as info:
        decode_peer_message(b'{"type":"hello","node_id":7,"features":[]}')
    assert info.value.field == "node_id"
    with pytest.raises(MalformedJsonError):
        decode_peer_message(b'{"type":')


def test_records_refuse_bad_values_with_the_field() -> None:
    with pytest.raises(MessageFieldError) as info:
        decode_assignment(b'{"replicas":[],"state":"asleep"}')
    assert info.value.field == "state"
    with pytest.raises(MessageFieldError):
        decode_member(
            b'{"node_id":"a","client_addr":"","peer_addr":"x:1","features":[],'
            b'"incarnation":18446744073709551616}'
        )
    assert decode_assignment(b'{"replicas":[],"state":"active","leader":"a"}') == Assignment(
        leader="a", replicas=[], state=AssignmentState.ACTIVE
    )


def test_absent_optional_fields_are_omitted() -> None:
    value = encode_record(Assignment(replicas=[], state=AssignmentState.UNAVAILABLE))
    assert value == b'{"replicas":[],"state":"unavailable"}'
    member = Member(node_id="a", client_addr="", peer_addr="h:1", features=[], incarnation=1)
    assert b"null" not in encode_record(member)


@given(
    st.sampled_from(["stream", "cache"]),
    st.text(st.characters(blacklist_characters="/"), min_size=1, max_size=8),
    st.text(st.characters(blacklist_characters="/"), min_size=1, max_size=8),
    st.text(st.characters(blacklist_characters="/"), min_size=1, max_size=8),
    st.integers(0, 2**32 - 1),
)
def test_assignment_keys_round_trip(kind: str, tenant: str, ns: str, name: str, shard: int) -> None:
    key = assignments_key("/felix", kind=kind, tenant=tenant, namespace=ns, name=name, shard=shard)
    assert parse_assignments_key("/felix", key) == (kind, tenant, ns, name, shard)
    assert parse_members_key("/felix", key) is None


def test_key_spellings() -> None:
    assert members_key("/felix/", node_id="b1") == "/felix/members/b1"
    assert parse_members_key("/felix", "/felix/members/b1") == ("b1",)
    assert parse_members_key("/felix", "/other/members/b1") is None
    assert parse_members_key("/felix", "/felix/members/b1/x") is None
    assert placer_key("/felix") == "/felix/placer"
    assert parse_assignments_key("/felix", "/felix/assignments/stream/t/n/s/x") is None
    with pytest.raises(ValueError, match="key part"):
        members_key("/felix", node_id="a/b")
    with pytest.raises(ValueError, match="key part"):
        assignments_key("/felix", kind="stream", tenant="", namespace="n", name="s", shard=0)
