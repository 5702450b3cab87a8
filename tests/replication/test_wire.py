"""The core's peer messages survive the catalogued wire shape unchanged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from felix_broker.replication.core import (
    Entry,
    Fence,
    FenceOk,
    FenceRefused,
    Message,
    Ship,
    ShipOk,
    ShipRefusal,
    ShipRefused,
)
from felix_broker.replication.wire import REPLICATION_MESSAGE_TYPES, from_wire, to_wire
from felix_common.fleet import ShardId, ShardKind
from felix_wire.fleet import decode_peer_message, encode_peer_message

u64 = st.integers(min_value=0, max_value=2**64 - 1)
node = st.sampled_from(["b1", "b2", "b3"])
entry = st.builds(Entry, u64, st.binary(max_size=64), st.booleans())
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Ship, u64, node, u64, u64, st.tuples(entry, entry) | st.just(()), u64, u64),
    st.builds(ShipOk, u64, node, u64, u64),
    st.builds(ShipRefused, u64, node, st.sampled_from(list(ShipRefusal)), u64),
    st.builds(Fence, u64, node),
    st.builds(FenceOk, u64, node, u64, u64),
    st.builds(FenceRefused, u64, node),
)
shards = st.builds(
    ShardId,
    st.sampled_from(list(ShardKind)),
    st.just("t1"),
    st.just("ns"),
    st.sampled_from(["orders", "c1"]),
    st.integers(min_value=0, max_value=65535),
)


@given(shards, messages)
def test_every_core_message_round_trips_through_its_peer_message(
    shard: ShardId, message: Message
) -> None:
    decoded = decode_peer_message(encode_peer_message(to_wire(shard, message)))
    assert isinstance(decoded, REPLICATION_MESSAGE_TYPES)
    assert from_wire(decoded) == (shard, message)


def test_a_ship_carries_payload_bytes_as_base64_and_the_start_flag_only_when_set() -> None:
    shard = ShardId(ShardKind.STREAM, "t1", "ns", "orders", 2)
    ship = Ship(7, "b1", 3, 6, (Entry(7, b"", start=True), Entry(7, b"\x00\xff")), 2)
    encoded = encode_peer_message(to_wire(shard, ship))
    assert b'"type":"replica_ship"' in encoded
    assert b'"payload":"AP8="' in encoded
    assert encoded.count(b'"start":true') == 1
