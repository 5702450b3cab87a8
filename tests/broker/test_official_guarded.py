"""The official client (felix-client 0.6.2) against our broker: atomic commits, state reads,
and keyed publishing with publish_width (its API has no idempotent or conditional publish)."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

felix = pytest.importorskip(
    "felix", reason="the official felix-client package is a test dependency"
)

pytestmark = pytest.mark.timeout(60)


def client(fx: dict[str, Any]) -> Any:
    return felix.Client(
        fx["addrs"], tenant_id=fx["tenant_id"], token=fx["token"], ca_file=fx["ca_file"]
    )


def test_commit_and_state_get(felix_fixture: dict[str, Any]) -> None:
    fx = felix_fixture
    c = client(fx)
    t, ns, stream = fx["tenant_id"], fx["namespace"], fx["durable_stream"]
    entity = b"official-entity"
    first = c.commit(
        t,
        ns,
        entity,
        [
            felix.CommitOp.publish(stream, b"opened"),
            felix.CommitOp.put(stream, "status", b"open"),
            felix.CommitOp.put(stream, "owner", b"ann"),
        ],
    )
    second = c.commit(
        t,
        ns,
        entity,
        [felix.CommitOp.publish(stream, b"closed"), felix.CommitOp.delete(stream, "owner")],
    )
    assert second.offset > first.offset
    status = c.state_get(t, ns, stream, entity, "status")
    assert (status.value, status.version, status.as_of) == (b"open", first.offset, second.offset)
    owner = c.state_get(t, ns, stream, entity, "owner")
    assert owner.value is None and owner.as_of == second.offset
    never = c.state_get(t, ns, stream, b"no-such-entity", "status")
    assert never.value is None


def test_keyed_publishes_after_publish_width(felix_fixture: dict[str, Any]) -> None:
    # The broker sets FEATURE_EXTENDED and hi bit 0x4 (decision publish-width), so the
    # client announces the width it learned from stream_shards before keyed batches; the
    # broker takes it silently (no answer) and the keyed batches are accepted.
    fx = felix_fixture
    before = _metric(fx, "felix_stream_publish_widths_total")
    c = client(fx)
    t, ns, stream = fx["tenant_id"], fx["namespace"], fx["durable_stream"]
    assert c.stream_shards(t, ns, stream) == 4
    for i in range(8):
        c.publish(t, ns, stream, b"k%d" % i, key=b"key-%d" % i)  # raises if refused
    assert _metric(fx, "felix_stream_publish_widths_total") > before
    assert _metric(fx, "felix_stream_stale_width_refusals_total") == 0


def _metric(fx: dict[str, Any], name: str) -> float:
    with urllib.request.urlopen(fx["http_url"] + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")
