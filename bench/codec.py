"""Codec benchmark: the generated wire layer against naive baselines, in one run.

Figures (median of several rounds, each timing many iterations):
- binary publish batch of 64 x 100 B: encode and decode, MB/s and records/s;
- shared event batch with offsets, 64 x 100 B: encode and decode;
- a small tagged JSON message: encode and decode, messages/s.
Each is printed beside a naive baseline measured in the same run: a per-field
`struct.unpack` loop over slices for the binary layouts, stdlib `json` (+ base64)
for JSON. Ratios, not absolute numbers, are what to compare across machines.

    python bench/codec.py [--rounds 7] [--seconds 0.3]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import struct
import time
from collections.abc import Callable

from felix_wire.binary import (
    EventBatchSharedFrame,
    PublishBatchFrame,
    decode_event_batch_shared,
    decode_publish_batch,
    encode_event_batch_shared,
    encode_publish_batch,
)
from felix_wire.messages import CacheValue, decode_message, encode_message

RECORDS = 64
RECORD_BYTES = 100
PAYLOADS = [bytes([i]) * RECORD_BYTES for i in range(RECORDS)]


# --- naive baselines -------------------------------------------------------------


def naive_encode_publish(tenant: str, namespace: str, stream: str, payloads: list[bytes]) -> bytes:
    out = b""
    for text in (tenant, namespace, stream):
        raw = text.encode()
        out += struct.pack(">H", len(raw)) + raw
    out += struct.pack(">I", len(payloads))
    for payload in payloads:
        out += struct.pack(">I", len(payload)) + payload
    return out


def naive_decode_publish(data: bytes) -> tuple[str, str, str, list[bytes]]:
    pos = 0
    names = []
    for _ in range(3):
        (n,) = struct.unpack(">H", data[pos : pos + 2])
        pos += 2
        names.append(data[pos : pos + n].decode())
        pos += n
    (count,) = struct.unpack(">I", data[pos : pos + 4])
    pos += 4
    payloads = []
    for _ in range(count):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        pos += 4
        payloads.append(data[pos : pos + n])
        pos += n
    return names[0], names[1], names[2], payloads


def naive_encode_events(base_offset: int, payloads: list[bytes]) -> bytes:
    out = struct.pack(">Q", base_offset) + struct.pack(">I", len(payloads))
    for payload in payloads:
        out += struct.pack(">I", len(payload)) + payload
    return out


def naive_decode_events(data: bytes) -> tuple[int, list[bytes]]:
    (base,) = struct.unpack(">Q", data[0:8])
    (count,) = struct.unpack(">I", data[8:12])
    pos = 12
    payloads = []
    for _ in range(count):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        pos += 4
        payloads.append(data[pos : pos + n])
        pos += n
    return base, payloads


JSON_VALUE = {
    "type": "cache_value",
    "tenant_id": "t1",
    "namespace": "default",
    "cache": "primary",
    "key": "session-42",
    "value": base64.b64encode(b"x" * 64).decode(),
    "request_id": 7,
}


def stdlib_json_encode() -> bytes:
    return json.dumps(JSON_VALUE, separators=(",", ":")).encode()


def stdlib_json_decode(data: bytes) -> dict[str, object]:
    value: dict[str, object] = json.loads(data)
    value["value"] = base64.b64decode(str(value["value"]))
    return value


# --- timing ------------------------------------------------------------------------


def rate(fn: Callable[[], object], seconds: float, rounds: int) -> float:
    """Calls per second: median over `rounds`, each timing a batch sized to ~`seconds`."""
    fn()
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < seconds / 4:
        fn()
        calls += 1
    batch = max(10, int(calls * 4))
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        results.append(batch / (time.perf_counter() - t0))
    return statistics.median(results)


def row(label: str, ours: float, naive: float, records: int, nbytes: int) -> None:
    print(
        f"{label:<34} {ours * records:>14,.0f} rec/s {ours * nbytes / 1e6:>9.1f} MB/s"
        f"   naive {naive * records:>12,.0f} rec/s {naive * nbytes / 1e6:>8.1f} MB/s"
        f"   ratio {ours / naive:5.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.3)
    args = parser.parse_args()
    rounds, seconds = args.rounds, args.seconds

    batch = PublishBatchFrame(
        tenant_id="t1", namespace="default", stream="orders", payloads=PAYLOADS
    )
    flags, publish_payload = encode_publish_batch(batch)
    assert naive_encode_publish("t1", "default", "orders", PAYLOADS) == publish_payload
    assert (
        naive_decode_publish(publish_payload)[3]
        == decode_publish_batch(flags, publish_payload).payloads
    )

    events = EventBatchSharedFrame(base_offset=1_000_000, payloads=PAYLOADS)
    event_flags, event_payload = encode_event_batch_shared(events)
    assert naive_encode_events(1_000_000, PAYLOADS) == event_payload
    assert (
        naive_decode_events(event_payload)[1]
        == decode_event_batch_shared(event_flags, event_payload).payloads
    )

    message = CacheValue(
        tenant_id="t1",
        namespace="default",
        cache="primary",
        key="session-42",
        value=b"x" * 64,
        request_id=7,
    )
    json_payload = encode_message(message)
    assert json.loads(json_payload) == JSON_VALUE

    size = len(publish_payload)
    print(f"binary batches: {RECORDS} x {RECORD_BYTES} B ({size} B payload)")
    print(f"median of {rounds} rounds\n")
    row(
        "publish batch encode",
        rate(lambda: encode_publish_batch(batch), seconds, rounds),
        rate(lambda: naive_encode_publish("t1", "default", "orders", PAYLOADS), seconds, rounds),
        RECORDS,
        size,
    )
    row(
        "publish batch decode",
        rate(lambda: decode_publish_batch(flags, publish_payload), seconds, rounds),
        rate(lambda: naive_decode_publish(publish_payload), seconds, rounds),
        RECORDS,
        size,
    )
    row(
        "shared event batch (offsets) encode",
        rate(lambda: encode_event_batch_shared(events), seconds, rounds),
        rate(lambda: naive_encode_events(1_000_000, PAYLOADS), seconds, rounds),
        RECORDS,
        len(event_payload),
    )
    row(
        "shared event batch (offsets) decode",
        rate(lambda: decode_event_batch_shared(event_flags, event_payload), seconds, rounds),
        rate(lambda: naive_decode_events(event_payload), seconds, rounds),
        RECORDS,
        len(event_payload),
    )
    encode_rate = rate(lambda: encode_message(message), seconds, rounds)
    decode_rate = rate(lambda: decode_message(json_payload), seconds, rounds)
    naive_encode = rate(stdlib_json_encode, seconds, rounds)
    naive_decode = rate(lambda: stdlib_json_decode(json_payload), seconds, rounds)
    print()
    for label, ours, naive in (
        ("json cache_value encode", encode_rate, naive_encode),
        ("json cache_value decode", decode_rate, naive_decode),
    ):
        print(
            f"{label:<34} {ours:>14,.0f} msg/s   stdlib json {naive:>12,.0f} msg/s"
            f"   ratio {ours / naive:5.2f}x"
        )


if __name__ == "__main__":
    main()
