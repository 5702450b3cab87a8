"""Every upstream Felix wire vector decodes to its documented fields and re-encodes byte-exact."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from felix_wire import FrameReader, decode_frame, encode_frame
from felix_wire.binary import PublishAckFrame, PublishBatchFrame
from felix_wire.frame import HEADER_SIZE, decode_header
from felix_wire.messages import decode_message

from ..support.paths import UPSTREAM_VECTORS as VECTORS

VECTOR_FILES = sorted(VECTORS.glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_all_seventeen_vectors_are_present() -> None:
    assert len(VECTOR_FILES) == 17, [p.name for p in VECTOR_FILES]


def test_vendored_vectors_are_the_upstream_bytes() -> None:
    """Every vendored file is pinned by SHA256SUMS, and nothing unpinned sits beside them."""
    sums = {}
    for line in (VECTORS / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        sums[name] = digest
    data = {p.name for p in VECTORS.iterdir() if p.suffix in (".hex", ".json")}
    assert data == set(sums)
    for name, digest in sums.items():
        assert hashlib.sha256((VECTORS / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector_decodes_and_reencodes_byte_exact(path: Path) -> None:
    vector = _load(path)
    frame = bytes.fromhex(vector["frame_hex"])
    hex_file = path.with_suffix(".hex")
    if hex_file.exists():
        # Some .hex files end with a newline that is not data (decision hex-trailing-newline).
        assert bytes.fromhex(hex_file.read_text().strip()) == frame
    assert frame[HEADER_SIZE:] == bytes.fromhex(vector["payload_hex"])
    header = decode_header(frame)
    assert header.length == len(frame) - HEADER_SIZE

    frames = FrameReader().feed(frame)
    assert len(frames) == 1
    decoded = decode_frame(frames[0])
    assert encode_frame(decoded) == frame

    kind = vector.get("kind", "json_message")
    if kind == "json_message":
        assert header.flags == 0
        payload_json = vector["payload_json"]
        assert frame[HEADER_SIZE:] == payload_json.encode()
        assert msgspec.to_builtins(decoded) == json.loads(payload_json)
    else:
        assert header.flags == vector["flags"]
        _check_binary_fields(kind, decoded, vector)


def _check_binary_fields(kind: str, decoded: object, vector: dict[str, Any]) -> None:
    if kind in ("binary_publish_batch", "binary_acked_publish_batch"):
        assert isinstance(decoded, PublishBatchFrame)
        assert decoded.tenant_id == vector["tenant_id"]
        assert decoded.namespace == vector["namespace"]
        assert decoded.stream == vector["stream"]
        assert [p.decode() for p in decoded.payloads] == vector["payloads_utf8"]
        if "key_utf8" in vector:
            assert decoded.key == vector["key_utf8"].encode()
        else:
            assert decoded.key is None
        if "request_id" in vector:
            assert decoded.request_id == vector["request_id"]
            assert decoded.ack_mode is not None
            assert decoded.ack_mode.name.lower() == vector["ack_mode"]
    elif kind == "binary_publish_ack":
        assert isinstance(decoded, PublishAckFrame)
        assert decoded.request_id == vector["request_id"]
        assert decoded.status.name.lower() == vector["status"]
        # The vectors write the empty message of a successful ack as null.
        assert decoded.message == (vector.get("message") or "")
    else:  # pragma: no cover - a new upstream kind must be taught to this test
        pytest.fail(f"unknown vector kind {kind}")


def test_json_vectors_keep_the_reference_key_order() -> None:
    for path in VECTOR_FILES:
        vector = _load(path)
        if vector.get("kind", "json_message") != "json_message":
            continue
        text = vector["payload_json"]
        assert text.startswith('{"type":')
        assert msgspec.json.encode(decode_message(text.encode())) == text.encode()


def test_base64_fields_decode_to_bytes() -> None:
    decoded = decode_message(bytes.fromhex(_load(VECTORS / "publish.json")["payload_hex"]))
    assert decoded.payload == base64.b64decode("aGVsbG8=")  # type: ignore[union-attr]
