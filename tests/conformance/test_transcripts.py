"""The shipped corpus: every transcript validates, ids are unique, coverage holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from felix_conformance.clienttest.cases import CLIENT_CASES
from felix_conformance.corpus import load_corpus, load_file, select, shipped_dir
from felix_conformance.coverage import NEEDS, Coverage, compute_coverage, format_coverage
from felix_conformance.matching import MissingVariableError, concrete, match, substitute
from felix_conformance.model import Level
from felix_conformance.schema import TranscriptError, validate_document
from felix_wire.catalogue import BINARY_LAYOUTS

pytestmark = pytest.mark.timeout(60)

SHIPPED = sorted(shipped_dir().rglob("*.yaml"))


def test_the_corpus_is_not_empty() -> None:
    assert len(SHIPPED) >= 50


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_transcript_validates(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    validate_document(document, str(path))
    case = load_file(path)
    assert case.requirement.endswith(".")


def test_case_ids_are_unique() -> None:
    cases = load_corpus()
    assert len({c.id for c in cases}) == len(cases) == len(SHIPPED)


def test_a_typo_is_reported_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "id: x\ntitle: t\nsection: s\nrequirement: r.\nexercises: {}\n"
        "steps:\n  - open: {stream: s1}\n  - sned: {stream: s1}\n"
    )
    with pytest.raises(TranscriptError, match=r"steps\[1\]"):
        load_file(path)


def test_unknown_catalogue_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "id: x\ntitle: t\nsection: s\nrequirement: r.\nexercises: {messages: [authh]}\n"
        "steps:\n  - open: {stream: s1}\n"
    )
    with pytest.raises(TranscriptError, match="authh"):
        load_file(path)


def test_strict_mode_adds_should_cases() -> None:
    cases = load_corpus()
    assert len(select(cases, strict=True)) > len(select(cases))
    assert [c.id for c in select(cases, ["auth.*"], ["auth.plain-*"])] == sorted(
        c.id
        for c in cases
        if c.id.startswith("auth.")
        and not c.id.startswith("auth.plain-")
        and c.level is not Level.SHOULD
    )


def test_coverage_of_layouts_and_served_messages() -> None:
    coverage = compute_coverage(load_corpus())
    assert coverage.get("binary layouts").count == len(BINARY_LAYOUTS)
    served = {
        "auth", "auth_ok", "ok", "error", "unsupported", "extension", "publish",
        "publish_batch", "publish_ok", "publish_error", "subscribe", "subscribed",
        "subscribe_cursor_error", "event_stream_hello", "event_batch", "stream_shards",
        "stream_shards_view", "cache_shards", "cache_shards_view", "shard_owners",
        "shard_owners_view",
    }  # fmt: skip
    assert served <= coverage.get("messages").covered
    assert {"unauthenticated", "forbidden", "not_found", "invalid_request"} <= coverage.get(
        "error codes"
    ).covered


def _both_sides() -> Coverage:
    """What `felix-conformance coverage` counts: the broker cases and the client cases."""
    return compute_coverage(load_corpus(), CLIENT_CASES)


# What the shipped broker and client cases exercise (send, or provoke the other
# side into sending). Raise these as cases are added; the test fails if coverage
# drops below them.
COVERAGE_FLOOR = {
    "messages": 77,
    "binary layouts": 4,
    "flag values": 38,
    "features": 35,
    "error codes": 17,
    "retry classes": 5,
    "requirements": 125,
}


def test_coverage_never_drops() -> None:
    counts = _both_sides().counts()
    assert {k: counts[k] for k in COVERAGE_FLOOR} == {
        k: max(counts[k], floor) for k, floor in COVERAGE_FLOOR.items()
    }


def test_coverage_says_what_a_missing_feature_needs() -> None:
    text = format_coverage(_both_sides())
    missing = next(line for line in text.splitlines() if line.startswith("  none: FEATURE_"))
    # FEATURE_REDIRECT, the one the catalogue marks cluster-only, is exercised by the
    # cluster cases now; what is still missing says what it needs.
    assert "FEATURE_REDIRECT" not in missing
    assert "FEATURE_SHARD_MOVED" not in missing  # the fault cases exercise it now
    # The lag cases exercise it now (a subscriber left behind on flood_stream).
    assert "FEATURE_SUBSCRIPTION_LAGGED" not in missing
    # The client tester's window case exercises it (a scripted broker grants 2 per stream).
    assert "FEATURE_STREAM_PUBLISH_WINDOW" not in missing
    assert "FEATURE_STREAM_DELETED (no bit value is known: never negotiable)" in missing


def test_coverage_says_which_side_exercised_each_entry() -> None:
    """What only a client case exercises is labelled [client], what both sides do
    [broker+client]; the counts per side head each dimension."""
    coverage = _both_sides()
    text = format_coverage(coverage)
    assert "event [client]" in text  # the JSON event: only the scripted broker sends it
    assert "revoked [client]" in text
    assert "internal [broker+client]" in text  # the fixture's /handler-fault, and a client
    assert "0x0290 [broker+client]" in text
    assert "FEATURE_STREAM_PUBLISH_WINDOW [client]" in text
    messages = coverage.get("messages")
    assert "event" not in compute_coverage(load_corpus()).get("messages").covered
    assert messages.sides["event"] == {"client"} and messages.sides["auth"] == {"broker", "client"}
    assert text.startswith(f"messages: {messages.count}/78 exercised (broker 76, client ")


def test_coverage_says_what_needs_a_multi_broker_target() -> None:
    """What no case exercises on a standalone broker is listed with what it needs;
    the cluster-only entries say they need a multi-broker target."""
    text = format_coverage(_both_sides())
    none: dict[str, str] = {}
    dimension = ""
    for line in text.splitlines():
        if not line.startswith(" "):
            dimension = line.split(":")[0]
        elif line.startswith("  none: "):
            none[dimension] = line
    cluster = "(needs a multi-broker target"
    # Every cluster-only error code is exercised against the fixture's fleet now.
    assert cluster not in none["error codes"]
    assert none["error codes"] == "  none: -"  # internal: /handler-fault; revoked: a client case
    # Every flag value is exercised (the owner-named refusals and skipped layouts
    # as frames a client sends and the broker must refuse).
    assert none["flag values"] == "  none: -"
    assert none["retry classes"] == "  none: -"  # outcome_unknown: the quorum cases
    # What the cluster cases exercise against a fleet is no longer missing.
    for dimension, name in (
        ("messages", "not_leader"),
        ("flag values", "0x0090"),
        ("flag values", "0x1090"),
        ("error codes", "not_leader"),
        # ... and what the fault cases exercise (the fleet's /fence).
        ("messages", "shard_moved"),
        ("flag values", "0x0610"),
        ("error codes", "shard_unavailable"),
        ("retry classes", "redirect"),
        ("features", "FEATURE_REDIRECT"),
        # ... and the quorum cases (the fleet's /partition).
        ("error codes", "quorum_timeout"),
        # ... and the lease-free read case (the fleet's /partition-cache).
        ("error codes", "leadership_lost"),
        # ... and the limit cases (the fixture's limited broker and /storage-fault).
        ("error codes", "limit_exceeded"),
        ("error codes", "overloaded"),
        ("error codes", "storage"),
        # ... and the held drain (the limited broker's /drain) and swallowed forwards
        # (the fleet's /unanswered-forwards).
        ("error codes", "draining"),
        ("error codes", "unacknowledged"),
        # ... and the lag cases (flood_stream, a watch left behind).
        ("messages", "subscription_lagged"),
        ("messages", "cache_watch_lagged"),
    ):
        assert f" {name} (" not in none[dimension] and not none[dimension].endswith(name)
    # Every entry the kit explains is a real catalogue entry no shipped case exercises.
    coverage = _both_sides()
    for dimension, entries in NEEDS.items():
        assert set(entries) <= set(coverage.get(dimension).total), dimension
        assert not set(entries) & coverage.get(dimension).covered, dimension


def test_coverage_counts_only_what_a_case_exercises(tmp_path: Path) -> None:
    """Declared and required entries, and alternatives, exercise nothing."""
    (tmp_path / "c.yaml").write_text(
        "id: x\ntitle: t\nsection: s\nrequirement: r.\n"
        "exercises: {messages: [cache_event], features: [FEATURE_CACHE_WATCH, FEATURE_INSPECT], "
        "error_codes: [overloaded]}\n"
        "requires: {features: [FEATURE_TOPOLOGY]}\n"
        "steps:\n  - open: {stream: s1}\n"
        "  - send: {stream: s1, message: {type: auth, tenant_id: t, token: k, client_flags: 1, "
        "client_features: 0x0800}}\n"
        "  - send: {stream: s1, message: {type: cache_watch, tenant_id: t, namespace: n, "
        "cache: c, key: k, request_id: 1}}\n"
        "  - expect: {stream: s1, any_of: [{message: {type: ok}}, {message: {type: auth_ok}}]}\n"
        "  - expect: {stream: s1, message: {type: error, code: not_found, retry: fatal, "
        "message: {$one_of: [a, b]}}}\n"
    )
    coverage = compute_coverage(load_corpus(tmp_path))
    assert coverage.get("messages").covered == {"auth", "cache_watch", "error"}
    assert coverage.get("features").covered == {"FEATURE_CACHE_WATCH"}  # gate of cache_watch
    assert coverage.get("error codes").covered == {"not_found"}
    assert coverage.get("retry classes").covered == {"fatal"}


@pytest.mark.parametrize(
    ("expected", "actual", "ok"),
    [
        ({"$any": True}, 3, True),
        ({"$range": [1, 5]}, 6, False),
        ({"$regex": "a+b"}, "aab", True),
        ({"$set": [1, 2]}, [2, 1], True),
        ({"$set": [1, 2]}, [2, 2], False),
        ({"$one_of": ["x", {"$absent": True}]}, "y", False),
        ({"a": {"$absent": True}}, {"b": 1}, True),
        ({"a": 1}, {"a": True}, False),
        ([1, 2], [1, 2, 3], False),
        ({"$type": "integer", "$example": 2}, 6, True),
        ({"$type": "integer"}, True, False),
        ({"$type": "string"}, 3, False),
        ({"$type": "no-such-type"}, 3, False),
    ],
)
def test_matchers(expected: Any, actual: Any, ok: bool) -> None:
    assert (not match(expected, actual, "v", {})) is ok


def test_captures_and_variables() -> None:
    captures: dict[str, Any] = {}
    assert not match({"id": {"$capture": "sub"}}, {"id": 42}, "m", captures)
    assert captures == {"sub": 42}
    assert substitute({"x": "${sub}", "y": "s-${sub}"}, captures) == {"x": 42, "y": "s-42"}
    with pytest.raises(MissingVariableError):
        substitute("${nope}", captures)
    assert substitute("${nope}", {}, unknown_as_capture=True) == {"$capture": "nope"}
    assert concrete({"a": {"$any": True, "$example": 5}, "b": {"$absent": True}}, {}) == {"a": 5}


def test_coverage_broker_only_leaves_the_client_cases_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from felix_conformance.cli import EXIT_OK, main

    assert main(["coverage", "--broker-only"]) == EXIT_OK
    broker_only = capsys.readouterr().out
    assert "[client]" not in broker_only and "\n  none: event, stream_deleted" in broker_only
    assert f"messages: {compute_coverage(load_corpus()).get('messages').count}/78" in broker_only
    assert main(["coverage"]) == EXIT_OK
    assert "event [client]" in capsys.readouterr().out
