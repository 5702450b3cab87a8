"""Worked frames A-H, built from fields, compared to their bytes.

The hex strings were computed once, field by field, from the layouts of the protocol
document (the same encoder reproduced every upstream binary vector); they cover the
binary layouts the upstream vectors do not (failed and owner-naming acks, shared and
legacy event batches with every modifier).
"""

from __future__ import annotations

import pytest

from felix_wire import FrameReader, decode_frame, encode_frame
from felix_wire.binary import (
    AckStatus,
    BinaryAckMode,
    EventBatchLegacyFrame,
    EventBatchSharedFrame,
    PublishAckFrame,
    PublishBatchFrame,
)
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.messages import PublishOk

EXAMPLES = {
    "A json publish_ok with offset": (
        PublishOk(request_id=7, offset=42),
        "464c583100010000000000307b2274797065223a227075626c6973685f6f6b222c22726571756573745f6964223a372c226f6666736574223a34327d",
    ),
    "B plain binary publish": (
        PublishBatchFrame(tenant_id="t1", namespace="ns", stream="s", payloads=[b"a", b"bc"]),
        "464c5831000100010000001a0002743100026e73000173000000020000000161000000026263",
    ),
    "C acked idempotent keyed publish": (
        PublishBatchFrame(
            request_id=5,
            ack_mode=BinaryAckMode.PER_BATCH,
            producer_id=0x0102030405060708,
            sequence=3,
            key=b"k",
            tenant_id="t",
            namespace="n",
            stream="s",
            payloads=[b"x"],
        ),
        "464c5831000101490000002e0000000000000005020102030405060708000000000000000300016b00017400016e000173000000010000000178",
    ),
    "D failed ack with code and detail": (
        PublishAckFrame(
            status=AckStatus.ERROR,
            request_id=9,
            message="moving",
            code=ErrorCode.SHARD_UNAVAILABLE,
            retry=RetryClass.RETRY,
            reason="moving",
            retry_after_ms=250,
        ),
        "464c5831000106100000002401000000000000000900066d6f76696e6700050100066d6f76696e6700000000000000fa",
    ),
    "E ok ack with owner and offset": (
        PublishAckFrame(
            status=AckStatus.OK, request_id=7, message="", node_id="b2", generation=4, offset=100
        ),
        "464c58310001109000000021000000000000000007000000026232000000000000000000040000000000000064",
    ),
    "F shared batch with everything": (
        EventBatchSharedFrame(
            base_offset=10,
            skipped_before=1,
            publisher="p",
            payloads=[b"a", b"b"],
            timestamps=[1700000000000000, 1700000000000000],
        ),
        "464c58310001682400000030000000000000000a000000000000000101700000000200060a24181e4000000000016100060a24181e40000000000162",
    ),
    "G legacy batch with offsets": (
        EventBatchLegacyFrame(subscription_id=3, base_offset=5, payloads=[b"hi"]),
        "464c5831000100220000001a0000000000000003000000000000000500000001000000026869",
    ),
    "H plain shared batch": (
        EventBatchSharedFrame(payloads=[b"hi"]),
        "464c5831000100040000000a00000001000000026869",
    ),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_worked_example(name: str) -> None:
    value, hex_frame = EXAMPLES[name]
    frame = bytes.fromhex(hex_frame)
    assert encode_frame(value) == frame  # type: ignore[arg-type]
    assert decode_frame(FrameReader().feed(frame)[0]) == value
