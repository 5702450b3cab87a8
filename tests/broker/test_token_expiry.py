"""A stream's authority ends when its token expires plus the leeway (issue 20, finding 6),
over real QUIC with real signed tokens."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from felix_common.tokens import LEEWAY_SECONDS
from felix_transport import StreamClosedError
from felix_wire.errors import ErrorCode
from felix_wire.messages import (
    AckMode,
    AuthOk,
    Error,
    EventStreamHello,
    Publish,
    PublishError,
    PublishOk,
    Subscribe,
    Subscribed,
)

from ..fleet.harness import TOPOLOGIES, leader_of
from ..support.wire import NS, TENANT, WireClient, token
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)


def publish(request_id: int) -> Publish:
    return Publish(
        tenant_id=TENANT,
        namespace=NS,
        stream="orders",
        payload=b"p",
        request_id=request_id,
        ack=AckMode.PER_MESSAGE,
    )


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_requests_and_subscriptions_end_when_the_token_expires(
    tmp_path: Path, topology: str
) -> None:
    """Through a non-owner the publishes are forwarded (the owner verifies the token
    too) and the subscription is opened at the leader, where a non-owner redirects."""
    async with running_broker(tmp_path, topology=topology) as broker:
        # Expired 2 s ago, so it still passes `auth` within the leeway, whose end
        # comes 2 s from now.
        now = int(time.time())
        short = token(broker, ttl_seconds=1, issued_at=now - LEEWAY_SECONDS + 1)
        long = token(broker)
        client = await WireClient.connect(broker)
        leader = leader_of(broker)
        reader = client if leader is broker else await WireClient.connect(leader)
        expiring, ok = await client.authed(tok=short)
        assert isinstance(ok, AuthOk), ok
        healthy, ok = await client.authed(tok=long)
        assert isinstance(ok, AuthOk), ok
        watching, ok = await reader.authed(tok=short)
        assert isinstance(ok, AuthOk), ok

        await watching.send(Subscribe(tenant_id=TENANT, namespace=NS, stream="orders"))
        assert isinstance(await watching.recv(), Subscribed)
        events = await reader.event_stream()
        assert isinstance(await events.recv(), EventStreamHello)
        await expiring.send(publish(1))
        assert await expiring.recv() == PublishOk(request_id=1)

        await asyncio.sleep(3.0)  # past exp + leeway
        await expiring.send(publish(2))
        refused = await expiring.recv()
        assert isinstance(refused, PublishError), refused
        assert refused.request_id == 2 and refused.code == ErrorCode.UNAUTHENTICATED.wire
        with contextlib.suppress(StreamClosedError):
            await expiring.expect_end()

        # The subscription opened under the token ended too.
        async def drained() -> None:
            with contextlib.suppress(StreamClosedError, EOFError):
                while True:
                    await events.recv(timeout=5)

        async with asyncio.timeout(5):
            await drained()
        # One expiry per stream that held the token: the publishing one and the
        # subscribing one, wherever each was served.
        expiries = sum(
            b.metrics.registry.get_sample_value("felix_auth_token_expiries_total") or 0
            for b in {id(broker): broker, id(leader): leader}.values()
        )
        assert expiries == 2
        # A stream with a valid token on the same connection is unaffected.
        await healthy.send(publish(3))
        assert await healthy.recv() == PublishOk(request_id=3)
        client.close()
        reader.close()


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_a_token_past_the_leeway_is_refused_at_auth(tmp_path: Path, topology: str) -> None:
    async with running_broker(tmp_path, topology=topology) as broker:
        stale = token(broker, ttl_seconds=1, issued_at=int(time.time()) - LEEWAY_SECONDS - 5)
        client = await WireClient.connect(broker)
        _stream, answer = await client.authed(tok=stale)
        assert isinstance(answer, Error), answer
        client.close()
