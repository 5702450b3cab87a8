# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Binary payload layouts: straight-line encoders and decoders per layout.

Each layout is a Struct whose optional groups are present exactly when their
fields are set; encoding derives the frame flags from what is set, decoding
reads the groups the flags select. Decoders check every length against the
bytes left before reading or allocating, and name the field and byte offset of
any problem. Record lists whose items all have the same size are parsed with
one `struct` call (checked against every length prefix), everything else item
by item.

Layouts:
- publish_batch (BINARY_PUBLISH_BATCH, 0x0001): Every publish frame. Prefix order is fixed - acked, then producer, then key, then the body - so request_id is always at payload offset 0 of an acked frame.
- publish_ack (BINARY_PUBLISH_ACK, 0x0010): Binary answer to an acked binary publish. Minimum payload 11 bytes.
- event_batch_legacy (BINARY_EVENT_BATCH, 0x0002): Legacy per-subscriber event batch; still decodable.
- event_batch_shared (BINARY_EVENT_BATCH_SHARED, 0x0004): Encode-once event batch shared by every subscriber of a variant; the subscription is implied by the stream's event_stream_hello.
"""

from __future__ import annotations

import enum
import struct
from functools import lru_cache
from typing import Any, Callable, Mapping, Union
from types import MappingProxyType

import msgspec

from .errors import RetryClass
from .flags import Flag
from .frame import MAGIC, VERSION, MAX_ENCODABLE_PAYLOAD
from .wire_errors import (
    EncodeError,
    FlagContentMismatchError,
    InvalidEnumValueError,
    InvalidUtf8Error,
    LengthOutOfRangeError,
    TrailingBytesError,
    TruncatedPayloadError,
)

__all__ = [
    "BinaryAckMode",
    "AckStatus",
    "PublishBatchFrame",
    "encode_publish_batch",
    "decode_publish_batch",
    "PublishAckFrame",
    "encode_publish_ack",
    "decode_publish_ack",
    "EventBatchLegacyFrame",
    "encode_event_batch_legacy",
    "decode_event_batch_legacy",
    "EventBatchSharedFrame",
    "encode_event_batch_shared",
    "decode_event_batch_shared",
    "BinaryFrame",
    "BINARY_CLASSES",
    "DECODERS",
    "ENCODERS",
]

_HEADER = struct.Struct(">IHHI")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PACK = {"u8": _U8.pack, "u16": _U16.pack, "u32": _U32.pack, "u64": _U64.pack}
_u16_from = _U16.unpack_from
_u32_from = _U32.unpack_from
_u64_from = _U64.unpack_from
_pack_u16 = _U16.pack
_pack_u32 = _U32.pack
_pack_u64 = _U64.pack
_pack_u8 = _U8.pack

# Record lists with at most this many items may take the one-call uniform path;
# the bound keeps the cached struct formats small.
_FAST_PATH_MAX_ITEMS = 1024


class BinaryAckMode(enum.IntEnum):
    """there is no byte for none: an unacked publish uses the un-prefixed frame"""

    PER_MESSAGE = 1
    PER_BATCH = 2


class AckStatus(enum.IntEnum):
    """any other value is a decode error"""

    OK = 0
    ERROR = 1


_ENUM_BY_BYTE: Mapping[str, Mapping[int, Any]] = MappingProxyType(
    {
        "BinaryAckMode": MappingProxyType({m.value: m for m in BinaryAckMode}),
        "AckStatus": MappingProxyType({m.value: m for m in AckStatus}),
        "RetryClass": MappingProxyType({m.value: m for m in RetryClass}),
    }
)


def _check_int(what: str, field: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise EncodeError(what, field, f"{value} does not fit in u{bits}")


def _text(what: str, field: str, value: str, max_len: int) -> bytes:
    raw = value.encode()
    if len(raw) > max_len:
        raise EncodeError(what, field, f"{len(raw)} bytes exceed the {max_len}-byte limit")
    return raw


def _blob(what: str, field: str, value: bytes, max_len: int) -> bytes:
    if len(value) > max_len:
        raise EncodeError(what, field, f"{len(value)} bytes exceed the {max_len}-byte limit")
    return value


def _truncated(what: str, field: str, pos: int, need: int, end: int) -> TruncatedPayloadError:
    return TruncatedPayloadError(what, field, pos, f"needs {need} bytes, {end - pos} left")


def _too_long(what: str, field: str, pos: int, length: int, end: int) -> LengthOutOfRangeError:
    return LengthOutOfRangeError(
        what, field, pos, f"declared length {length} exceeds the {end - pos} bytes left"
    )


def _frame(flags: int, parts: list[Any]) -> bytes:
    """Header + parts (parts[0] is a placeholder for the header)."""
    length = sum(map(len, parts)) - len(parts[0])
    if length > MAX_ENCODABLE_PAYLOAD:
        raise EncodeError("frame", None, f"payload of {length} bytes exceeds u32")
    parts[0] = _HEADER.pack(MAGIC, VERSION, flags, length)
    return b"".join(parts)


@lru_cache(maxsize=256)
def _uniform(prefix: str, count: int, size: int) -> struct.Struct:
    """One struct for `count` items of `prefix` fields + u32 length + `size` bytes."""
    return struct.Struct(">" + f"{prefix}I{size}s" * count)


def _read_items(
    data: bytes, pos: int, end: int, what: str, field: str, prefix: str, head: struct.Struct
) -> tuple[list[tuple[Any, ...]], list[bytes], int]:
    """A u32-counted record list whose items are `prefix` fixed fields then a bytes32.

    Returns the prefix columns (one list per prefix field), the payloads and the
    position after the list.
    """
    if end - pos < 4:
        raise _truncated(what, "count", pos, 4, end)
    (count,) = _u32_from(data, pos)
    pos += 4
    head_size = head.size
    if count > (end - pos) // head_size:
        raise LengthOutOfRangeError(
            what, "count", pos - 4, f"{count} items cannot fit in the {end - pos} bytes left"
        )
    width = len(prefix)
    stride = width + 2
    if 0 < count <= _FAST_PATH_MAX_ITEMS:
        size = head.unpack_from(data, pos)[-1]
        total = count * (head_size + size)
        if total <= end - pos:
            values = _uniform(prefix, count, size).unpack_from(data, pos)
            if values[width::stride].count(size) == count:
                columns = [list(values[i::stride]) for i in range(width)]
                return columns, list(values[width + 1 :: stride]), pos + total
    columns = [[] for _ in range(width)]
    payloads: list[bytes] = []
    unpack_head = head.unpack_from
    append = payloads.append
    for index in range(count):
        if end - pos < head_size:
            raise _truncated(what, f"{field}[{index}]", pos, head_size, end)
        item = unpack_head(data, pos)
        pos += head_size
        size = item[-1]
        if size > end - pos:
            raise _too_long(what, f"{field}[{index}]", pos - 4, size, end)
        for column, value in zip(columns, item):
            column.append(value)
        append(data[pos : pos + size])
        pos += size
    return columns, payloads, pos


def _write_items(
    parts: list[Any], what: str, field: str, payloads: list[bytes], prefixes: list[bytes] | None
) -> None:
    """Append a u32-counted record list: optional pre-packed prefixes, then u32 length + bytes."""
    parts.append(_pack_u32(len(payloads)))
    if prefixes is None:
        for payload in payloads:
            if len(payload) > 0xFFFFFFFF:
                raise EncodeError(what, field, f"{len(payload)} bytes exceed u32")
            parts.append(_pack_u32(len(payload)))
            parts.append(payload)
    else:
        for prefix, payload in zip(prefixes, payloads):
            if len(payload) > 0xFFFFFFFF:
                raise EncodeError(what, field, f"{len(payload)} bytes exceed u32")
            parts.append(prefix)
            parts.append(_pack_u32(len(payload)))
            parts.append(payload)


class PublishBatchFrame(msgspec.Struct, kw_only=True):
    """Every publish frame. Prefix order is fixed - acked, then producer, then key, then the body - so request_id is always at payload offset 0 of an acked frame.

    Flags: BINARY_PUBLISH_BATCH (0x0001); legal values: 0x0001, 0x0009, 0x0041, 0x0049, 0x0109, 0x0149.
    Answered: 0x0001 and 0x0041 are never answered; 0x0009/0x0049 get a binary ack (publish_ack); idempotent frames (0x0100) get JSON publish_ok / publish_error / publish_refused.
    """

    request_id: int | None = None
    """[BINARY_PUBLISH_ACKED]"""
    ack_mode: BinaryAckMode | None = None
    """[BINARY_PUBLISH_ACKED]"""
    producer_id: int | None = None
    """[BINARY_PUBLISH_IDEMPOTENT]"""
    sequence: int | None = None
    """[BINARY_PUBLISH_IDEMPOTENT]"""
    key: bytes | None = None
    """[BINARY_PUBLISH_KEYED] raw routing key; an empty key is a real key, distinct from no key"""
    tenant_id: str
    namespace: str
    stream: str
    payloads: list[bytes]


_PUBLISH_BATCH_HEAD = struct.Struct(">I")


def _encode_publish_batch_parts(m: PublishBatchFrame) -> tuple[int, list[Any]]:
    flags = 0x0001
    parts: list[Any] = [b""]
    if m.request_id is not None or m.ack_mode is not None:
        if m.request_id is None or m.ack_mode is None:
            raise EncodeError("publish_batch", "acked", "set request_id, ack_mode together")
        flags |= 0x0008
        _v = m.request_id
        _check_int("publish_batch", "request_id", _v, 64)
        parts.append(_pack_u64(_v))

        _v = m.ack_mode
        _check_int("publish_batch", "ack_mode", _v, 8)
        parts.append(_pack_u8(_v))

    if m.producer_id is not None or m.sequence is not None:
        if m.producer_id is None or m.sequence is None:
            raise EncodeError("publish_batch", "idempotent", "set producer_id, sequence together")
        flags |= 0x0100
        _v = m.producer_id
        _check_int("publish_batch", "producer_id", _v, 64)
        parts.append(_pack_u64(_v))

        _v = m.sequence
        _check_int("publish_batch", "sequence", _v, 64)
        parts.append(_pack_u64(_v))

    if m.key is not None:
        flags |= 0x0040
        _b = _blob("publish_batch", "key", m.key, 65535)
        parts.append(_pack_u16(len(_b)))
        parts.append(_b)

    _b = _text("publish_batch", "tenant_id", m.tenant_id, 65535)
    parts.append(_pack_u16(len(_b)))
    parts.append(_b)

    _b = _text("publish_batch", "namespace", m.namespace, 65535)
    parts.append(_pack_u16(len(_b)))
    parts.append(_b)

    _b = _text("publish_batch", "stream", m.stream, 65535)
    parts.append(_pack_u16(len(_b)))
    parts.append(_b)

    _write_items(parts, "publish_batch", "payloads", m.payloads, None)
    return flags, parts


def encode_publish_batch(m: PublishBatchFrame) -> tuple[int, bytes]:
    """(flags, payload) for a publish_batch frame."""
    flags, parts = _encode_publish_batch_parts(m)
    return flags, b"".join(parts)


def encode_publish_batch_frame(m: PublishBatchFrame) -> bytes:
    """The whole frame, header included."""
    flags, parts = _encode_publish_batch_parts(m)
    return _frame(flags, parts)


def decode_publish_batch(flags: int, payload: bytes | bytearray | memoryview) -> PublishBatchFrame:
    """Decode a publish_batch payload whose header carried `flags` (already checked by
    flags.layout_of)."""
    data = payload if type(payload) is bytes else bytes(payload)
    end = len(data)
    pos = 0
    request_id = None
    ack_mode = None
    producer_id = None
    sequence = None
    key = None
    if flags & 0x0008:
        if end - pos < 8:
            raise _truncated("publish_batch", "request_id", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        request_id = _raw
        pos += 8

        if end - pos < 1:
            raise _truncated("publish_batch", "ack_mode", pos, 1, end)
        _raw = data[pos]
        ack_mode = _ENUM_BY_BYTE["BinaryAckMode"].get(_raw)
        if ack_mode is None:
            raise InvalidEnumValueError(
                "publish_batch", "ack_mode", pos, f"{_raw} is not a BinaryAckMode"
            )
        pos += 1

    if flags & 0x0100:
        if end - pos < 8:
            raise _truncated("publish_batch", "producer_id", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        producer_id = _raw
        pos += 8

        if end - pos < 8:
            raise _truncated("publish_batch", "sequence", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        sequence = _raw
        pos += 8

    if flags & 0x0040:
        if end - pos < 2:
            raise _truncated("publish_batch", "key", pos, 2, end)
        (_n,) = _u16_from(data, pos)
        pos += 2
        if _n > end - pos:
            raise _too_long("publish_batch", "key", pos - 2, _n, end)
        key = data[pos : pos + _n]
        pos += _n

    if end - pos < 2:
        raise _truncated("publish_batch", "tenant_id", pos, 2, end)
    (_n,) = _u16_from(data, pos)
    pos += 2
    if _n > end - pos:
        raise _too_long("publish_batch", "tenant_id", pos - 2, _n, end)
    try:
        tenant_id = data[pos : pos + _n].decode()
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error(
            "publish_batch", "tenant_id", pos + exc.start, "invalid UTF-8"
        ) from None
    pos += _n

    if end - pos < 2:
        raise _truncated("publish_batch", "namespace", pos, 2, end)
    (_n,) = _u16_from(data, pos)
    pos += 2
    if _n > end - pos:
        raise _too_long("publish_batch", "namespace", pos - 2, _n, end)
    try:
        namespace = data[pos : pos + _n].decode()
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error(
            "publish_batch", "namespace", pos + exc.start, "invalid UTF-8"
        ) from None
    pos += _n

    if end - pos < 2:
        raise _truncated("publish_batch", "stream", pos, 2, end)
    (_n,) = _u16_from(data, pos)
    pos += 2
    if _n > end - pos:
        raise _too_long("publish_batch", "stream", pos - 2, _n, end)
    try:
        stream = data[pos : pos + _n].decode()
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error(
            "publish_batch", "stream", pos + exc.start, "invalid UTF-8"
        ) from None
    pos += _n

    _columns, payloads, pos = _read_items(
        data, pos, end, "publish_batch", "payloads", "", _PUBLISH_BATCH_HEAD
    )
    if pos != end:
        raise TrailingBytesError(
            "publish_batch", None, pos, f"{end - pos} bytes after the last field"
        )
    return PublishBatchFrame(
        request_id=request_id,
        ack_mode=ack_mode,
        producer_id=producer_id,
        sequence=sequence,
        key=key,
        tenant_id=tenant_id,
        namespace=namespace,
        stream=stream,
        payloads=payloads,
    )


class PublishAckFrame(msgspec.Struct, kw_only=True):
    """Binary answer to an acked binary publish. Minimum payload 11 bytes.

    Flags: BINARY_PUBLISH_ACK (0x0010); legal values: 0x0010, 0x0090, 0x0210, 0x0290, 0x0610, 0x0690, 0x1010, 0x1090.
    """

    status: AckStatus
    request_id: int
    message: str
    """error text; empty when ok"""
    code: int | None = None
    """[BINARY_PUBLISH_ACK_CODE] error code number (error_codes); an unknown number decodes as code_<n>"""
    retry: RetryClass | None = None
    """[BINARY_PUBLISH_ACK_CODE] retry class byte (retry_classes); an unknown byte reads as fatal"""
    reason: str | None = None
    """[BINARY_PUBLISH_ACK_DETAIL]"""
    retry_after_ms: int | None = None
    """[BINARY_PUBLISH_ACK_DETAIL]"""
    node_id: str | None = None
    """[BINARY_PUBLISH_ACK_OWNER]"""
    addr: str | None = None
    """[BINARY_PUBLISH_ACK_OWNER] owner's client address; empty = not published"""
    generation: int | None = None
    """[BINARY_PUBLISH_ACK_OWNER]"""
    offset: int | None = None
    """[BINARY_PUBLISH_ACK_OFFSET] offset of the batch's first record; it comes after the owner group"""


