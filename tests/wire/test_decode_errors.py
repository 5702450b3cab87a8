"""Each distinct decode and encode error, provoked on purpose, with what it names."""

from __future__ import annotations

import struct

import pytest

from felix_wire import FrameReader, encode_frame
from felix_wire import wire_errors as we
from felix_wire.binary import (
    AckStatus,
    BinaryAckMode,
    EventBatchSharedFrame,
    PublishAckFrame,
    PublishBatchFrame,
    decode_event_batch_shared,
    decode_publish_ack,
    decode_publish_batch,
)
from felix_wire.codec import decode_payload
from felix_wire.errors import RetryClass
from felix_wire.flags import Flag, layout_of
from felix_wire.frame import HEADER_SIZE, MAGIC, decode_header
from felix_wire.messages import Unknown, decode_message


def header(flags: int, length: int, magic: int = MAGIC, version: int = 1) -> bytes:
    return struct.pack(">IHHI", magic, version, flags, length)


PLAIN = PublishBatchFrame(tenant_id="t1", namespace="ns", stream="s", payloads=[b"a", b"bc"])
PLAIN_PAYLOAD = encode_frame(PLAIN)[HEADER_SIZE:]


# --- frame header -------------------------------------------------------------


def test_bad_magic() -> None:
    with pytest.raises(we.BadMagicError) as info:
        FrameReader().feed(header(0, 0, magic=0x464C5832))
    assert info.value.magic == 0x464C5832


def test_unsupported_version() -> None:
    with pytest.raises(we.UnsupportedVersionError) as info:
        FrameReader().feed(header(0, 0, version=2))
    assert info.value.version == 2


def test_oversize_length_fails_on_the_header_alone() -> None:
    reader = FrameReader(max_payload=65536)
    with pytest.raises(we.FrameTooLargeError) as info:
        reader.feed(header(0, 65537))  # no payload bytes were sent
    assert (info.value.length, info.value.limit) == (65537, 65536)
    with pytest.raises(we.FrameTooLargeError):
        decode_header(header(0, 2**32 - 1))


def test_truncated_frame_at_end_of_stream() -> None:
    reader = FrameReader()
    assert reader.feed(header(0, 10) + b"{}") == []
    with pytest.raises(we.TruncatedFrameError) as info:
        reader.close()
    assert (info.value.buffered, info.value.needed) == (14, 22)
    partial_header = FrameReader()
    partial_header.feed(b"FLX")
    with pytest.raises(we.TruncatedFrameError):
        partial_header.close()


def test_reader_buffers_at_most_one_frame() -> None:
    reader = FrameReader(max_payload=100)
    reader.feed(header(0, 100) + b"x" * 50)
    assert reader.buffered == HEADER_SIZE + 50


# --- flags -------------------------------------------------------------------------


def test_unknown_flag_bit_is_rejected_not_masked() -> None:
    with pytest.raises(we.UnknownFlagsError) as info:
        layout_of(0x8001)
    assert info.value.unknown == 0x8000


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (0x0008, "no layout bit"),
        (0x0001 | 0x0004, "more than one layout bit"),
        (0x0001 | 0x0100, "requires BINARY_PUBLISH_ACKED"),
        (0x0004 | 0x0800, "requires EVENT_BATCH_OFFSETS"),
        (0x0010 | 0x0400, "requires BINARY_PUBLISH_ACK_CODE"),
        (0x0010 | 0x0200 | 0x1000, "excludes"),
        (0x0001 | 0x0020, "does not modify BINARY_PUBLISH_BATCH"),
        (0x0004 | 0x0080, "does not modify BINARY_EVENT_BATCH_SHARED"),
    ],
)
def test_illegal_flag_combinations(flags: int, reason: str) -> None:
    with pytest.raises(we.IllegalFlagCombinationError) as info:
        decode_payload(flags, b"")
    assert reason in info.value.reason


# --- binary payloads ------------------------------------------------------------


