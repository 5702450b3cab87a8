# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""One entry point per direction: bytes of a frame to a typed value and back.

`decode_payload(flags, payload)` validates the flags, then decodes JSON (flags 0)
or the binary layout the flags select. `encode_frame(value)` lays out any message
or binary frame with its header.
"""

from __future__ import annotations

from typing import Union

from .binary import DECODERS, ENCODERS, BinaryFrame
from .flags import layout_of
from .frame import JSON_FLAGS, Frame, encode_header
from .messages import Message, Unknown, decode_message, encode_message

__all__ = ["Decoded", "decode_payload", "decode_frame", "encode_frame", "layout_name"]

Decoded = Union[Message, Unknown, BinaryFrame]
"""What a frame decodes to."""


def layout_name(flags: int) -> str:
    """ "json" or the binary layout's name; raises the typed flag errors."""
    return layout_of(flags) or "json"


def decode_payload(flags: int, payload: bytes | bytearray | memoryview) -> Decoded:
    layout = layout_of(flags)
    if layout is None:
        return decode_message(payload)
    return DECODERS[layout](flags, payload)


def decode_frame(frame: Frame) -> Decoded:
    return decode_payload(frame.flags, frame.payload)


def encode_frame(value: Message | BinaryFrame) -> bytes:
    """The whole frame, header included."""
    encoder = ENCODERS.get(type(value))
    if encoder is not None:
        return encoder(value)
    payload = encode_message(value)
    return encode_header(JSON_FLAGS, len(payload)) + payload