def _encode_publish_ack_parts(m: PublishAckFrame) -> tuple[int, list[Any]]:
    flags = 0x0010
    parts: list[Any] = [b""]
    _v = m.status
    _check_int("publish_ack", "status", _v, 8)
    parts.append(_pack_u8(_v))

    _v = m.request_id
    _check_int("publish_ack", "request_id", _v, 64)
    parts.append(_pack_u64(_v))

    _b = _text("publish_ack", "message", m.message, 65535)
    parts.append(_pack_u16(len(_b)))
    parts.append(_b)

    if m.code is not None or m.retry is not None:
        if m.code is None or m.retry is None:
            raise EncodeError("publish_ack", "code", "set code, retry together")
        if m.status != AckStatus.ERROR:
            raise EncodeError("publish_ack", "code", "only when status is error")
        flags |= 0x0200
        _v = m.code
        _check_int("publish_ack", "code", _v, 16)
        parts.append(_pack_u16(_v))

        _v = m.retry
        _check_int("publish_ack", "retry", _v, 8)
        parts.append(_pack_u8(_v))

    if m.reason is not None or m.retry_after_ms is not None:
        flags |= 0x0400
        _b = _text("publish_ack", "reason", m.reason or "", 65535)
        parts.append(_pack_u16(len(_b)))
        parts.append(_b)

        _v = 0 if m.retry_after_ms is None else m.retry_after_ms
        _check_int("publish_ack", "retry_after_ms", _v, 64)
        parts.append(_pack_u64(_v))

    if m.node_id is not None or m.generation is not None or m.addr is not None:
        if m.node_id is None or m.generation is None:
            raise EncodeError("publish_ack", "owner", "set node_id, generation together")
        flags |= 0x0080
        _b = _text("publish_ack", "node_id", m.node_id, 65535)
        parts.append(_pack_u16(len(_b)))
        parts.append(_b)

        _b = _text("publish_ack", "addr", m.addr or "", 65535)
        parts.append(_pack_u16(len(_b)))
        parts.append(_b)

        _v = m.generation
        _check_int("publish_ack", "generation", _v, 64)
        parts.append(_pack_u64(_v))

    if m.offset is not None:
        if m.status != AckStatus.OK:
            raise EncodeError("publish_ack", "offset", "only when status is ok")
        flags |= 0x1000
        _v = m.offset
        _check_int("publish_ack", "offset", _v, 64)
        parts.append(_pack_u64(_v))

    return flags, parts


