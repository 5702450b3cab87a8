"""The kit detects real breakage: deliberately broken brokers must fail the right cases.

Each broken broker is the reference broker behind the kit's relay, with a frame
rewriter that breaks one rule (drops a required field, reorders answers, ignores
a feature bit the client offered, leaks a field the client did not offer, loses
deliveries). A control case that the breakage does not touch must still pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from felix_conformance.corpus import load_corpus, select
from felix_conformance.relay import TO_BROKER, TO_CLIENT, FrameRewriter, Relay, StreamRef
from felix_conformance.runner import run_cases
from felix_conformance.target import Target, probe
from felix_conformance.verdicts import Verdict
from felix_wire.features import Feature
from felix_wire.frame import Frame, frame_bytes
from felix_wire.messages import MESSAGE_CLASSES

pytestmark = pytest.mark.timeout(120)

CONTROL = "auth.auth-ok-with-client-flags"


def _json(frame: Frame) -> dict[str, object] | None:
    if frame.flags != 0:
        return None
    value = msgspec.json.decode(frame.payload)
    return value if isinstance(value, dict) else None


def _same(frame: Frame) -> list[bytes]:
    return [frame_bytes(frame.flags, frame.payload)]


def drop_request_id_from_stream_shards_view(
    ref: StreamRef, direction: str, frame: Frame
) -> Sequence[bytes]:
    body = _json(frame)
    if direction == TO_CLIENT and body is not None and body.get("type") == "stream_shards_view":
        body.pop("request_id", None)
        return [frame_bytes(0, msgspec.json.encode(body))]
    return _same(frame)


def reorder_binary_acks() -> FrameRewriter:
    held: dict[int, Frame] = {}

    def rewrite(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
        is_ack = direction == TO_CLIENT and frame.flags != 0 and ref.opened_by == "client"
        if not is_ack:
            return _same(frame)
        first = held.pop(ref.stream_id, None)
        if first is None:
            held[ref.stream_id] = frame
            return []
        return _same(frame) + _same(first)

    return rewrite


def ignore_feature_unsupported(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
    body = _json(frame)
    if direction == TO_BROKER and body is not None and body.get("type") == "auth":
        features = body.get("client_features")
        if isinstance(features, int):
            body["client_features"] = features & ~int(Feature.FEATURE_UNSUPPORTED)
            return [frame_bytes(0, msgspec.json.encode(body))]
    return _same(frame)


def leak_error_codes(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
    body = _json(frame)
    if direction == TO_CLIENT and body is not None and body.get("type") == "publish_error":
        body["code"] = "not_found"
        body["retry"] = "retry_after"
        return [frame_bytes(0, msgspec.json.encode(body))]
    return _same(frame)


def lose_deliveries(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
    if ref.opened_by == "broker" and frame.flags != 0:
        return []
    return _same(frame)


def answer_auth_with_ok(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
    body = _json(frame)
    if direction == TO_CLIENT and body is not None and body.get("type") == "auth_ok":
        return [frame_bytes(0, msgspec.json.encode({"type": "ok"}))]
    return _same(frame)


async def _verdicts(
    reference_target: Target,
    rewriter: FrameRewriter,
    case_ids: list[str],
    exclude: Sequence[str] = (),
) -> dict[str, Verdict]:
    relay = Relay(reference_target, rewriter=rewriter)
    host, port = await relay.start()
    try:
        target = Target(host, port, relay.ca_pem, "localhost", reference_target.variables)
        advertised = await probe(target)
        cases = select(load_corpus(), case_ids, exclude, strict=True)
        report = await run_cases(cases, target, advertised)
    finally:
        await relay.close()
    return {r.case.id: r.verdict for r in report.results}


@pytest.mark.parametrize(
    ("rewriter", "broken"),
    [
        (drop_request_id_from_stream_shards_view, ["discovery.stream-shards"]),
        (reorder_binary_acks(), ["publish.binary-acks-in-order"]),
        (ignore_feature_unsupported, ["unsupported.unknown-type-with-feature"]),
        (leak_error_codes, ["publish.error-codes-only-when-offered"]),
        (lose_deliveries, ["subscribe.events-shared-binary", "subscribe.events-legacy-binary"]),
        (answer_auth_with_ok, ["auth.auth-ok-with-client-flags"]),
    ],
    ids=[
        "dropped-field",
        "reordered-acks",
        "ignored-feature",
        "leaked-field",
        "lost-events",
        "no-auth-ok",
    ],
)
async def test_broken_broker_fails_the_right_cases(
    reference_target: Target, rewriter: FrameRewriter, broken: list[str]
) -> None:
    control = [] if CONTROL in broken else [CONTROL]
    verdicts = await _verdicts(reference_target, rewriter, broken + control)
    assert {cid: verdicts[cid] for cid in broken} == {cid: Verdict.FAIL for cid in broken}
    for cid in control:
        assert verdicts[cid] is Verdict.PASS


async def test_the_untouched_relay_is_transparent(reference_target: Target) -> None:
    verdicts = await _verdicts(
        reference_target,
        _same_rewriter,
        ["auth.*", "publish.binary-*", "subscribe.events-*", "frame.unknown-flag-bit"],
        # A rewriting relay forwards whole frames only, so a header announcing an
        # oversize payload that never comes is (rightly) never forwarded.
        exclude=["auth.oversize-preauth-frame"],
    )
    assert verdicts and all(v is Verdict.PASS for v in verdicts.values()), verdicts


def _same_rewriter(ref: StreamRef, direction: str, frame: Frame) -> Sequence[bytes]:
    return _same(frame)


def test_catalogue_knows_the_rewritten_types() -> None:
    assert {"stream_shards_view", "publish_error", "auth"} <= set(MESSAGE_CLASSES)
