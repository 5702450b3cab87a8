"""Gating tables and the negotiation rules, applied."""

from __future__ import annotations

import pytest

from felix_wire.features import (
    FEATURE_EXTENDED,
    Capabilities,
    Feature,
    feature_words,
    features_from_words,
)
from felix_wire.flags import ORIGINAL_V1_FLAGS, Flag
from felix_wire.gating import (
    MESSAGE_GATES,
    auth_answer,
    check_sendable,
    client_auth,
    client_capabilities,
    server_capabilities,
    shape_for_peer,
)
from felix_wire.messages import (
    Auth,
    AuthOk,
    CacheDelete,
    Error,
    GroupRecord,
    GroupRecords,
    Ok,
    PublishOk,
    SubscriptionLagged,
)
from felix_wire.wire_errors import NotNegotiatedError

NONE = Capabilities(flags=int(ORIGINAL_V1_FLAGS), features=0)
OFFICIAL_CLIENT = Capabilities(flags=0x1FFF, features=features_from_words(4218945535, 15))


def test_error_code_fields_need_feature_error_codes() -> None:
    error = Error(message="no", code="forbidden", retry="fatal", detail=None)
    assert shape_for_peer(error, NONE) == Error(message="no")
    assert shape_for_peer(error, Capabilities(features=Feature.FEATURE_ERROR_CODES)) == error


def test_offset_on_publish_ok_needs_the_ack_offset_flag() -> None:
    ok = PublishOk(request_id=1, offset=42)
    assert shape_for_peer(ok, NONE).offset is None
    assert shape_for_peer(ok, Capabilities(flags=Flag.BINARY_PUBLISH_ACK_OFFSET)).offset == 42


def test_nested_group_record_fields_are_gated() -> None:
    records = GroupRecords(
        records=[
            GroupRecord(
                offset=1,
                payload=b"x",
                attempts=1,
                skipped_before=3,
                publisher="p",
                timestamp_micros=5,
            )
        ],
        request_id=9,
    )
    shaped = shape_for_peer(records, NONE)
    assert shaped.records == [GroupRecord(offset=1, payload=b"x", attempts=1)]
    assert (
        shape_for_peer(records, Capabilities(features=Feature.FEATURE_GROUP_PUBLISHER))
        .records[0]
        .publisher
        == "p"
    )


def test_gated_message_is_refused_and_names_what_is_missing() -> None:
    with pytest.raises(NotNegotiatedError) as info:
        shape_for_peer(
            CacheDelete(tenant_id="t", namespace="n", cache="c", key="k", request_id=1), NONE
        )
    assert info.value.missing == ["FEATURE_CACHE_DELETE"]
    lagged = SubscriptionLagged(subscription_id=1, resume_from=2)
    with pytest.raises(NotNegotiatedError) as info:
        shape_for_peer(lagged, Capabilities(features=Feature.FEATURE_SUBSCRIPTION_LAGGED))
    assert info.value.missing == ["EVENT_BATCH_OFFSETS"]
    both = Capabilities(
        flags=Flag.EVENT_BATCH_OFFSETS, features=Feature.FEATURE_SUBSCRIPTION_LAGGED
    )
    assert shape_for_peer(lagged, both) is lagged


def test_stream_deleted_can_never_be_negotiated() -> None:
    everything = Capabilities(flags=0x7FFF, features=2**64 - 1)
    with pytest.raises(NotNegotiatedError):
        check_sendable("stream_deleted", everything)


def test_every_gate_names_known_bits() -> None:
    assert MESSAGE_GATES["cache_watch"].features == Feature.FEATURE_CACHE_WATCH
    assert MESSAGE_GATES["shard_inspect"].features == Feature.FEATURE_INSPECT


def test_auth_ok_only_to_a_client_that_offered_client_flags() -> None:
    bare = Auth(tenant_id="t1", token="x")
    assert auth_answer(bare, server_flags=0x7FFF, server_features=0) == Ok()
    answer = auth_answer(
        Auth(tenant_id="t1", token="x", client_flags=25), server_flags=25, server_features=25
    )
    assert answer == AuthOk(server_flags=25, server_features=25)


