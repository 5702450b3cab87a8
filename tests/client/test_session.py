"""The sans-IO core, without sockets: auth answers, negotiation, correlation, fallback."""

from __future__ import annotations

import pytest

from felix_client._events import EventStreamDecoder, OffsetTracker, Records, StreamEnd
from felix_client._session import (
    DEFAULT_OFFER,
    Answered,
    Authenticated,
    AuthRefused,
    Closed,
    Refused,
    Session,
    SessionState,
)
from felix_client.errors import CursorError, NotSupportedByBrokerError, ProtocolViolationError
from felix_wire.binary import AckStatus, PublishAckFrame, PublishBatchFrame
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.errors import ErrorCode, NotFoundError, RetryClass, UnauthenticatedError
from felix_wire.features import FEATURE_EXTENDED, Feature
from felix_wire.flags import ORIGINAL_V1_FLAGS, Flag
from felix_wire.frame import FrameReader
from felix_wire.messages import (
    AckMode,
    Auth,
    AuthOk,
    CacheGet,
    CacheValue,
    CounterGet,
    Error,
    Ok,
    Publish,
    PublishBatch,
    PublishError,
    PublishOk,
    StartOffset,
    Subscribe,
    SubscribeCursorError,
    Subscribed,
    Unsupported,
)

ALL_FLAGS = 0x7EFF
FEATURES = int(
    Feature.FEATURE_ERROR_CODES
    | Feature.FEATURE_UNSUPPORTED
    | Feature.FEATURE_PUBLISH_PIPELINE
    | Feature.FEATURE_STREAM_SHARDS
)


def frames(data: bytes) -> list[object]:
    return [decode_payload(f.flags, f.payload) for f in FrameReader().feed(data)]


def open_session(answer: AuthOk | Ok | None = None) -> Session:
    session = Session("t1")
    session.auth_frame("tok")
    session.receive(
        encode_frame(
            answer or AuthOk(server_flags=ALL_FLAGS, server_features=FEATURES, publish_window=8)
        )
    )
    assert session.state is SessionState.OPEN
    return session


def publish(
    session: Session,
    *,
    key: bytes | None = None,
    ack: AckMode = AckMode.PER_MESSAGE,
    payloads: list[bytes] | None = None,
    single: bool = True,
) -> tuple[int | None, object]:
    request_id, data = session.publish(
        namespace="ns", stream="s", payloads=payloads or [b"x"], key=key, ack=ack, single=single
    )
    (frame,) = frames(data)
    return request_id, frame


def test_auth_frame_offers_what_the_client_implements() -> None:
    session = Session("t1")
    (auth,) = frames(session.auth_frame("tok"))
    assert isinstance(auth, Auth)
    assert auth.tenant_id == "t1" and auth.token == "tok"
    assert auth.client_flags == DEFAULT_OFFER.flags
    assert (
        auth.client_flags & Flag.BINARY_PUBLISH_ACK and auth.client_flags & Flag.EVENT_BATCH_OFFSETS
    )
    # The producer sends idempotent frames; a reused sequence is to be refused.
    assert auth.client_flags & Flag.BINARY_PUBLISH_IDEMPOTENT
    assert auth.client_features is not None and auth.client_features & Feature.FEATURE_ERROR_CODES
    assert auth.client_features & Feature.FEATURE_SEQUENCE_REUSED
    # An extended bit is offered, so the marker asks for the broker's extended word.
    assert auth.client_features & FEATURE_EXTENDED and auth.client_features_hi
    with pytest.raises(RuntimeError):
        session.auth_frame("again")


def test_auth_ok_sets_capabilities_and_window() -> None:
    session = Session("t1")
    session.auth_frame("tok")
    events = session.receive(
        encode_frame(AuthOk(server_flags=ALL_FLAGS, server_features=FEATURES, publish_window=8))
    )
    assert events == [Authenticated(session.capabilities, 8)]  # type: ignore[arg-type]
    assert session.capabilities is not None and session.capabilities.flags == ALL_FLAGS


def test_window_without_the_feature_is_no_window() -> None:
    session = Session("t1")
    session.auth_frame("tok")
    (event,) = session.receive(encode_frame(AuthOk(server_flags=ALL_FLAGS, publish_window=8)))
    assert isinstance(event, Authenticated) and event.publish_window is None


def test_auth_refusal_is_typed_and_closes() -> None:
    session = Session("t1")
    session.auth_frame("tok")
    events = session.receive(
        encode_frame(Error(message="bad token", code="unauthenticated", retry="fatal"))
    )
    assert isinstance(events[0], AuthRefused)
    assert isinstance(events[0].error, UnauthenticatedError)
    assert isinstance(events[1], Closed) and session.closed


