"""The retry helper resends exactly what the broker's retry class allows."""

from __future__ import annotations

import pytest

import felix_client
from felix_client import ClientTimeoutError, ConnectionLostError, RetryClass, should_retry
from felix_client.retry import backoff_delay
from felix_wire.errors import broker_error


def _refusal(retry: RetryClass | None, **detail: int) -> felix_client.BrokerError:
    wire = None if retry is None else retry.name.lower()
    return broker_error("refused", "unacknowledged", wire, detail or None)


@pytest.mark.parametrize(
    ("retry", "resent"),
    [
        (RetryClass.RETRY, True),
        (RetryClass.RETRY_AFTER, True),
        (RetryClass.REDIRECT, False),  # another broker's business
        (RetryClass.OUTCOME_UNKNOWN, False),  # may have been applied: never resent
        (RetryClass.FATAL, False),
        (None, False),  # a broker that sent no class
    ],
)
@pytest.mark.parametrize("idempotent", [False, True])
async def test_each_class(retry: RetryClass | None, resent: bool, idempotent: bool) -> None:
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise _refusal(retry)
        return "done"

    assert should_retry(_refusal(retry), idempotent=idempotent) is resent
    if resent:
        assert await felix_client.retry(call, attempts=3, base_delay=0.001) == "done"
        assert calls == 3
    else:
        with pytest.raises(felix_client.BrokerError):
            await felix_client.retry(call, attempts=3, idempotent=idempotent, base_delay=0.001)
        assert calls == 1


@pytest.mark.parametrize("error", [ClientTimeoutError("t"), ConnectionLostError("c")])
async def test_local_unknowns_only_for_idempotent_calls(error: Exception) -> None:
    calls = 0

    async def call() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise error
        return calls

    with pytest.raises(type(error)):
        await felix_client.retry(call, attempts=3, base_delay=0.001)
    assert calls == 1
    assert await felix_client.retry(call, attempts=3, idempotent=True, base_delay=0.001) == 2


def test_retry_after_waits_what_the_broker_said() -> None:
    assert backoff_delay(_refusal(RetryClass.RETRY_AFTER, retry_after_ms=250), 0, 0.05, 2.0) == 0.25
    assert backoff_delay(_refusal(RetryClass.RETRY_AFTER, retry_after_ms=9000), 0, 0.05, 2.0) == 2.0
    # A plain retry with a stray hint still backs off with jitter, within the cap.
    assert 0 <= backoff_delay(_refusal(RetryClass.RETRY, retry_after_ms=900), 0, 0.05, 2.0) <= 0.05
