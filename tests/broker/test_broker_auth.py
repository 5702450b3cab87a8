"""Authentication, negotiation and per-stream protocol rules over real QUIC."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import pytest

from felix_broker.app import SERVER_FLAGS
from felix_transport import StreamClosedError
from felix_wire.frame import encode_header
from felix_wire.gating import client_auth
from felix_wire.messages import (
    Auth,
    AuthOk,
    Error,
    Ok,
    StreamShards,
    StreamShardsView,
    Subscribed,
    Unsupported,
)

from ..fleet.harness import TOPOLOGIES
from ..support.wire import OFFICIAL_FEATURES, TENANT, Feature, Flag, WireClient, token
from .harness import running_broker

pytestmark = pytest.mark.timeout(30)

# The client-visible rules of auth and of a stream's frames run against one broker and
# against a fleet of three, through the owner and through a non-owner (TOPOLOGIES): a
# client must not tell which broker it reached. Standalone-only here: the pre-auth
# bounds, the many-streams timing and the standalone drain (a fleet member's drain hands
# its shards off: tests/fleet/test_moves.py).


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_auth_ok_to_a_client_that_offered_flags(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _, answer = await client.authed()
        assert isinstance(answer, AuthOk)
        assert answer.server_flags == SERVER_FLAGS
        assert answer.server_flags & Flag.BINARY_PUBLISH_IDEMPOTENT  # idempotent frames served
        # The extended word: FEATURE_INSPECT (0x1) and FEATURE_PUBLISH_WIDTH (0x4).
        assert answer.server_features_hi == 0x5
        advertised = answer.server_features or 0
        assert advertised & Feature.FEATURE_STREAM_SHARDS
        # The cluster features exactly where there is a cluster: a standalone broker
        # advertises nothing it cannot answer, every fleet member (owner or not) all.
        for cluster in (
            Feature.FEATURE_TOPOLOGY,
            Feature.FEATURE_REDIRECT,
            Feature.FEATURE_SHARD_MOVED,
        ):
            assert bool(advertised & cluster) is (topology != "one"), cluster
        assert answer.publish_window == 256
        client.close()


async def test_plain_ok_without_client_flags(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        _, answer = await client.authed(flags=None, features=0)
        assert answer == Ok()
        client.close()


@pytest.mark.parametrize("with_codes", [True, False])
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_bad_token_is_unauthenticated_and_ends_the_stream(
    tmp_path: Path, with_codes: bool, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        features = int(Feature.FEATURE_ERROR_CODES) if with_codes else 0
        stream, answer = await client.authed(tok="not-a-jwt", features=features)
        assert isinstance(answer, Error)
        if with_codes:
            assert (answer.code, answer.retry) == ("unauthenticated", "fatal")
        else:
            assert (answer.code, answer.retry, answer.detail) == (None, None, None)
        await stream.expect_end()
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_token_of_another_tenant_and_expired_token(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _, answer = await client.authed(tok=token(broker, tenant="t2"))
        assert isinstance(answer, Error) and answer.code == "unauthenticated"
        expired = token(broker, ttl_seconds=1, issued_at=int(time.time()) - 3600)
        _, answer = await client.authed(tok=expired)
        assert isinstance(answer, Error) and answer.code == "unauthenticated"
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_request_before_auth(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream = await client.stream()
        await stream.send(
            StreamShards(tenant_id=TENANT, namespace="default", stream="orders", request_id=1)
        )
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.message.startswith("authenticate first")
        await stream.expect_end()
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_second_auth_is_refused_and_the_stream_goes_on(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        await stream.send(client_auth(TENANT, token(broker), client_flags=1, client_features=0))
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        await stream.send(
            StreamShards(tenant_id=TENANT, namespace="default", stream="orders", request_id=2)
        )
        assert await stream.recv() == StreamShardsView(shards=1, request_id=2)
        client.close()


async def test_oversize_preauth_frame_resets_the_stream_on_the_header_alone(tmp_path: Path) -> None:
    async with running_broker(tmp_path, preauth_max_frame_bytes=1024) as broker:
        client = await WireClient.connect(broker)
        stream = await client.stream()
        await stream.send(encode_header(0, 4096))  # no payload follows
        with pytest.raises(StreamClosedError):
            async with asyncio.timeout(5):
                await stream.stream.read()
        client.close()


async def test_frames_above_the_preauth_cap_are_fine_after_auth(tmp_path: Path) -> None:
    async with running_broker(tmp_path, preauth_max_frame_bytes=1024) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        await stream.send(
            StreamShards(tenant_id=TENANT, namespace="x" * 2000, stream="orders", request_id=3)
        )
        assert await stream.recv() == StreamShardsView(shards=0, request_id=3)
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_auth_timeout_closes_the_connection_with_code_1(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, auth_timeout_ms=300, topology=topology) as broker:
        client = await WireClient.connect(broker)
        async with asyncio.timeout(5):
            await client.connection.wait_closed()
        termination = client.connection.termination
        assert termination is not None
        assert (termination.error_code, termination.reason_phrase) == (1, "authentication timeout")


async def test_an_authenticated_stream_stops_the_auth_timeout(tmp_path: Path) -> None:
    async with running_broker(tmp_path, auth_timeout_ms=300) as broker:
        client = await WireClient.connect(broker)
        await client.authed()
        await asyncio.sleep(0.6)
        assert not client.connection.closed
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_unknown_flag_bit_is_a_per_frame_error(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        await stream.send(encode_header(0x8000, 3) + b"abc")
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        assert answer.message == "unsupported frame flags"
        await stream.send(
            StreamShards(tenant_id=TENANT, namespace="default", stream="orders", request_id=4)
        )
        assert await stream.recv() == StreamShardsView(shards=1, request_id=4)
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_idempotent_frames_need_the_acked_bit(tmp_path: Path, topology: str) -> None:
    # 0x0100 is served (streams/guarded.py), but only with 0x0008: 0x0101 is refused.
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        body = struct.pack(">QQ", 7, 0)
        await stream.send(encode_header(0x0101, len(body)) + body)
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_unknown_type_with_and_without_feature_unsupported(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()  # offers FEATURE_UNSUPPORTED like the official client
        raw = b'{"type":"frobnicate","request_id":9}'
        await stream.send(encode_header(0, len(raw)) + raw)
        assert await stream.recv() == Unsupported(request_type="frobnicate", request_id=9)
        plain, _ = await client.authed(features=int(Feature.FEATURE_ERROR_CODES))
        await plain.send(encode_header(0, len(raw)) + raw)
        await plain.expect_end()
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_broker_message_from_a_client_closes_the_stream(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        await stream.send(Subscribed(subscription_id=1))
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.message == "unexpected message type"
        await stream.expect_end()
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_malformed_known_message_is_fatal_for_the_stream(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        stream, _ = await client.authed()
        raw = b'{"type":"stream_shards","tenant_id":"t1"}'
        await stream.send(encode_header(0, len(raw)) + raw)
        answer = await stream.recv()
        assert isinstance(answer, Error) and answer.code == "invalid_request"
        await stream.expect_end()
        client.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_extended_feature_word_only_to_a_client_that_set_the_marker(
    tmp_path: Path, topology: str
) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        _, answer = await client.authed(features=OFFICIAL_FEATURES)
        # FEATURE_INSPECT (0x1) and FEATURE_PUBLISH_WIDTH (0x4), with the marker.
        assert isinstance(answer, AuthOk) and answer.server_features_hi == 0x5
        assert (answer.server_features or 0) & 0x8000_0000
        _, answer = await client.authed(features=OFFICIAL_FEATURES & 0x7FFF_FFFF)
        assert isinstance(answer, AuthOk) and answer.server_features_hi is None
        assert not (answer.server_features or 0) & 0x8000_0000
        client.close()


async def test_many_streams_authenticate_one_after_another_quickly(tmp_path: Path) -> None:
    """The official client opens 40 streams at connect, each waiting for its auth answer."""
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        started = time.monotonic()
        for _ in range(40):
            _, answer = await client.authed()
            assert isinstance(answer, AuthOk)
        assert time.monotonic() - started < 5
        client.close()


async def test_preauth_streams_beyond_the_cap_wait_their_turn(tmp_path: Path) -> None:
    async with running_broker(tmp_path, preauth_max_streams_per_conn=2) as broker:
        client = await WireClient.connect(broker)
        idle = [await client.stream() for _ in range(2)]
        for stream in idle:
            await stream.send(b"")  # opened, but no auth yet
            await stream.stream.write(
                encode_header(0, 100)
            )  # a partial frame keeps them unauthenticated
        third = await client.stream()
        await third.send(client_auth(TENANT, token(broker), client_flags=1, client_features=0))
        with pytest.raises(TimeoutError):
            await third.recv(timeout=0.5)
        await idle[0].stream.write(b"", end_stream=True)  # frees one pre-auth slot
        assert isinstance(await third.recv(), AuthOk)
        client.close()


async def test_draining_broker_refuses_auth_then_closes_with_code_0(tmp_path: Path) -> None:
    async with running_broker(tmp_path, drain_timeout_ms=2000) as broker:
        client = await WireClient.connect(broker)
        await client.authed()
        drain = asyncio.get_running_loop().create_task(broker.drain())
        async with asyncio.timeout(5):
            await client.connection.wait_closed()
        await drain
        termination = client.connection.termination
        assert termination is not None and termination.error_code == 0
        assert broker.health.state.value == "draining"
        # The listener stays up while draining; a new stream's auth is refused.
        late = await WireClient.connect(broker)
        stream, answer = await late.authed()
        assert isinstance(answer, Error) and (answer.code, answer.retry) == ("draining", "retry")
        await stream.expect_end()
        late.close()


def test_auth_message_keys() -> None:
    # The harness sends what the official client sends.
    auth = client_auth(TENANT, "x", client_flags=0x1FFF, client_features=OFFICIAL_FEATURES)
    assert auth == Auth(
        tenant_id=TENANT,
        token="x",
        client_flags=8191,
        client_features=4218945535,
        client_features_hi=15,
    )
