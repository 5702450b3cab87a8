# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Routing keys to shards: Routing keys to shards. No key, or a shard count of at most 1, is shard 0; an empty key is a key.

Hash: 64-bit FNV-1a over the key's raw bytes, then a finalizer; `modulo` takes the
finalized hash modulo the shard count, `jump_hash` runs Lamping-Veach jump
consistent hashing on it (in IEEE double arithmetic, like the reference).
A stream's mode is fixed at creation; caches route by modulo.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "RoutingMode",
    "DEFAULT_MODE",
    "CACHE_MODE",
    "fnv1a64",
    "finalize",
    "route_hash",
    "shard_for_key",
    "ROUTING_VECTORS",
]

RoutingMode = Literal["modulo", "jump_hash"]
DEFAULT_MODE: RoutingMode = "modulo"
CACHE_MODE: RoutingMode = "modulo"
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a64(key: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in key:
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    return h


def finalize(h: int) -> int:
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _MASK
    h ^= h >> 31
    return h


def route_hash(key: bytes) -> int:
    return finalize(fnv1a64(key))


def _jump(key: int, shards: int) -> int:
    bucket = -1
    j = 0
    while j < shards:
        bucket = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((bucket + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return bucket


def shard_for_key(key: bytes | None, shards: int, mode: RoutingMode = DEFAULT_MODE) -> int:
    """The shard a routing key lands on. No key, or at most one shard, is shard 0."""
    if key is None or shards <= 1:
        return 0
    h = route_hash(key)
    if mode == "jump_hash":
        return _jump(h, shards)
    return h % shards


# Frozen values from the protocol's contract: (shards, key, modulo, jump_hash).
ROUTING_VECTORS: tuple[tuple[int, bytes | None, int, int], ...] = (
    (8, b"customer-0", 0, 3),
    (8, b"customer-1", 3, 0),
    (8, b"customer-2", 6, 5),
    (8, b"customer-4", 2, 2),
    (8, b"customer-6", 4, 7),
    (12, b"k0", 6, 3),
    (12, b"k1", 10, 4),
    (4, b"", 3, 0),
    (4, b"k7", 0, 2),
    (1, b"anything", 0, 0),
    (0, b"anything", 0, 0),
    (16, None, 0, 0),
)
