"""withhold_atomic_commit: the feature is not advertised, its requests are answered as not
served whoever has a handler for them, and each is counted by type."""

from __future__ import annotations

from pathlib import Path

from felix_broker.app import Broker
from felix_wire.features import Feature
from felix_wire.messages import Commit, StateGet, Unsupported

from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker


def _state_get(request_id: int) -> StateGet:
    return StateGet(
        tenant_id=TENANT,
        namespace=NS,
        stream="log",
        entity_key=b"e",
        key="k",
        request_id=request_id,
    )


def _not_served(broker: Broker, kind: str) -> float:
    value = broker.metrics.registry.get_sample_value(
        "felix_request_not_served_total", {"type": kind}
    )
    return value or 0.0


async def test_withheld_commits_are_not_advertised_and_answered_unsupported(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, withhold_atomic_commit=True) as broker:
        assert not broker.features & Feature.FEATURE_ATOMIC_COMMIT
        client = await WireClient.connect(broker)
        try:
            stream = await client.session()
            assert not client.server_features & Feature.FEATURE_ATOMIC_COMMIT
            await stream.send(_state_get(1))
            assert await stream.recv() == Unsupported(request_type="state_get", request_id=1)
            commit = Commit(
                tenant_id=TENANT, namespace=NS, stream="log", entity_key=b"e", event=b"x",
                request_id=2,
            )  # fmt: skip
            await stream.send(commit)
            assert await stream.recv() == Unsupported(request_type="commit", request_id=2)
        finally:
            client.close()
        assert _not_served(broker, "state_get") == 1
        assert _not_served(broker, "commit") == 1


async def test_by_default_commits_are_advertised_and_served(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        assert broker.features & Feature.FEATURE_ATOMIC_COMMIT
        client = await WireClient.connect(broker)
        try:
            answer = await client.request(_state_get(1))
            assert not isinstance(answer, Unsupported)
        finally:
            client.close()
        assert _not_served(broker, "state_get") == 0