def test_truncated_payload_names_field_and_offset() -> None:
    with pytest.raises(we.TruncatedPayloadError) as info:
        decode_publish_batch(0x0009, b"\x00\x00\x00")
    assert (info.value.what, info.value.field, info.value.offset) == (
        "publish_batch",
        "request_id",
        0,
    )


def test_trailing_bytes() -> None:
    with pytest.raises(we.TrailingBytesError) as info:
        decode_publish_batch(0x0001, PLAIN_PAYLOAD + b"\x00")
    assert info.value.offset == len(PLAIN_PAYLOAD)


def test_length_longer_than_the_payload() -> None:
    bad = struct.pack(">H", 500) + b"t1"
    with pytest.raises(we.LengthOutOfRangeError) as info:
        decode_publish_batch(0x0001, bad)
    assert (info.value.field, info.value.offset) == ("tenant_id", 0)


def test_count_is_bounded_before_allocating() -> None:
    body = PLAIN_PAYLOAD[: PLAIN_PAYLOAD.index(b"\x00\x00\x00\x02")]  # up to the count
    with pytest.raises(we.LengthOutOfRangeError) as info:
        decode_publish_batch(0x0001, body + struct.pack(">I", 2**32 - 1))
    assert info.value.field == "count"


def test_item_length_longer_than_the_payload() -> None:
    with pytest.raises(we.LengthOutOfRangeError) as info:
        decode_event_batch_shared(0x0004, struct.pack(">II", 1, 99) + b"x")
    assert info.value.field == "payloads[0]"


def test_invalid_utf8() -> None:
    bad = struct.pack(">H", 2) + b"\xff\xfe"
    with pytest.raises(we.InvalidUtf8Error) as info:
        decode_publish_batch(0x0001, bad)
    assert (info.value.field, info.value.offset) == ("tenant_id", 2)


def test_invalid_enum_byte() -> None:
    with pytest.raises(we.InvalidEnumValueError) as info:
        decode_publish_batch(0x0009, struct.pack(">QB", 1, 3) + PLAIN_PAYLOAD)
    assert (info.value.field, info.value.offset) == ("ack_mode", 8)
    with pytest.raises(we.InvalidEnumValueError):
        decode_publish_ack(0x0010, struct.pack(">BQH", 2, 1, 0))


def test_unknown_retry_byte_reads_as_fatal() -> None:
    ack = decode_publish_ack(0x0210, struct.pack(">BQHHB", 1, 9, 0, 3, 77))
    assert ack.retry is RetryClass.FATAL


def test_offset_on_a_failed_ack_is_rejected() -> None:
    with pytest.raises(we.FlagContentMismatchError) as info:
        decode_publish_ack(0x1010, struct.pack(">BQHQ", 1, 9, 0, 100))
    assert info.value.field == "offset"
    with pytest.raises(we.FlagContentMismatchError):
        decode_publish_ack(0x0210, struct.pack(">BQHHB", 0, 9, 0, 3, 1))


# --- JSON payloads ------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"{not json", b"[1,2]", b'{"no_type":1}', b'{"type":7}', b""])
def test_malformed_json(payload: bytes) -> None:
    with pytest.raises(we.MalformedJsonError):
        decode_message(payload)


def test_missing_required_field_names_message_and_field() -> None:
    with pytest.raises(we.MessageFieldError) as info:
        decode_message(b'{"type":"auth","tenant_id":"t1"}')
    assert info.value.what == "auth"
    assert "token" in str(info.value)


def test_ill_typed_field_names_its_path() -> None:
    with pytest.raises(we.MessageFieldError) as info:
        decode_message(b'{"type":"cache_ok","request_id":"7"}')
    assert (info.value.what, info.value.field) == ("cache_ok", "request_id")