def encode_publish_ack(m: PublishAckFrame) -> tuple[int, bytes]:
    """(flags, payload) for a publish_ack frame."""
    flags, parts = _encode_publish_ack_parts(m)
    return flags, b"".join(parts)


def encode_publish_ack_frame(m: PublishAckFrame) -> bytes:
    """The whole frame, header included."""
    flags, parts = _encode_publish_ack_parts(m)
    return _frame(flags, parts)


def decode_publish_ack(flags: int, payload: bytes | bytearray | memoryview) -> PublishAckFrame:
    """Decode a publish_ack payload whose header carried `flags` (already checked by
    flags.layout_of)."""
    data = payload if type(payload) is bytes else bytes(payload)
    end = len(data)
    pos = 0
    code = None
    retry = None
    reason = None
    retry_after_ms = None
    node_id = None
    addr = None
    generation = None
    offset = None
    if end - pos < 1:
        raise _truncated("publish_ack", "status", pos, 1, end)
    _raw = data[pos]
    status = _ENUM_BY_BYTE["AckStatus"].get(_raw)
    if status is None:
        raise InvalidEnumValueError("publish_ack", "status", pos, f"{_raw} is not a AckStatus")
    pos += 1

    if end - pos < 8:
        raise _truncated("publish_ack", "request_id", pos, 8, end)
    (_raw,) = _u64_from(data, pos)
    request_id = _raw
    pos += 8

    if end - pos < 2:
        raise _truncated("publish_ack", "message", pos, 2, end)
    (_n,) = _u16_from(data, pos)
    pos += 2
    if _n > end - pos:
        raise _too_long("publish_ack", "message", pos - 2, _n, end)
    try:
        message = data[pos : pos + _n].decode()
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error("publish_ack", "message", pos + exc.start, "invalid UTF-8") from None
    pos += _n

    if flags & 0x0200:
        if status != AckStatus.ERROR:
            raise FlagContentMismatchError(
                "publish_ack",
                "code",
                pos,
                "BINARY_PUBLISH_ACK_CODE is only allowed when status is error",
            )
        if end - pos < 2:
            raise _truncated("publish_ack", "code", pos, 2, end)
        (_raw,) = _u16_from(data, pos)
        code = _raw
        pos += 2

        if end - pos < 1:
            raise _truncated("publish_ack", "retry", pos, 1, end)
        _raw = data[pos]
        retry = _ENUM_BY_BYTE["RetryClass"].get(_raw, RetryClass.FATAL)
        pos += 1

    if flags & 0x0400:
        if end - pos < 2:
            raise _truncated("publish_ack", "reason", pos, 2, end)
        (_n,) = _u16_from(data, pos)
        pos += 2
        if _n > end - pos:
            raise _too_long("publish_ack", "reason", pos - 2, _n, end)
        try:
            reason = data[pos : pos + _n].decode() or None
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                "publish_ack", "reason", pos + exc.start, "invalid UTF-8"
            ) from None
        pos += _n

        if end - pos < 8:
            raise _truncated("publish_ack", "retry_after_ms", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        retry_after_ms = _raw or None
        pos += 8

    if flags & 0x0080:
        if end - pos < 2:
            raise _truncated("publish_ack", "node_id", pos, 2, end)
        (_n,) = _u16_from(data, pos)
        pos += 2
        if _n > end - pos:
            raise _too_long("publish_ack", "node_id", pos - 2, _n, end)
        try:
            node_id = data[pos : pos + _n].decode()
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                "publish_ack", "node_id", pos + exc.start, "invalid UTF-8"
            ) from None
        pos += _n

        if end - pos < 2:
            raise _truncated("publish_ack", "addr", pos, 2, end)
        (_n,) = _u16_from(data, pos)
        pos += 2
        if _n > end - pos:
            raise _too_long("publish_ack", "addr", pos - 2, _n, end)
        try:
            addr = data[pos : pos + _n].decode() or None
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                "publish_ack", "addr", pos + exc.start, "invalid UTF-8"
            ) from None
        pos += _n

        if end - pos < 8:
            raise _truncated("publish_ack", "generation", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        generation = _raw
        pos += 8

    if flags & 0x1000:
        if status != AckStatus.OK:
            raise FlagContentMismatchError(
                "publish_ack",
                "offset",
                pos,
                "BINARY_PUBLISH_ACK_OFFSET is only allowed when status is ok",
            )
        if end - pos < 8:
            raise _truncated("publish_ack", "offset", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        offset = _raw
        pos += 8

    if pos != end:
        raise TrailingBytesError(
            "publish_ack", None, pos, f"{end - pos} bytes after the last field"
        )
    return PublishAckFrame(
        status=status,
        request_id=request_id,
        message=message,
        code=code,
        retry=retry,
        reason=reason,
        retry_after_ms=retry_after_ms,
        node_id=node_id,
        addr=addr,
        generation=generation,
        offset=offset,
    )


class EventBatchLegacyFrame(msgspec.Struct, kw_only=True):
    """Legacy per-subscriber event batch; still decodable.

    Flags: BINARY_EVENT_BATCH (0x0002); legal values: 0x0002, 0x0022, 0x0822, 0x2002, 0x2022, 0x2822, 0x4002, 0x4022, 0x4822, 0x6002, 0x6022, 0x6822.
    """

    subscription_id: int
    base_offset: int | None = None
    """[EVENT_BATCH_OFFSETS] offset of event 0; event i is at base_offset + i"""
    skipped_before: int | None = None
    """[EVENT_BATCH_SKIPPED] offsets directly below base_offset that hold no event; written only when non-zero"""
    publisher: str | None = None
    """[EVENT_BATCH_PUBLISHER] token sub the batch was accepted from; at most 255 bytes; one publisher per frame"""
    timestamps: list[int] | None = None
    """[EVENT_BATCH_TIMESTAMPS] append time, microseconds since the Unix epoch"""
    payloads: list[bytes]


_EVENT_BATCH_LEGACY_HEAD_WITH_TIMESTAMP_MICROS = struct.Struct(">QI")
_EVENT_BATCH_LEGACY_HEAD = struct.Struct(">I")


def _encode_event_batch_legacy_parts(m: EventBatchLegacyFrame) -> tuple[int, list[Any]]:
    flags = 0x0002
    parts: list[Any] = [b""]
    _v = m.subscription_id
    _check_int("event_batch_legacy", "subscription_id", _v, 64)
    parts.append(_pack_u64(_v))

    if m.base_offset is not None:
        flags |= 0x0020
        _v = m.base_offset
        _check_int("event_batch_legacy", "base_offset", _v, 64)
        parts.append(_pack_u64(_v))

    if m.skipped_before:
        flags |= 0x0800
        _v = m.skipped_before
        _check_int("event_batch_legacy", "skipped_before", _v, 64)
        parts.append(_pack_u64(_v))

    if m.publisher is not None:
        flags |= 0x2000
        _b = _text("event_batch_legacy", "publisher", m.publisher, 255)
        parts.append(_pack_u8(len(_b)))
        parts.append(_b)

    timestamps = m.timestamps
    if timestamps is not None:
        if len(timestamps) != len(m.payloads):
            raise EncodeError("event_batch_legacy", "timestamps", "must have one entry per payload")
        flags |= 0x4000
        for _t in timestamps:
            _check_int("event_batch_legacy", "timestamps", _t, 64)
        _write_items(
            parts,
            "event_batch_legacy",
            "payloads",
            m.payloads,
            [_pack_u64(_t) for _t in timestamps],
        )
    else:
        _write_items(parts, "event_batch_legacy", "payloads", m.payloads, None)
    return flags, parts


def encode_event_batch_legacy(m: EventBatchLegacyFrame) -> tuple[int, bytes]:
    """(flags, payload) for a event_batch_legacy frame."""
    flags, parts = _encode_event_batch_legacy_parts(m)
    return flags, b"".join(parts)


def encode_event_batch_legacy_frame(m: EventBatchLegacyFrame) -> bytes:
    """The whole frame, header included."""
    flags, parts = _encode_event_batch_legacy_parts(m)
    return _frame(flags, parts)


def decode_event_batch_legacy(
    flags: int, payload: bytes | bytearray | memoryview
) -> EventBatchLegacyFrame:
    """Decode a event_batch_legacy payload whose header carried `flags` (already checked by
    flags.layout_of)."""
    data = payload if type(payload) is bytes else bytes(payload)
    end = len(data)
    pos = 0
    base_offset = None
    skipped_before = None
    publisher = None
    if end - pos < 8:
        raise _truncated("event_batch_legacy", "subscription_id", pos, 8, end)
    (_raw,) = _u64_from(data, pos)
    subscription_id = _raw
    pos += 8

    if flags & 0x0020:
        if end - pos < 8:
            raise _truncated("event_batch_legacy", "base_offset", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        base_offset = _raw
        pos += 8

    if flags & 0x0800:
        if end - pos < 8:
            raise _truncated("event_batch_legacy", "skipped_before", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        skipped_before = _raw
        pos += 8

    if flags & 0x2000:
        if end - pos < 1:
            raise _truncated("event_batch_legacy", "publisher", pos, 1, end)
        _n = data[pos]
        pos += 1
        if _n > end - pos:
            raise _too_long("event_batch_legacy", "publisher", pos - 1, _n, end)
        try:
            publisher = data[pos : pos + _n].decode()
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                "event_batch_legacy", "publisher", pos + exc.start, "invalid UTF-8"
            ) from None
        pos += _n

    if flags & 0x4000:
        _columns, payloads, pos = _read_items(
            data,
            pos,
            end,
            "event_batch_legacy",
            "payloads",
            "Q",
            _EVENT_BATCH_LEGACY_HEAD_WITH_TIMESTAMP_MICROS,
        )
        timestamps = _columns[0]
    else:
        _columns, payloads, pos = _read_items(
            data, pos, end, "event_batch_legacy", "payloads", "", _EVENT_BATCH_LEGACY_HEAD
        )
        timestamps = None
    if pos != end:
        raise TrailingBytesError(
            "event_batch_legacy", None, pos, f"{end - pos} bytes after the last field"
        )
    return EventBatchLegacyFrame(
        subscription_id=subscription_id,
        base_offset=base_offset,
        skipped_before=skipped_before,
        publisher=publisher,
        timestamps=timestamps,
        payloads=payloads,
    )


class EventBatchSharedFrame(msgspec.Struct, kw_only=True):
    """Encode-once event batch shared by every subscriber of a variant; the subscription is implied by the stream's event_stream_hello.

    Flags: BINARY_EVENT_BATCH_SHARED (0x0004); legal values: 0x0004, 0x0024, 0x0824, 0x2004, 0x2024, 0x2824, 0x4004, 0x4024, 0x4824, 0x6004, 0x6024, 0x6824.
    """

    base_offset: int | None = None
    """[EVENT_BATCH_OFFSETS] offset of event 0; event i is at base_offset + i"""
    skipped_before: int | None = None
    """[EVENT_BATCH_SKIPPED] offsets directly below base_offset that hold no event; written only when non-zero"""
    publisher: str | None = None
    """[EVENT_BATCH_PUBLISHER] token sub the batch was accepted from; at most 255 bytes; one publisher per frame"""
    timestamps: list[int] | None = None
    """[EVENT_BATCH_TIMESTAMPS] append time, microseconds since the Unix epoch"""
    payloads: list[bytes]


_EVENT_BATCH_SHARED_HEAD_WITH_TIMESTAMP_MICROS = struct.Struct(">QI")
_EVENT_BATCH_SHARED_HEAD = struct.Struct(">I")


def _encode_event_batch_shared_parts(m: EventBatchSharedFrame) -> tuple[int, list[Any]]:
    flags = 0x0004
    parts: list[Any] = [b""]
    if m.base_offset is not None:
        flags |= 0x0020
        _v = m.base_offset
        _check_int("event_batch_shared", "base_offset", _v, 64)
        parts.append(_pack_u64(_v))

    if m.skipped_before:
        flags |= 0x0800
        _v = m.skipped_before
        _check_int("event_batch_shared", "skipped_before", _v, 64)
        parts.append(_pack_u64(_v))

    if m.publisher is not None:
        flags |= 0x2000
        _b = _text("event_batch_shared", "publisher", m.publisher, 255)
        parts.append(_pack_u8(len(_b)))
        parts.append(_b)

    timestamps = m.timestamps
    if timestamps is not None:
        if len(timestamps) != len(m.payloads):
            raise EncodeError("event_batch_shared", "timestamps", "must have one entry per payload")
        flags |= 0x4000
        for _t in timestamps:
            _check_int("event_batch_shared", "timestamps", _t, 64)
        _write_items(
            parts,
            "event_batch_shared",
            "payloads",
            m.payloads,
            [_pack_u64(_t) for _t in timestamps],
        )
    else:
        _write_items(parts, "event_batch_shared", "payloads", m.payloads, None)
    return flags, parts


def encode_event_batch_shared(m: EventBatchSharedFrame) -> tuple[int, bytes]:
    """(flags, payload) for a event_batch_shared frame."""
    flags, parts = _encode_event_batch_shared_parts(m)
    return flags, b"".join(parts)


def encode_event_batch_shared_frame(m: EventBatchSharedFrame) -> bytes:
    """The whole frame, header included."""
    flags, parts = _encode_event_batch_shared_parts(m)
    return _frame(flags, parts)


def decode_event_batch_shared(
    flags: int, payload: bytes | bytearray | memoryview
) -> EventBatchSharedFrame:
    """Decode a event_batch_shared payload whose header carried `flags` (already checked by
    flags.layout_of)."""
    data = payload if type(payload) is bytes else bytes(payload)
    end = len(data)
    pos = 0
    base_offset = None
    skipped_before = None
    publisher = None
    if flags & 0x0020:
        if end - pos < 8:
            raise _truncated("event_batch_shared", "base_offset", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        base_offset = _raw
        pos += 8

    if flags & 0x0800:
        if end - pos < 8:
            raise _truncated("event_batch_shared", "skipped_before", pos, 8, end)
        (_raw,) = _u64_from(data, pos)
        skipped_before = _raw
        pos += 8

    if flags & 0x2000:
        if end - pos < 1:
            raise _truncated("event_batch_shared", "publisher", pos, 1, end)
        _n = data[pos]
        pos += 1
        if _n > end - pos:
            raise _too_long("event_batch_shared", "publisher", pos - 1, _n, end)
        try:
            publisher = data[pos : pos + _n].decode()
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                "event_batch_shared", "publisher", pos + exc.start, "invalid UTF-8"
            ) from None
        pos += _n

    if flags & 0x4000:
        _columns, payloads, pos = _read_items(
            data,
            pos,
            end,
            "event_batch_shared",
            "payloads",
            "Q",
            _EVENT_BATCH_SHARED_HEAD_WITH_TIMESTAMP_MICROS,
        )
        timestamps = _columns[0]
    else:
        _columns, payloads, pos = _read_items(
            data, pos, end, "event_batch_shared", "payloads", "", _EVENT_BATCH_SHARED_HEAD
        )
        timestamps = None
    if pos != end:
        raise TrailingBytesError(
            "event_batch_shared", None, pos, f"{end - pos} bytes after the last field"
        )
    return EventBatchSharedFrame(
        base_offset=base_offset,
        skipped_before=skipped_before,
        publisher=publisher,
        timestamps=timestamps,
        payloads=payloads,
    )


BinaryFrame = Union[
    PublishBatchFrame, PublishAckFrame, EventBatchLegacyFrame, EventBatchSharedFrame
]
"""Any binary-layout frame."""

BINARY_CLASSES: Mapping[str, type[BinaryFrame]] = MappingProxyType(
    {
        "publish_batch": PublishBatchFrame,
        "publish_ack": PublishAckFrame,
        "event_batch_legacy": EventBatchLegacyFrame,
        "event_batch_shared": EventBatchSharedFrame,
    }
)
DECODERS: Mapping[str, Callable[[int, bytes], BinaryFrame]] = MappingProxyType(
    {
        "publish_batch": decode_publish_batch,
        "publish_ack": decode_publish_ack,
        "event_batch_legacy": decode_event_batch_legacy,
        "event_batch_shared": decode_event_batch_shared,
    }
)
ENCODERS: Mapping[type, Callable[[Any], bytes]] = MappingProxyType(
    {
        PublishBatchFrame: encode_publish_batch_frame,
        PublishAckFrame: encode_publish_ack_frame,
        EventBatchLegacyFrame: encode_event_batch_legacy_frame,
        EventBatchSharedFrame: encode_event_batch_shared_frame,
    }
)
