"""The payloads a cache shard writes to its log, one per change.

Every record payload starts with a fixed 21-byte head, then the key and the
value (big-endian, like the storage format):

| bytes  | field         | type | meaning                                             |
|--------|---------------|------|-----------------------------------------------------|
| 0      | kind          | u8   | PUT, DELETE, COPY or COUNTER (below)                |
| 1-8    | version       | u64  | PUT/COPY: the entry's version; 0 otherwise          |
| 9-16   | expires_at_ms | u64  | PUT/COPY: absolute Unix ms, 0 = never; 0 otherwise  |
| 17-20  | key_length    | u32  | bytes of the UTF-8 key that follows                 |
| 21-... | key, value    |      | COUNTER: the value is the sum as an 8-byte i64      |

- PUT: a client's write; its version is the offset of this record.
- DELETE: a tombstone (a client's delete, an expiry or an eviction).
- COPY: compaction carried a live entry forward; it keeps the version of the
  PUT it copies and is *not* a change, so watches never replay it.
- COUNTER: a counter's new sum. Sums rather than deltas, so that replaying a
  log (or a compacted copy of it) needs no history before the last record.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = [
    "RECORD_HEAD_BYTES",
    "CacheRecord",
    "Kind",
    "decode_record",
    "encode_counter",
    "encode_record",
]

_HEAD = struct.Struct(">BQQI")
_SUM = struct.Struct(">q")
RECORD_HEAD_BYTES = _HEAD.size


class Kind(enum.IntEnum):
    PUT = 1
    DELETE = 2
    COPY = 3
    COUNTER = 4


@dataclass(frozen=True, slots=True)
class CacheRecord:
    kind: Kind
    key: str
    value: bytes = b""
    version: int = 0
    expires_at_ms: int = 0

    @property
    def counter_sum(self) -> int:
        (total,) = _SUM.unpack(self.value)
        return int(total)


def encode_record(record: CacheRecord) -> bytes:
    key = record.key.encode()
    head = _HEAD.pack(record.kind, record.version, record.expires_at_ms, len(key))
    return head + key + record.value


def encode_counter(key: str, total: int) -> bytes:
    return encode_record(CacheRecord(Kind.COUNTER, key, _SUM.pack(total)))


def decode_record(payload: bytes) -> CacheRecord:
    """The record in a log payload; ValueError when it is not one of ours."""
    if len(payload) < RECORD_HEAD_BYTES:
        raise ValueError(f"cache record of {len(payload)} bytes is shorter than its head")
    kind, version, expires_at_ms, key_length = _HEAD.unpack_from(payload)
    end = RECORD_HEAD_BYTES + key_length
    if end > len(payload):
        raise ValueError("cache record key runs past the payload")
    value = payload[end:]
    record = CacheRecord(
        Kind(kind), payload[RECORD_HEAD_BYTES:end].decode(), value, version, expires_at_ms
    )
    if record.kind is Kind.COUNTER and len(value) != _SUM.size:
        raise ValueError("counter record without an 8-byte sum")
    return record