def test_extended_word_only_to_a_client_that_set_the_marker() -> None:
    features = int(Feature.FEATURE_ERROR_CODES | Feature.FEATURE_INSPECT)
    plain = Auth(
        tenant_id="t1", token="x", client_flags=1, client_features=int(Feature.FEATURE_ERROR_CODES)
    )
    answer = auth_answer(plain, server_flags=1, server_features=features)
    assert isinstance(answer, AuthOk)
    assert (answer.server_features, answer.server_features_hi) == (
        int(Feature.FEATURE_ERROR_CODES),
        None,
    )
    marked = Auth(
        tenant_id="t1",
        token="x",
        client_flags=1,
        client_features=FEATURE_EXTENDED,
        client_features_hi=1,
    )
    answer = auth_answer(marked, server_flags=1, server_features=features)
    assert isinstance(answer, AuthOk)
    assert (answer.server_features, answer.server_features_hi) == (
        int(Feature.FEATURE_ERROR_CODES) | FEATURE_EXTENDED,
        1,
    )


def test_publish_window_rules() -> None:
    offers = Auth(
        tenant_id="t",
        token="x",
        client_flags=1,
        client_features=int(Feature.FEATURE_PUBLISH_PIPELINE),
    )
    pipeline = int(Feature.FEATURE_PUBLISH_PIPELINE | Feature.FEATURE_STREAM_PUBLISH_WINDOW)
    granted = auth_answer(offers, server_flags=1, server_features=pipeline, publish_window=256)
    assert isinstance(granted, AuthOk) and granted.publish_window == 256
    off = auth_answer(offers, server_flags=1, server_features=pipeline, publish_window=0)
    assert isinstance(off, AuthOk) and off.publish_window is None and off.server_features is None
    silent = auth_answer(
        Auth(tenant_id="t", token="x", client_flags=1),
        server_flags=1,
        server_features=pipeline,
        publish_window=256,
    )
    assert isinstance(silent, AuthOk) and silent.publish_window is None


def test_listener_ports_only_when_several() -> None:
    auth = Auth(tenant_id="t", token="x", client_flags=1)
    one = auth_answer(auth, server_flags=1, server_features=0, listener_ports=[5000])
    two = auth_answer(auth, server_flags=1, server_features=0, listener_ports=[5000, 5001])
    assert isinstance(one, AuthOk) and one.listener_ports is None
    assert isinstance(two, AuthOk) and two.listener_ports == [5000, 5001]


def test_feature_words_and_the_marker() -> None:
    assert feature_words(int(Feature.FEATURE_TOPOLOGY), peer_reads_hi=True) == (1, None)
    assert feature_words(int(Feature.FEATURE_INSPECT), peer_reads_hi=False) == (0, None)
    assert feature_words(int(Feature.FEATURE_INSPECT), peer_reads_hi=True) == (FEATURE_EXTENDED, 1)
    assert features_from_words(1, 1) == 1  # a _hi word without the marker is ignored
    assert features_from_words(None, None) == 0


def test_capabilities_of_the_official_client() -> None:
    caps = client_capabilities(
        Auth(
            tenant_id="t1",
            token="x",
            client_flags=8191,
            client_features=4218945535,
            client_features_hi=15,
        )
    )
    assert caps == OFFICIAL_CLIENT
    assert caps.reads_hi
    assert not caps.has(Flag.EVENT_BATCH_TIMESTAMPS)
    assert caps.has_feature(Feature.FEATURE_PUBLISH_WIDTH)
    assert not caps.has_feature(Feature.FEATURE_ACK_ON_COMMIT)


def test_capabilities_before_and_without_flags() -> None:
    assert client_capabilities(Auth(tenant_id="t", token="x")) == Capabilities(
        int(ORIGINAL_V1_FLAGS), 0
    )
    assert server_capabilities(Ok()) == Capabilities(int(ORIGINAL_V1_FLAGS), 0)
    assert server_capabilities(AuthOk(server_flags=25, server_features=2048)) == Capabilities(
        25, 2048
    )


def test_client_auth_applies_the_word_rules() -> None:
    auth = client_auth(
        "t1",
        "tok",
        client_flags=25,
        client_features=int(Feature.FEATURE_ERROR_CODES | Feature.FEATURE_INSPECT),
    )
    assert (auth.client_features, auth.client_features_hi) == (2048 | FEATURE_EXTENDED, 1)
    assert client_auth("t1", "tok", client_flags=None, client_features=0) == Auth(
        tenant_id="t1", token="tok"
    )
