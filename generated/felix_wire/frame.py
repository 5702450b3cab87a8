# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""The frame envelope: Every message, JSON or binary, is one frame - a fixed 12-byte header then `length` payload bytes. Frames are concatenated back to back on a QUIC stream.

Header layout (big-endian):
  magic: u32 - 0x464C5831 (ASCII FLX1); anything else is rejected
  version: u16 - 1; any other value is rejected - capabilities are negotiated by flags, never by bumping this
  flags: u16 - payload layout selector; 0 = one UTF-8 JSON object
  length: u32 - payload byte count
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .wire_errors import (
    BadMagicError,
    FrameTooLargeError,
    TruncatedFrameError,
    UnsupportedVersionError,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER_SIZE",
    "JSON_FLAGS",
    "PREAUTH_MAX_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_ENCODABLE_PAYLOAD",
    "MAX_JSON_DEPTH",
    "Frame",
    "FrameHeader",
    "FrameReader",
    "encode_header",
    "decode_header",
    "frame_bytes",
]

MAGIC = 0x464C5831  # FLX1
VERSION = 1
JSON_FLAGS = 0
# payload cap on a stream that has not authenticated yet; a larger header length ends the stream on the header alone
PREAUTH_MAX_FRAME_BYTES = 65536
# default cap on an authenticated stream's frame payload (configurable)
MAX_FRAME_BYTES = 16777216
# encoders must not exceed u32::MAX payload bytes
MAX_ENCODABLE_PAYLOAD = 4294967295
# deepest nesting of arrays and objects a JSON payload may have; checked before decoding (a deeper payload is malformed JSON) so that no decoder recurses on a stranger's input
MAX_JSON_DEPTH = 64

_HEADER = struct.Struct(">IHHI")
HEADER_SIZE = _HEADER.size
_PACK_HEADER = _HEADER.pack
_UNPACK_HEADER = _HEADER.unpack_from


class FrameHeader(NamedTuple):
    flags: int
    length: int


class Frame(NamedTuple):
    """One whole frame: the header's flags and the payload bytes."""

    flags: int
    payload: bytes


def encode_header(flags: int, length: int) -> bytes:
    """The 12 header bytes for a payload of `length` bytes."""
    if not 0 <= length <= MAX_ENCODABLE_PAYLOAD:
        raise ValueError(f"payload length {length} is outside 0..{MAX_ENCODABLE_PAYLOAD}")
    return _PACK_HEADER(MAGIC, VERSION, flags, length)


def frame_bytes(flags: int, payload: bytes) -> bytes:
    """Header + payload as one bytes object."""
    return encode_header(flags, len(payload)) + payload


def decode_header(
    data: bytes | bytearray | memoryview, max_payload: int = MAX_FRAME_BYTES
) -> FrameHeader:
    """Check and decode a 12-byte header (magic, version and length limit)."""
    if len(data) < HEADER_SIZE:
        raise TruncatedFrameError(len(data), HEADER_SIZE)
    magic, version, flags, length = _UNPACK_HEADER(data, 0)
    if magic != MAGIC:
        raise BadMagicError(magic)
    if version != VERSION:
        raise UnsupportedVersionError(version)
    if length > max_payload:
        raise FrameTooLargeError(length, max_payload)
    return FrameHeader(flags, length)


class FrameReader:
    """Incremental frame parser for one QUIC stream.

    A QUIC read is not a frame: `feed` takes arbitrary chunks and returns every
    frame completed so far, keeping the rest. Header problems (magic, version,
    a length over `max_payload`) raise as soon as the 12 header bytes are in,
    before the payload is buffered. Buffered bytes are bounded by one header plus
    `max_payload`. Call `close()` at the end of the stream: a partial frame then
    raises TruncatedFrameError.
    """

    __slots__ = ("_buffer", "max_payload")

    def __init__(self, max_payload: int = MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self.max_payload = max_payload

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        frames: list[Frame] = []
        if self._buffer:
            self._buffer += data
            source: bytes | bytearray | memoryview = self._buffer
        else:
            source = data  # common case: parse the chunk in place, copy only the tail
        end = len(source)
        pos = 0
        limit = self.max_payload
        with memoryview(source) as view:
            while end - pos >= HEADER_SIZE:
                magic, version, flags, length = _UNPACK_HEADER(view, pos)
                if magic != MAGIC:
                    raise BadMagicError(magic)
                if version != VERSION:
                    raise UnsupportedVersionError(version)
                if length > limit:
                    raise FrameTooLargeError(length, limit)
                start = pos + HEADER_SIZE
                stop = start + length
                if stop > end:
                    break
                frames.append(Frame(flags, bytes(view[start:stop])))
                pos = stop
            rest = b"" if source is self._buffer or pos >= end else bytes(view[pos:])
        if source is self._buffer:
            del self._buffer[:pos]
        elif rest:
            self._buffer += rest
        return frames

    def close(self) -> None:
        """The stream ended: fail if a partial frame is left."""
        if self._buffer:
            needed = None
            if len(self._buffer) >= HEADER_SIZE:
                needed = HEADER_SIZE + _UNPACK_HEADER(self._buffer, 0)[3]
            raise TruncatedFrameError(len(self._buffer), needed)
