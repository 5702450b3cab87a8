"""Every request gets an answer or a clean stream end (issue 20, finding 2), over real QUIC."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from felix_transport import StreamClosedError
from felix_wire.errors import ErrorCode
from felix_wire.frame import encode_header
from felix_wire.messages import (
    AckMode,
    AuthOk,
    CacheGet,
    CacheValue,
    Error,
    Publish,
    PublishError,
    PublishOk,
)

from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

pytestmark = pytest.mark.timeout(60)


def acked_publish(request_id: int, stream: str = "log") -> Publish:
    return Publish(
        tenant_id=TENANT,
        namespace=NS,
        stream=stream,
        payload=b"x",
        request_id=request_id,
        ack=AckMode.PER_MESSAGE,
    )


async def test_first_publish_to_a_log_that_cannot_be_created_answers_storage(
    tmp_path: Path,
) -> None:
    # A file where the tenant's folder belongs: creating the shard's first segment
    # fails with an OSError, as it does on a full disk (ENOSPC).
    (tmp_path / "durable").mkdir()
    (tmp_path / "durable" / TENANT).write_bytes(b"")
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        control, ok = await client.authed()
        assert isinstance(ok, AuthOk)
        await control.send(acked_publish(7))
        answer = await control.recv()
        assert isinstance(answer, PublishError), answer
        assert answer.request_id == 7 and answer.code == ErrorCode.STORAGE.wire
        # The stream and the broker go on serving.
        await control.send(acked_publish(8, stream="orders"))
        assert await control.recv() == PublishOk(request_id=8)
        client.close()


async def test_an_unexpected_exception_answers_internal_with_the_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_broker(tmp_path) as broker:
        assert broker.cache is not None and broker.engine is not None

        def bug(*_args: object, **_kw: object) -> object:
            raise RuntimeError("an injected bug")

        client = await WireClient.connect(broker)
        control, _ = await client.authed()
        monkeypatch.setattr(broker.cache, "_admit", bug)  # a concurrent handler
        monkeypatch.setattr(broker.engine, "shard_for", bug)  # an inline one
        await control.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=41)
        )
        answer = await control.recv()
        assert isinstance(answer, Error), answer
        assert answer.code == ErrorCode.INTERNAL.wire and "request_id 41" in answer.message
        await control.send(acked_publish(42))
        answer = await control.recv()
        assert isinstance(answer, PublishError), answer
        assert answer.request_id == 42 and answer.code == ErrorCode.INTERNAL.wire
        registry = broker.metrics.registry
        for kind in ("cache_get", "publish"):
            count = registry.get_sample_value("felix_request_internal_errors_total", {"type": kind})
            assert count == 1.0, kind
        monkeypatch.undo()
        await control.send(
            CacheGet(tenant_id=TENANT, namespace=NS, cache="c", key="k", request_id=43)
        )
        assert isinstance(await control.recv(), CacheValue)
        client.close()


async def test_json_nested_1000_deep_before_auth_ends_the_stream_cleanly(tmp_path: Path) -> None:
    payload = b'{"type":"auth","x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert len(payload) < 2100
    async with running_broker(tmp_path) as broker:
        client = await WireClient.connect(broker)
        for _ in range(5):
            stream = await client.stream()
            await stream.send(encode_header(0, len(payload)) + payload)
            # Refused as malformed JSON before any decoder recursed: an answer, then
            # the end of the stream (not an abandoned stream after a RecursionError).
            answer = await stream.recv()
            assert isinstance(answer, Error), answer
            with contextlib.suppress(StreamClosedError):
                await stream.expect_end()
        failures = broker.metrics.registry.get_sample_value(
            "felix_request_internal_errors_total", {"type": "stream"}
        )
        assert failures is None
        # The connection is still served.
        _control, ok = await client.authed()
        assert isinstance(ok, AuthOk)
        await asyncio.sleep(0.1)
        client.close()
