"""The catalog sync feed's shapes, as both sides read them (felix_common.feed)."""

from __future__ import annotations

import json

import msgspec
import pytest

from felix_common import feed
from felix_common.catalog import Routing, StreamSpec


def test_a_page_round_trips_and_a_misshapen_one_is_a_feed_error() -> None:
    page = feed.ChangePage(
        seq=7,
        reset=False,
        changes=[feed.Change(7, "put", "stream", "t1", "ns", "s", {"name": "s", "shards": 2})],
    )
    raw = json.dumps(msgspec.to_builtins(page)).encode()
    assert feed.decode_changes(raw) == page
    for bad in (
        b'{"seq": 1, "reset": false}',  # no changes
        b'{"seq": "1", "reset": false, "changes": []}',
        b'{"seq": 1, "reset": false, "changes": [{"seq": 1, "op": "upsert", "kind": "stream",'
        b' "tenant": "t", "namespace": "n", "name": "s"}]}',
        b"[" * 10_000,
    ):
        with pytest.raises(feed.FeedError):
            feed.decode_changes(bad)
    with pytest.raises(feed.FeedError):
        feed.decode_snapshot(b'{"seq": 1, "tenants": ["t1"]}')


def test_definitions_round_trip_through_their_bodies() -> None:
    definition = feed.validate_stream(
        "t1",
        "ns",
        {"name": "orders", "shards": 4, "durability": "durable", "routing": "jump_hash"},
    )
    body = feed.stream_body(definition)
    assert feed.stream_spec("t1", "ns", body) == StreamSpec(
        "t1", "ns", "orders", durable=True, shards=4, routing=Routing.JUMP_HASH
    )
    cache = feed.validate_cache("t1", "ns", {"name": "c", "shards": 3})
    assert feed.cache_spec("t1", "ns", feed.cache_body(cache)) == cache


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "a/b"}, "stream.name"),
        ({"name": "s", "shards": 0}, "stream.shards"),
        ({"name": "s", "shards": True}, "stream.shards"),
        ({"name": "s", "durability": "disk"}, "stream.durability"),
        ({"name": "s", "retention": {"max_age_ms": 0}}, "stream.retention.max_age_ms"),
        ({"name": "s", "ttl": 1}, "unknown field 'ttl'"),
        ("s", "expected a JSON object"),
    ],
)
def test_invalid_definitions_name_the_field(body: object, field: str) -> None:
    with pytest.raises(feed.InvalidDefinition, match=field):
        feed.validate_stream("t1", "ns", body)


def test_the_jwks_path_escapes_the_tenant() -> None:
    assert feed.jwks_path("t1") == "/v1/tenants/t1/.well-known/jwks.json"
    assert feed.jwks_path("a/b") == "/v1/tenants/a%2Fb/.well-known/jwks.json"
