"""The kit's flood steps (`send.repeat`, `expect.skip`, `{$fill: N}`) and the limit
cases' target: the fixture's limited broker (`limited_addrs`, profile
`limited_broker`) and its POST /storage-fault."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from felix_conformance.corpus import load_corpus
from felix_conformance.frames import MAX_FILL, build_frame
from felix_conformance.model import FrameSpec, parse_case
from felix_conformance.profile import load_profile, profile_from_fixture, render_profile
from felix_conformance.runner import missing_needs, run_case
from felix_conformance.schema import TranscriptError, validate_document
from felix_conformance.target import LIMITED_BROKER, Target, probe, target_from_fixture
from felix_conformance.verdicts import Verdict
from felix_wire.codec import decode_payload
from felix_wire.frame import FrameReader
from felix_wire.messages import CachePut

pytestmark = pytest.mark.timeout(120)


def _put(value: Any) -> FrameSpec:
    body = {"type": "cache_put", "tenant_id": "t", "namespace": "n", "cache": "c"}
    return FrameSpec("message", {**body, "key": "k", "value": value, "request_id": 1})


def test_fill_gives_that_many_filler_bytes() -> None:
    (frame,) = FrameReader().feed(build_frame(_put({"$fill": 5000}), {}))
    decoded = decode_payload(frame.flags, frame.payload)
    assert isinstance(decoded, CachePut) and decoded.value == b"z" * 5000
    assert build_frame(_put({"$fill": 0}), {}) == build_frame(_put(""), {})


@pytest.mark.parametrize("size", [-1, MAX_FILL + 1, "10", True])
def test_a_fill_out_of_bounds_is_the_transcripts_mistake(size: Any) -> None:
    with pytest.raises(TranscriptError, match=r"\$fill"):
        build_frame(_put({"$fill": size}), {})


def _document(**step_extra: Any) -> dict[str, Any]:
    return {
        "id": "kit.x",
        "title": "t",
        "section": "kit",
        "requirement": "none: checks the kit.",
        "exercises": {},
        "steps": [{"open": {"stream": "s"}}, {"send": {"stream": "s", **step_extra}}],
    }


def test_the_schema_bounds_repeat_and_skip() -> None:
    message = {"type": "ping"}
    validate_document(_document(message=message, repeat=20000), "ok")
    for bad in (0, 20001):
        with pytest.raises(TranscriptError):
            validate_document(_document(message=message, repeat=bad), "bad")
    expect = _document(message=message)
    expect["steps"].append({"expect": {"stream": "s", "message": message, "skip": 3}})
    validate_document(expect, "ok")
    expect["steps"][-1]["expect"]["skip"] = -1
    with pytest.raises(TranscriptError):
        validate_document(expect, "bad")


def _skipping(skip: int) -> dict[str, Any]:
    """Three identical acked publishes in one write, then a fourth: the fourth's answer
    is the fourth frame, so it needs `skip` >= 3."""
    publish = {
        "type": "publish",
        "tenant_id": "${tenant_id}",
        "namespace": "${namespace}",
        "stream": "${memory_stream}",
        "payload": "eA==",
        "ack": "per_message",
    }
    auth = {
        "type": "auth",
        "tenant_id": "${tenant_id}",
        "token": "${token}",
        "client_flags": 0x0019,
        "client_features": 0x0800,
    }
    return {
        "id": f"kit.skip-{skip}",
        "title": "passes over answers",
        "section": "kit",
        "requirement": "none: checks the kit.",
        "exercises": {},
        "steps": [
            {"open": {"stream": "s"}},
            {"send": {"stream": "s", "message": auth}},
            {"expect": {"stream": "s", "message": {"type": "auth_ok"}}},
            {"send": {"stream": "s", "repeat": 3, "message": {**publish, "request_id": 5}}},
            {"send": {"stream": "s", "message": {**publish, "request_id": 6}}},
            {
                "expect": {
                    "stream": "s",
                    "skip": skip,
                    "message": {"type": "publish_ok", "request_id": 6},
                }
            },
        ],
    }


async def test_repeat_sends_copies_and_skip_passes_over_at_most_that_many(
    reference_target: Target,
) -> None:
    advertised = await probe(reference_target)
    passed = await run_case(parse_case(_skipping(3), "inline"), reference_target, advertised)
    assert passed.verdict is Verdict.PASS, passed.detail
    assert "-> 3 x {" in passed.wire_log
    short = await run_case(parse_case(_skipping(2), "inline"), reference_target, advertised)
    assert short.verdict is Verdict.FAIL
    assert "expected 6, got 5" in short.detail


def _fixture(tmp_path: Path, **extra: Any) -> Path:
    (tmp_path / "ca.pem").write_text("not read for this")
    path = tmp_path / "fx.json"
    document = {"addrs": ["127.0.0.1:1"], "ca_file": "ca.pem", "control_url": "http://127.0.0.1:2"}
    path.write_text(json.dumps({**document, **extra}))
    return path


def test_a_fixture_with_a_limited_broker_gives_the_profile_it_and_the_control_url(
    tmp_path: Path,
) -> None:
    fixture = _fixture(tmp_path, limited_addrs=["127.0.0.1:7"], flood_stream="flood")
    document = profile_from_fixture(fixture)
    assert document[LIMITED_BROKER] == "127.0.0.1:7"
    assert document["control_url"] == "http://127.0.0.1:2"  # POST /storage-fault
    assert document["streams"]["flood_stream"] == "flood"
    written = tmp_path / "profile.yaml"
    written.write_text(render_profile(document))
    variables = load_profile(written).variables
    assert variables[LIMITED_BROKER] == "127.0.0.1:7" and variables["flood_stream"] == "flood"
    assert target_from_fixture(fixture).variables[LIMITED_BROKER] == "127.0.0.1:7"
    without = _fixture(tmp_path)
    assert LIMITED_BROKER not in profile_from_fixture(without)
    assert LIMITED_BROKER not in target_from_fixture(without).variables


async def test_without_a_limited_broker_the_limit_cases_are_setup(
    reference_target: Target,
) -> None:
    assert LIMITED_BROKER in reference_target.variables  # the fixture has one
    variables = {k: v for k, v in reference_target.variables.items() if k != LIMITED_BROKER}
    target = Target(
        reference_target.host,
        reference_target.port,
        reference_target.ca_pem,
        reference_target.server_name,
        variables,
    )
    advertised = await probe(target)
    limits = [case for case in load_corpus() if LIMITED_BROKER in case.variables]
    assert {c.id for c in limits} >= {
        "limits.subscriptions-per-connection",
        "limits.publish-queue-full",
        "transport.connection-cap",
    }
    for case in limits:
        unmet = missing_needs(case, target, advertised)
        assert unmet is not None and unmet.verdict is Verdict.SETUP, case.id
        assert f"{LIMITED_BROKER} (not in the profile)" in unmet.reason


def test_the_fill_value_encodes_as_base64_of_the_filler() -> None:
    spec = _put({"$fill": 3})
    (frame,) = FrameReader().feed(build_frame(spec, {}))
    assert base64.b64encode(b"zzz").decode() in frame.payload.decode()
