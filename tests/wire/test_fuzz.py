"""Fuzzing the frame reader and every decoder: only typed wire errors, never a hang."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from felix_wire import FrameReader, encode_frame
from felix_wire.codec import decode_payload
from felix_wire.flags import LAYOUT_BY_FLAG
from felix_wire.frame import HEADER_SIZE, MAGIC
from felix_wire.messages import decode_message
from felix_wire.strategies import binary_frame, message
from felix_wire.wire_errors import WireError

ALL_FLAGS = sorted(LAYOUT_BY_FLAG)


@settings(max_examples=500)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=6))
def test_frame_reader_on_random_bytes(data: bytes, cuts: list[int]) -> None:
    reader = FrameReader(max_payload=1024)
    try:
        start = 0
        for cut in [*sorted(cuts), len(data)]:
            for frame in reader.feed(data[start:cut]):
                with contextlib.suppress(WireError):
                    decode_payload(frame.flags, frame.payload)
            start = max(start, cut)
        reader.close()
    except WireError:
        pass


@settings(max_examples=300)
@given(st.integers(0, 0xFFFF), st.binary(max_size=120))
def test_payload_decoders_on_random_bytes(flags: int, payload: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_payload(flags, payload)


@pytest.mark.parametrize("flags", ALL_FLAGS, ids=lambda f: f"{f:#06x}")
def test_mutated_valid_frames(flags: int) -> None:
    """Flip, cut and extend valid payloads of each layout: typed errors or a value, nothing else."""

    @settings(max_examples=60)
    @given(binary_frame(LAYOUT_BY_FLAG[flags], flags), st.data())
    def check(value: object, data: st.DataObject) -> None:
        payload = bytearray(encode_frame(value)[HEADER_SIZE:])  # type: ignore[arg-type]
        if payload:
            index = data.draw(st.integers(0, len(payload) - 1))
            payload[index] ^= data.draw(st.integers(1, 255))
        cut = data.draw(st.integers(0, len(payload)))
        for candidate in (bytes(payload), bytes(payload[:cut]), bytes(payload) + b"\x00"):
            with contextlib.suppress(WireError):
                decode_payload(flags, candidate)

    check()


@settings(max_examples=300)
@given(message(), st.data())
def test_mutated_json(value: object, data: st.DataObject) -> None:
    payload = bytearray(encode_frame(value)[HEADER_SIZE:])  # type: ignore[arg-type]
    index = data.draw(st.integers(0, len(payload) - 1))
    payload[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        decode_message(bytes(payload))


def test_huge_declared_length_does_not_allocate_or_wait() -> None:
    reader = FrameReader()
    header = MAGIC.to_bytes(4, "big") + (1).to_bytes(2, "big") + (0).to_bytes(2, "big")
    with pytest.raises(WireError):
        reader.feed(header + (2**32 - 1).to_bytes(4, "big"))
