"""How the kit picks the broker of a fleet a case goes to: the owner of its first
leader-served request (felix_conformance.routing). The whole kit through a
fleet's owner and non-owner is in test_reference_broker.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from felix_conformance.corpus import load_corpus
from felix_conformance.model import parse_case
from felix_conformance.profile import profile_from_fixture, render_profile
from felix_conformance.routing import LeaderRequest, leader_requests, owner_of, route_to_owner
from felix_conformance.target import Target, probe, target_from_fixture, with_defaults
from felix_conformance.wirelog import WireLog
from felix_wire.messages import ShardOwner
from felix_wire.routing import shard_for_key

AUTH = {"type": "auth", "tenant_id": "${tenant_id}", "token": "${token}"}


def _case(*sends: dict[str, Any], brokers: int | None = None) -> dict[str, Any]:
    return {
        "id": "kit.routing",
        "title": "routing",
        "section": "kit",
        "requirement": "none: checks the kit's own routing",
        "exercises": {},
        **({"setup": {"brokers": brokers}} if brokers else {}),
        "steps": [
            {"open": {"stream": "s1"}},
            {"send": {"stream": "s1", "message": AUTH}},
            *({"send": {"stream": "s1", **send}} for send in sends),
        ],
    }


VARIABLES = {"tenant_id": "t1", "namespace": "ns", "token": "x", "durable_stream": "d"}


def test_the_leader_served_requests_of_a_case_in_order() -> None:
    case = parse_case(
        _case(
            {"message": {"type": "publish", "tenant_id": "t1", "namespace": "ns",
                         "stream": "${durable_stream}", "payload": "eA=="}},
            {"message": {"type": "subscribe", "tenant_id": "t1", "namespace": "ns",
                         "stream": "${durable_stream}", "shard": 2}},
            {"message": {"type": "cache_watch", "tenant_id": "t1", "namespace": "ns",
                         "cache": "c", "key": "k1"}},
            {"message": {"type": "publish_if", "tenant_id": "t1", "namespace": "ns",
                         "stream": "d", "payloads": ["eA=="], "key": "a2V5",
                         "expected_offset": 0, "request_id": 1}},
            {"binary": {"layout": "publish_batch", "fields": {
                "request_id": 2, "ack_mode": 2, "producer_id": 7, "sequence": 0,
                "tenant_id": "t1", "namespace": "ns", "stream": "d", "payloads": ["eA=="]}}},
            {"binary": {"layout": "publish_batch", "fields": {
                "request_id": 3, "ack_mode": 2,
                "tenant_id": "t1", "namespace": "ns", "stream": "d", "payloads": ["eA=="]}}},
        ),
        "inline",
    )  # fmt: skip
    assert leader_requests(case, VARIABLES) == [
        LeaderRequest("stream", "d", 2, None),
        LeaderRequest("cache", "c", None, b"k1"),
        LeaderRequest("stream", "d", None, base64.b64decode("a2V5")),
        LeaderRequest("stream", "d", None, None),  # idempotent: it carries a producer id
    ]  # the plain publish and the plain binary batch are forwarded: not listed


def _owners(*addrs: str) -> list[ShardOwner]:
    return [
        ShardOwner(shard=i, node_id=f"node-{a[-1]}", addr=a, generation=5)
        for i, a in enumerate(addrs)
    ]


def test_the_owner_is_the_requests_shard_or_its_keys() -> None:
    one = _owners("h:1", "h:1", "h:1", "h:1")
    assert owner_of(LeaderRequest("stream", "d", 3, None), one) == one[0]
    spread = _owners("h:1", "h:2", "h:3", "h:4")
    assert owner_of(LeaderRequest("stream", "d", 2, None), spread) == spread[2]
    keyed = owner_of(LeaderRequest("stream", "d", None, b"customer-1"), spread)
    assert keyed == spread[shard_for_key(b"customer-1", 4)]
    assert owner_of(LeaderRequest("stream", "d", None, None), spread) == spread[0]
    assert owner_of(LeaderRequest("stream", "d", 9, None), spread) is None
    assert owner_of(LeaderRequest("stream", "d", 0, None), []) is None


SUBSCRIBE = {
    "message": {
        "type": "subscribe",
        "tenant_id": "${tenant_id}",
        "namespace": "${namespace}",
        "stream": "${durable_stream}",
        "shard": 0,
    }
}


async def test_a_cluster_case_and_a_single_broker_are_never_routed(fixture_file: Path) -> None:
    """Neither asks the target anything: a target nothing listens at stays the target."""
    target = target_from_fixture(fixture_file)
    advertised = await probe(target)
    nowhere = Target("127.0.0.1", 9, target.ca_pem, "localhost", target.variables)
    single = parse_case(_case(SUBSCRIBE), "inline")
    assert await route_to_owner(single, nowhere, advertised, WireLog()) is nowhere
    fleet = Target(
        "127.0.0.1", 9, target.ca_pem, "localhost",
        {**target.variables, "brokers": ["127.0.0.1:9", "127.0.0.1:10"]},
    )  # fmt: skip
    cluster = parse_case(_case(SUBSCRIBE, brokers=2), "inline")
    assert await route_to_owner(cluster, fleet, advertised, WireLog()) is fleet


async def test_an_owner_without_an_address_leaves_the_case_at_the_target(
    fixture_file: Path,
) -> None:
    """A standalone broker's shard_owners view names no address: nothing to go to."""
    target = target_from_fixture(fixture_file)
    fleet = Target(
        target.host, target.port, target.ca_pem, target.server_name,
        {**target.variables, "brokers": [target.address, "127.0.0.1:9"]},
    )  # fmt: skip
    log = WireLog()
    case = parse_case(_case(SUBSCRIBE), "inline")
    assert await route_to_owner(case, fleet, await probe(target), log) is fleet
    assert "no owner with an address" in log.text()


def test_the_guarded_cases_stream_is_leader_durable_stream_or_durable_stream(
    tmp_path: Path,
) -> None:
    """A fleet fixture's durable_stream is Quorum, which refuses idempotent,
    conditional and commit publishes: its leader_durable_stream goes into the
    profile; a setup naming none has the cases use durable_stream."""
    assert with_defaults({"durable_stream": "d"})["leader_durable_stream"] == "d"
    named = {"durable_stream": "d", "leader_durable_stream": "ld"}
    assert with_defaults(named)["leader_durable_stream"] == "ld"
    assert "leader_durable_stream" not in with_defaults({})
    document = {
        "addrs": ["127.0.0.1:1", "127.0.0.1:2"], "ca_file": "ca.pem", "tenant_id": "t1",
        "token": "x", "durable_stream": "durable", "leader_durable_stream": "leader-durable",
    }  # fmt: skip
    path = tmp_path / "fixture.json"
    path.write_text(json.dumps(document))
    profile = profile_from_fixture(path)
    assert profile["streams"]["leader_durable_stream"] == "leader-durable"
    render_profile(profile)  # the profile schema knows the name
    guarded = [c for c in load_corpus() if "leader_durable_stream" in c.variables]
    assert {c.id for c in guarded} >= {"gated.publish-if", "gated.commit-state"}
