"""Interop with the official Felix client (PyPI felix-client 0.6.2, a Rust client) against
`felix-broker fixture`: the bar is that real Felix clients work."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

felix = pytest.importorskip(
    "felix", reason="the official felix-client package is a test dependency"
)

pytestmark = pytest.mark.timeout(60)


def client(fx: dict[str, Any], **kw: Any) -> Any:
    return felix.Client(
        fx["addrs"],
        tenant_id=fx["tenant_id"],
        token=kw.pop("token", fx["token"]),
        ca_file=fx["ca_file"],
        **kw,
    )


def test_publish_subscribe_latest_and_earliest(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx)
    ns, stream = fx["namespace"], fx["memory_stream"]
    latest = c.subscribe(fx["tenant_id"], ns, stream)
    earliest = c.subscribe(fx["tenant_id"], ns, stream, start="earliest")
    assert c.publish(fx["tenant_id"], ns, stream, b"acked") is None  # in-memory: no offset
    assert c.publish(fx["tenant_id"], ns, stream, b"none", ack="none") is None
    assert c.publish(fx["tenant_id"], ns, stream, b"keyed", key=b"k1", ack="per_batch") is None
    for subscription in (latest, earliest):
        got = [subscription.next_event(timeout=10) for _ in range(3)]
        assert [e.payload for e in got] == [b"acked", b"none", b"keyed"]
        subscription.close()


def test_keyed_publish_to_a_sharded_stream(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx)
    assert c.stream_shards(fx["tenant_id"], fx["namespace"], fx["durable_stream"]) == 4
    c.publish(fx["tenant_id"], fx["namespace"], fx["durable_stream"], b"x", key=b"customer-1")


def test_unknown_stream_is_not_found(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx)
    with pytest.raises(felix.NotFoundError) as info:
        c.publish(fx["tenant_id"], fx["namespace"], fx["missing_stream"], b"x")
    assert (info.value.code, info.value.retry) == ("not_found", "retry_after")


def test_bad_forged_and_unauthorized_tokens_are_auth_errors(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    with pytest.raises(felix.AuthError) as info:
        client(fx, token="garbage")
    assert info.value.code == "unauthenticated"
    request = urllib.request.Request(
        fx["control_url"] + "/tokens",
        data=json.dumps({"ttl_secs": 60, "forged": True}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        forged = json.loads(response.read())["token"]
    with pytest.raises(felix.AuthError):
        client(fx, token=forged)
    limited = client(fx, token=fx["unauthorized_token"])
    with pytest.raises(felix.AuthError) as info:
        limited.publish(fx["tenant_id"], fx["namespace"], fx["memory_stream"], b"x")
    assert info.value.code == "forbidden"


def test_alpn_offering_client(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx, offer_alpn=True)
    c.publish(fx["tenant_id"], fx["namespace"], fx["memory_stream"], b"alpn")


def test_cache_put_get_delete(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx)
    t, ns, cache = fx["tenant_id"], fx["namespace"], fx["cache"]
    c.cache_put(t, ns, cache, "k", b"v1")
    assert c.cache_get(t, ns, cache, "k") == b"v1"
    assert c.cache_delete(t, ns, cache, "k") == b"v1"
    assert c.cache_get(t, ns, cache, "k") is None


@pytest.fixture(scope="module")
def acking_fixture(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A broker whose acks wait for the write (and so carry offsets)."""
    from ..conftest import start_fixture_broker, stop_fixture_broker

    process, document = start_fixture_broker(
        tmp_path_factory.mktemp("acking"),
        ("FELIX_ACK_ON_COMMIT", "true"),
        ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
    )
    try:
        yield document
    finally:
        stop_fixture_broker(process)


def test_durable_offsets_earliest_and_resume(acking_fixture: dict[str, Any]) -> None:
    fx = acking_fixture
    c = client(fx)
    t, ns, stream = fx["tenant_id"], fx["namespace"], fx["durable_stream"]
    offsets = [c.publish(t, ns, stream, f"m{i}".encode()) for i in range(4)]
    assert offsets == [0, 1, 2, 3]  # publish() returns the record's offset
    earliest = c.subscribe(t, ns, stream, start="earliest")
    got = [earliest.next_event(timeout=10) for _ in range(4)]
    assert [(e.payload, e.offset) for e in got] == [(f"m{i}".encode(), i) for i in range(4)]
    assert c.publish(t, ns, stream, b"live") == 4
    live = earliest.next_event(timeout=10)
    assert (live.payload, live.offset) == (b"live", 4)
    resumed = c.subscribe(t, ns, stream, start=2)
    got = [resumed.next_event(timeout=10) for _ in range(3)]
    assert [e.offset for e in got] == [2, 3, 4]
    with pytest.raises(felix.CursorError):
        c.subscribe(t, ns, stream, start=99)
    earliest.close()
    resumed.close()