def test_answer_before_auth_is_a_violation() -> None:
    session = Session("t1")
    session.auth_frame("tok")
    (event,) = session.receive(encode_frame(PublishOk(request_id=1)))
    assert isinstance(event, Closed) and isinstance(event.error, ProtocolViolationError)


def test_plain_ok_falls_back_to_json_where_binary_is_missing() -> None:
    # A plain ok means ORIGINAL_V1_FLAGS and no features (an old broker).
    session = open_session(Ok())
    assert session.capabilities is not None
    assert session.capabilities.flags == ORIGINAL_V1_FLAGS and session.capabilities.features == 0
    assert session.publish_window is None
    # Unacked, unkeyed: the original binary batch frame (0x0001) is in v1.
    rid, frame = publish(session, ack=AckMode.NONE)
    assert rid is None and isinstance(frame, PublishBatchFrame) and frame.request_id is None
    # Acked: v1 has no acked binary frame, so JSON publish with per_message.
    rid, frame = publish(session)
    assert isinstance(frame, Publish) and frame.ack is AckMode.PER_MESSAGE
    assert frame.request_id == rid
    # Keyed: no keyed binary frame either.
    rid, frame = publish(session, key=b"k", ack=AckMode.NONE)
    assert rid is None and isinstance(frame, Publish) and frame.key == b"k" and frame.ack is None
    # A batch: JSON publish_batch with per_batch.
    rid, frame = publish(session, payloads=[b"a", b"b"], single=False, ack=AckMode.PER_BATCH)
    assert isinstance(frame, PublishBatch) and frame.ack is AckMode.PER_BATCH
    assert frame.payloads == [b"a", b"b"]
    # The JSON answers are correlated like binary acks.
    events = session.receive(encode_frame(PublishOk(request_id=rid, offset=3)))  # type: ignore[arg-type]
    assert isinstance(events[0], Answered) and events[0].request_id == rid


def test_plain_ok_refuses_featured_requests_before_building() -> None:
    session = open_session(Ok())
    before = session.outstanding
    with pytest.raises(NotSupportedByBrokerError) as info:
        session.request(
            lambda rid: CounterGet(
                tenant_id="t1", namespace="n", cache="c", key="k", request_id=rid
            )
        )
    assert "FEATURE_COUNTERS" in info.value.missing
    assert session.outstanding == before


def test_field_gate_refuses_an_unadvertised_option() -> None:
    session = open_session()
    with pytest.raises(NotSupportedByBrokerError, match="queue_capacity"):
        session.request(
            lambda _rid: Subscribe(tenant_id="t1", namespace="n", stream="s", queue_capacity=8)
        )


def test_binary_publishes_when_advertised() -> None:
    session = open_session()
    rid, frame = publish(session, key=b"k")
    assert isinstance(frame, PublishBatchFrame)
    assert frame.request_id == rid and frame.key == b"k" and frame.ack_mode == 1
    ok = PublishAckFrame(status=AckStatus.OK, request_id=rid, message="", offset=41)  # type: ignore[arg-type]
    (event,) = session.receive(encode_frame(ok))
    assert isinstance(event, Answered) and event.answer == ok


def test_binary_ack_error_is_typed() -> None:
    session = open_session()
    rid, _ = publish(session)
    ack = PublishAckFrame(
        status=AckStatus.ERROR,
        request_id=rid,
        message="stream not found",  # type: ignore[arg-type]
        code=int(ErrorCode.NOT_FOUND),
        retry=RetryClass.RETRY_AFTER,
        reason="x",
        retry_after_ms=25,
    )
    (event,) = session.receive(encode_frame(ack))
    assert isinstance(event, Refused) and isinstance(event.error, NotFoundError)
    assert event.error.retry is RetryClass.RETRY_AFTER
    assert event.error.detail == {"reason": "x", "retry_after_ms": 25}


def test_pipelined_answers_match_by_request_id_in_any_order() -> None:
    session = open_session()
    ids = [publish(session)[0] for _ in range(5)]
    data = b"".join(
        encode_frame(PublishOk(request_id=i))
        for i in reversed(ids)  # type: ignore[arg-type]
    ) + encode_frame(PublishError(request_id=999, message="nobody"))
    events = session.receive(data)
    assert [e.request_id for e in events if isinstance(e, Answered)] == list(reversed(ids))
    assert session.outstanding == 0


def test_frames_split_anywhere_are_reassembled() -> None:
    session = open_session()
    rid, _ = publish(session)
    data = encode_frame(PublishError(request_id=rid, message="no", code="forbidden", retry="fatal"))  # type: ignore[arg-type]
    events = []
    for i in range(len(data)):
        events += session.receive(data[i : i + 1])
    assert len(events) == 1 and isinstance(events[0], Refused)


