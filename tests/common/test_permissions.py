"""Permission parsing and matching: trailing wildcards, group grants via streams, node.view."""

from __future__ import annotations

import pytest

from felix_common.permissions import (
    Action,
    InvalidPermissionError,
    PermissionSet,
    cache_object,
    cluster_object,
    group_object,
    stream_object,
)

pytestmark = pytest.mark.timeout(10)


def test_exact_grant_matches_only_its_object() -> None:
    perms = PermissionSet.parse(["stream.publish:stream:t1/ns/orders"])
    assert perms.allows("stream.publish", stream_object("t1", "ns", "orders"))
    assert not perms.allows("stream.publish", stream_object("t1", "ns", "orders2"))
    assert not perms.allows("stream.subscribe", stream_object("t1", "ns", "orders"))
    assert not perms.allows("stream.publish", stream_object("t2", "ns", "orders"))


@pytest.mark.parametrize(
    ("grant", "obj", "allowed"),
    [
        ("stream.subscribe:stream:t1/ns/*", stream_object("t1", "ns", "orders"), True),
        ("stream.subscribe:stream:t1/ns/*", stream_object("t1", "other", "orders"), False),
        ("stream.subscribe:stream:t1/*", stream_object("t1", "any", "thing"), True),
        ("stream.subscribe:stream:t1/*", stream_object("t2", "any", "thing"), False),
        ("stream.subscribe:stream:*", stream_object("t9", "x", "y"), True),
        ("stream.subscribe:*", stream_object("t9", "x", "y"), True),
        # A wildcard segment needs something to match: t1/* does not match a
        # tenant called "t1" with an empty remainder.
        ("stream.subscribe:stream:t1/ns/*", "stream:t1/ns", False),
        ("cache.read:cache:t1/ns/sessions", cache_object("t1", "ns", "sessions"), True),
        ("cache.read:cache:t1/ns/sessions", stream_object("t1", "ns", "sessions"), False),
        ("cache.write:cache:t1/*", cache_object("t1", "ns", "sessions"), True),
    ],
)
def test_wildcards(grant: str, obj: str, allowed: bool) -> None:
    action = grant.split(":", 1)[0]
    assert PermissionSet.parse([grant]).allows(action, obj) is allowed


def test_prefix_is_by_segment_not_by_character() -> None:
    perms = PermissionSet.parse(["stream.publish:stream:t1/*"])
    assert not perms.allows("stream.publish", stream_object("t10", "ns", "s"))


def test_group_consume_granted_by_stream_subscribe() -> None:
    perms = PermissionSet.parse(["stream.subscribe:stream:t1/ns/jobs"])
    assert perms.allows(Action.GROUP_CONSUME, group_object("t1", "ns", "jobs", "g1"))
    assert not perms.allows(Action.GROUP_CONSUME, group_object("t1", "ns", "other", "g1"))
    assert not perms.allows(Action.GROUP_MANAGE, group_object("t1", "ns", "jobs", "g1"))


def test_group_manage_granted_by_stream_manage() -> None:
    perms = PermissionSet.parse(["stream.manage:stream:t1/*"])
    assert perms.allows("group.manage", group_object("t1", "ns", "jobs", "g1"))
    assert not perms.allows("group.consume", group_object("t1", "ns", "jobs", "g1"))


def test_group_grant_scoped_to_one_group() -> None:
    perms = PermissionSet.parse(["group.consume:group:t1/ns/jobs/g1"])
    assert perms.allows("group.consume", group_object("t1", "ns", "jobs", "g1"))
    assert not perms.allows("group.consume", group_object("t1", "ns", "jobs", "g2"))
    # A group grant does not grant the stream.
    assert not perms.allows("stream.subscribe", stream_object("t1", "ns", "jobs"))


def test_group_wildcard_over_a_stream() -> None:
    perms = PermissionSet.parse(["group.manage:group:t1/ns/jobs/*"])
    assert perms.allows("group.manage", group_object("t1", "ns", "jobs", "anything"))
    assert not perms.allows("group.manage", group_object("t1", "ns", "other", "anything"))


def test_node_view_needs_the_exact_grant() -> None:
    assert PermissionSet.parse(["node.view:cluster:*"]).allows("node.view", cluster_object())
    assert not PermissionSet.parse(["node.view:*"]).allows("node.view", cluster_object())
    assert not PermissionSet.parse([]).allows("node.view", cluster_object())


def test_unknown_action_refuses_the_whole_set() -> None:
    with pytest.raises(InvalidPermissionError, match=r"unknown action 'stream\.destroy'"):
        PermissionSet.parse(["stream.publish:stream:t1/*", "stream.destroy:stream:t1/*"])


@pytest.mark.parametrize(
    "grant",
    [
        "stream.publish",  # no object
        "stream.publish:",  # empty object
        "stream.publish:stream",  # no path
        "stream.publish:stream:t1/*/orders",  # wildcard not trailing
        "stream.publish:stream:t1/ord*",  # partial-segment wildcard
        "stream.publish:stream:t1/ns",  # too few segments
        "stream.publish:stream:t1/ns/a/b",  # too many segments
        "stream.publish:stream:t1//a",  # empty segment
        "stream.publish:cache:t1/ns/a",  # kind does not fit the action
        "node.view:cluster:t1",  # node.view only takes cluster:*
        "*:*",  # no wildcard actions
    ],
)
def test_malformed_grants_are_refused(grant: str) -> None:
    with pytest.raises(InvalidPermissionError):
        PermissionSet.parse([grant])


def test_unknown_action_in_a_check_is_not_allowed() -> None:
    perms = PermissionSet.parse(["stream.publish:*"])
    assert not perms.allows("stream.destroy", stream_object("t1", "ns", "s"))


def test_grants_keep_their_order() -> None:
    grants = ["cache.read:cache:t1/*", "node.view:cluster:*"]
    assert PermissionSet.parse(grants).grants == tuple(grants)
