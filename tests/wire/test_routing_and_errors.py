"""Routing vectors and the remote error classes."""

from __future__ import annotations

import pytest

from felix_wire.errors import (
    BrokerError,
    ErrorCode,
    ForbiddenError,
    NotFoundError,
    RetryClass,
    UnknownCodeError,
    broker_error,
    error_code_from_wire,
    retry_class_from_wire,
)
from felix_wire.routing import ROUTING_VECTORS, finalize, fnv1a64, shard_for_key


@pytest.mark.parametrize(("shards", "key", "modulo", "jump"), ROUTING_VECTORS)
def test_routing_vectors(shards: int, key: bytes | None, modulo: int, jump: int) -> None:
    assert shard_for_key(key, shards, "modulo") == modulo
    assert shard_for_key(key, shards, "jump_hash") == jump


def test_hash_intermediates() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert finalize(fnv1a64(b"")) == 0xF52A15E9A9B5E89B
    assert fnv1a64(b"k7") == 0x08BE1107B5622827
    assert finalize(fnv1a64(b"k7")) == 0x83A57E6FCB6B0C94


def test_one_exception_class_per_code_with_its_retry_class() -> None:
    err = broker_error("stream not found", "not_found", None)
    assert isinstance(err, NotFoundError) and err.retry is RetryClass.RETRY_AFTER
    sent = broker_error("nope", 2, 2)
    assert isinstance(sent, ForbiddenError) and sent.retry is RetryClass.RETRY_AFTER
    unknown = broker_error("x", "brand_new", "outcome_unknown")
    assert isinstance(unknown, UnknownCodeError) and unknown.code == "brand_new"
    assert unknown.retry is RetryClass.OUTCOME_UNKNOWN and unknown.retry.may_have_applied
    numbered = broker_error("x", 99, 9)
    assert numbered.code == "code_99" and numbered.retry is RetryClass.FATAL
    plain = broker_error("unauthorized")
    assert type(plain) is BrokerError and plain.code is None


def test_wire_spellings() -> None:
    assert retry_class_from_wire("later") is RetryClass.FATAL
    assert retry_class_from_wire(None) is None
    assert error_code_from_wire("stale_claim") is ErrorCode.STALE_CLAIM
    assert ErrorCode.OVERLOADED.wire == "overloaded"
