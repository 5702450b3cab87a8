"""A small retry helper that retries only what the retry class allows.

`retry`, `retry_after` and `redirect`... only the first two say "nothing was
applied, the same request may succeed": those are retried, after the broker's
suggested wait when it gave one. `outcome_unknown` (and a local timeout or lost
connection, which are just as unknown) may have been applied, so it is
retried only for a request the caller declares idempotent. `redirect` needs a
different broker, and this helper resends to the same client, so it is not
retried here; `fatal` never is.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from felix_wire.errors import BrokerError, RetryClass

from .errors import ClientTimeoutError, ConnectionLostError

__all__ = ["retry", "should_retry"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def should_retry(error: BaseException, *, idempotent: bool) -> bool:
    """Whether resending the request that failed with `error` is allowed."""
    if isinstance(error, BrokerError):
        if error.retry in (RetryClass.RETRY, RetryClass.RETRY_AFTER):
            return True
        return error.retry is RetryClass.OUTCOME_UNKNOWN and idempotent
    if isinstance(error, ClientTimeoutError | ConnectionLostError):
        return idempotent
    return False


def _delay(error: BaseException, attempt: int, base: float, cap: float) -> float:
    if isinstance(error, BrokerError):
        suggested = error.detail.get("retry_after_ms")
        if isinstance(suggested, int) and suggested > 0:
            return min(cap, suggested / 1000)
    # Full jitter keeps many clients from retrying in lockstep.
    return random.uniform(0, min(cap, base * 2**attempt))


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int = 5,
    idempotent: bool = False,
    base_delay: float = 0.05,
    max_delay: float = 2.0,
) -> T:
    """Run `call()` until it succeeds, up to `attempts` times, retrying only errors
    whose retry class allows it; the last error is raised unchanged."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(attempts):
        try:
            return await call()
        except (BrokerError, ClientTimeoutError, ConnectionLostError) as exc:
            if attempt + 1 >= attempts or not should_retry(exc, idempotent=idempotent):
                raise
            wait = _delay(exc, attempt, base_delay, max_delay)
            logger.debug("attempt %d failed (%r); retrying in %.3f s", attempt + 1, exc, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")
