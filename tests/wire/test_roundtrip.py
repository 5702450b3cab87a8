"""Round-trip properties for every message and every legal binary flag value.

Parametrized over the generated tables, so a message or layout added to the
catalogue gets its property test by regeneration alone.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_wire import FrameReader, decode_frame, encode_frame
from felix_wire.binary import DECODERS
from felix_wire.codec import decode_payload
from felix_wire.flags import LAYOUT_BY_FLAG, layout_of
from felix_wire.frame import HEADER_SIZE
from felix_wire.messages import MESSAGE_CLASSES, decode_message, encode_message
from felix_wire.strategies import MESSAGE_STRATEGIES, binary_frame


@pytest.mark.parametrize("message_type", sorted(MESSAGE_CLASSES))
def test_message_round_trip(message_type: str) -> None:
    @given(MESSAGE_STRATEGIES[message_type])
    def check(message: Any) -> None:
        payload = encode_message(message)
        assert payload.startswith(b'{"type":"' + message_type.encode() + b'"')
        assert decode_message(payload) == message
        frame = encode_frame(message)
        assert decode_frame(FrameReader().feed(frame)[0]) == message

    check()


@pytest.mark.parametrize(
    ("flags", "layout"),
    sorted(LAYOUT_BY_FLAG.items()),
    ids=lambda v: f"{v:#06x}" if isinstance(v, int) else v,
)
def test_binary_round_trip(flags: int, layout: str) -> None:
    @given(binary_frame(layout, flags))
    def check(value: Any) -> None:
        frame = encode_frame(value)
        assert int.from_bytes(frame[6:8], "big") == flags
        assert layout_of(flags) == layout
        assert DECODERS[layout](flags, frame[HEADER_SIZE:]) == value
        assert encode_frame(decode_payload(flags, frame[HEADER_SIZE:])) == frame

    check()


@given(st.lists(st.sampled_from(sorted(MESSAGE_CLASSES)), min_size=1, max_size=5), st.data())
def test_frame_reader_reassembles_any_chunking(types: list[str], data: st.DataObject) -> None:
    """A QUIC read is not a frame: any split of a frame sequence yields the same frames."""
    messages = [data.draw(MESSAGE_STRATEGIES[t]) for t in types]
    stream = b"".join(encode_frame(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader()
    out = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out.extend(reader.feed(stream[start:cut]))
        start = cut
    reader.close()
    assert [decode_frame(f) for f in out] == messages


def test_absent_optional_fields_are_omitted_never_null() -> None:
    from felix_wire.messages import Error, PublishError

    assert encode_message(Error(message="boom")) == b'{"type":"error","message":"boom"}'
    assert b"null" not in encode_message(PublishError(request_id=1, message="x"))


def test_always_emitted_fields_are_written_when_absent() -> None:
    from felix_wire.messages import CachePut, CacheValue, GroupPoll, GroupRecord

    put = CachePut(tenant_id="t", namespace="n", cache="c", key="k", value=b"v")
    assert encode_message(put).endswith(b'"ttl_ms":null}')
    value = CacheValue(tenant_id="t", namespace="n", cache="c", key="k")
    assert b'"value":null' in encode_message(value)
    poll = GroupPoll(
        tenant_id="t", namespace="n", stream="s", shard=0, group="g", max_records=1, request_id=1
    )
    assert b'"wait_ms":0' in encode_message(poll)
    assert (
        msgspec.json.encode(GroupRecord(offset=7, payload=b"one"))
        == b'{"offset":7,"payload":"b25l","attempts":0}'
    )


def test_defaults_equal_to_their_value_are_omitted() -> None:
    from felix_wire.messages import GroupNack

    nack = GroupNack(
        tenant_id="t1", namespace="ns", stream="jobs", shard=0, group="g", offset=1, request_id=1
    )
    assert encode_message(nack) == (
        b'{"type":"group_nack","tenant_id":"t1","namespace":"ns","stream":"jobs","shard":0,'
        b'"group":"g","offset":1,"request_id":1}'
    )


def test_keyword_field_names_keep_their_wire_spelling() -> None:
    from felix_wire.messages import StreamRead

    read = StreamRead(tenant_id="t", namespace="n", stream="s", shard=0, from_=5, request_id=1)
    assert b'"from":5' in encode_message(read)
    assert decode_message(encode_message(read)) == read


def test_u64_values_above_2_53_are_exact() -> None:
    from felix_wire.messages import ProducerInitOk

    big = 2**64 - 1
    assert decode_message(
        encode_message(ProducerInitOk(request_id=1, producer_id=big))
    ) == ProducerInitOk(request_id=1, producer_id=big)