def test_positional_answers() -> None:
    session = open_session()
    sub_id, _ = session.request(lambda _r: Subscribe(tenant_id="t1", namespace="n", stream="s"))
    get_id, _ = session.request(
        lambda r: CacheGet(tenant_id="t1", namespace="n", cache="c", key="k", request_id=r)
    )
    sub2, _ = session.request(
        lambda _r: Subscribe(tenant_id="t1", namespace="n", stream="s", start=StartOffset(offset=9))
    )
    value = CacheValue(
        tenant_id="t1", namespace="n", cache="c", key="k", value=b"v", request_id=get_id
    )
    events = session.receive(
        encode_frame(Subscribed(subscription_id=7))
        + encode_frame(value)
        + encode_frame(SubscribeCursorError(reason="too_old", requested=9, available=12))  # type: ignore[arg-type]
    )
    assert events[0] == Answered(sub_id, Subscribed(subscription_id=7))
    assert events[1] == Answered(get_id, value)
    assert isinstance(events[2], Refused) and events[2].request_id == sub2
    assert isinstance(events[2].error, CursorError) and events[2].error.available == 12


def test_error_without_id_refuses_oldest_non_publish() -> None:
    session = open_session()
    publish(session)
    get_id, _ = session.request(
        lambda r: CacheGet(tenant_id="t1", namespace="n", cache="c", key="k", request_id=r)
    )
    error = Error(message="forbidden", code="forbidden", retry="fatal")
    (event,) = session.receive(encode_frame(error))
    assert isinstance(event, Refused) and event.request_id == get_id


def test_unsupported_answer_without_id_matches_by_type() -> None:
    session = open_session()
    get_id, _ = session.request(
        lambda r: CacheGet(tenant_id="t1", namespace="n", cache="c", key="k", request_id=r)
    )
    (event,) = session.receive(encode_frame(Unsupported(request_type="cache_get")))
    assert isinstance(event, Refused) and event.request_id == get_id
    assert isinstance(event.error, NotSupportedByBrokerError)


def test_end_of_stream_loses_pending() -> None:
    session = open_session()
    rid, _ = publish(session)
    (event,) = session.end_of_stream()
    assert isinstance(event, Closed) and event.lost == (rid,)


def test_event_stream_decoding_and_gaps() -> None:
    from felix_wire.binary import EventBatchSharedFrame
    from felix_wire.messages import EventStreamHello, SubscriptionLagged

    decoder = EventStreamDecoder()
    data = (
        encode_frame(EventStreamHello(subscription_id=3))
        + encode_frame(EventBatchSharedFrame(base_offset=10, payloads=[b"a", b"b"]))
        + encode_frame(EventBatchSharedFrame(base_offset=15, skipped_before=1, payloads=[b"c"]))
        + encode_frame(SubscriptionLagged(subscription_id=3, resume_from=16))
    )
    items = decoder.feed(data)
    assert decoder.subscription_id == 3
    records = [r for item in items if isinstance(item, Records) for r in item.records]
    tracker = OffsetTracker(10)
    lost = [tracker.observe(r.offset, r.skipped_before) for r in records]
    assert [r.offset for r in records] == [10, 11, 15] and lost == [0, 0, 2]
    assert isinstance(items[-1], StreamEnd)
    with pytest.raises(ProtocolViolationError):
        decoder.feed(encode_frame(EventBatchSharedFrame(payloads=[b"late"])))


def test_a_subscription_turns_a_run_of_events_into_events_with_one_gap() -> None:
    """A frame's run of consecutive offsets becomes one event each; only the
    first can follow a gap (less the offsets the broker said hold no event)."""
    from felix_client.subscription import Event, Subscription

    async def never(_start: object) -> object:
        raise AssertionError("not opened in this test")

    sub = Subscription(never, stream="s", shard=2, start=5)  # type: ignore[arg-type]
    sub._tracker.next_offset = 5
    sub._accept(Records([b"a", b"b", b"c"], 10, [1, 2, 3], "pub", 2))
    assert list(sub._buffer) == [
        Event(b"a", 10, 1, "pub", 2, 3),
        Event(b"b", 11, 2, "pub", 2, 0),
        Event(b"c", 12, 3, "pub", 2, 0),
    ]
    assert (sub.next_offset, sub.dropped) == (13, 3)
    sub._accept(Records([b"d"], 13, None, None, 0))
    sub._accept(Records([b"e"], None, None, None, 0))  # a stream without offsets
    assert [(e.payload, e.offset, e.dropped_before) for e in list(sub._buffer)[3:]] == [
        (b"d", 13, 0),
        (b"e", None, 0),
    ]
    assert (sub.next_offset, sub.dropped) == (14, 3)
    event = sub._buffer[0]
    with pytest.raises(AttributeError):
        event.payload = b"x"  # type: ignore[misc]