@pytest.mark.parametrize(
    "payload",
    [
        b'{"type":"auth_ok","server_flags":65536}',
        b'{"type":"cache_ok","request_id":18446744073709551616}',
        b'{"type":"cache_ok","request_id":-1}',
        b'{"type":"counter_add","tenant_id":"t","namespace":"n","cache":"c","key":"k","delta":9223372036854775808,"request_id":1}',
        b'{"type":"group_dead_letter_list","offsets":[18446744073709551616],"request_id":1}',
    ],
)
def test_integers_outside_their_wire_range(payload: bytes) -> None:
    with pytest.raises(we.MessageFieldError):
        decode_message(payload)


@pytest.mark.parametrize("value", ['"aGVsbG8"', '"a$b="', '"aGVsbG8=="'])
def test_base64_must_be_standard_and_padded(value: str) -> None:
    payload = (
        '{"type":"event","tenant_id":"t","namespace":"n","stream":"s","payload":' + value + "}"
    )
    with pytest.raises(we.MessageFieldError):
        decode_message(payload.encode())


def test_unknown_type_is_an_outcome_not_an_error() -> None:
    decoded = decode_message(b'{"type":"frobnicate","request_id":12,"x":[1]}')
    assert isinstance(decoded, Unknown)
    assert (decoded.type, decoded.request_id, decoded.raw["x"]) == ("frobnicate", 12, [1])
    lenient = decode_message(b'{"type":"frobnicate","request_id":"12"}')
    assert isinstance(lenient, Unknown) and lenient.request_id is None


def test_unknown_fields_are_ignored() -> None:
    decoded = decode_message(b'{"type":"cache_ok","request_id":1,"later_field":{"a":1}}')
    assert decoded.request_id == 1  # type: ignore[union-attr]


def test_publish_refusal_needs_exactly_one_reason() -> None:
    base = b'{"type":"publish_refused","request_id":1,"message":"m","reason":'
    assert (
        decode_message(base + b'{"sequence_gap":{"expected":12}}}').reason.sequence_gap.expected
        == 12
    )  # type: ignore[union-attr]
    with pytest.raises(we.MessageFieldError):
        decode_message(base + b"{}}")


# --- encoding -------------------------------------------------------------------


def test_encode_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(we.EncodeError) as info:
        encode_frame(
            PublishBatchFrame(tenant_id="x" * 70000, namespace="n", stream="s", payloads=[])
        )
    assert info.value.field == "tenant_id"
    with pytest.raises(we.EncodeError) as info:
        encode_frame(
            PublishBatchFrame(
                request_id=2**64,
                ack_mode=BinaryAckMode.PER_BATCH,
                tenant_id="t",
                namespace="n",
                stream="s",
                payloads=[],
            )
        )
    assert info.value.field == "request_id"


def test_encode_refuses_half_set_groups() -> None:
    with pytest.raises(we.EncodeError) as info:
        encode_frame(
            PublishBatchFrame(request_id=1, tenant_id="t", namespace="n", stream="s", payloads=[])
        )
    assert info.value.field == "acked"


def test_encode_refuses_groups_the_status_forbids() -> None:
    with pytest.raises(we.EncodeError):
        encode_frame(PublishAckFrame(status=AckStatus.ERROR, request_id=1, message="no", offset=5))
    with pytest.raises(we.EncodeError):
        encode_frame(
            PublishAckFrame(
                status=AckStatus.OK, request_id=1, message="", code=3, retry=RetryClass.FATAL
            )
        )


def test_encode_refuses_mismatched_timestamps() -> None:
    with pytest.raises(we.EncodeError):
        encode_frame(EventBatchSharedFrame(payloads=[b"a", b"b"], timestamps=[1]))


def test_skipped_before_is_written_only_when_non_zero() -> None:
    frame = encode_frame(EventBatchSharedFrame(base_offset=5, skipped_before=0, payloads=[b"x"]))
    assert (
        int.from_bytes(frame[6:8], "big")
        == Flag.BINARY_EVENT_BATCH_SHARED | Flag.EVENT_BATCH_OFFSETS
    )
