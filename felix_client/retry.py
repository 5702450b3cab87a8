"""A small retry helper that resends exactly what the retry class allows.

The broker's class decides, never the code's default table (§8):

- `retry`: nothing was applied; resent after a jittered backoff.
- `retry_after`: nothing was applied; resent after `detail.retry_after_ms` when
  the broker gave it, else after the backoff.
- `redirect`: nothing was applied, but the request belongs to another broker;
  this helper resends to the same client, so it does not retry it.
- `outcome_unknown`: the request may have been applied. Never resent here: a
  second publish would be a duplicate. The idempotent producer
  (`client.producer`), which resends under the same sequence, is the one safe way.
- `fatal`, or no class at all (a broker that sent no code): never resent.

A local timeout or lost connection is just as unknown as `outcome_unknown`,
so it is resent only for a call the caller declares `idempotent` (one that
changes nothing, such as a read): the caller knows that, the wire does not.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from felix_wire.errors import BrokerError, RetryClass

from .errors import ClientTimeoutError, ConnectionLostError

__all__ = ["backoff_delay", "retry", "should_retry"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_RESENDABLE = frozenset({RetryClass.RETRY, RetryClass.RETRY_AFTER})


def should_retry(error: BaseException, *, idempotent: bool = False) -> bool:
    """Whether resending the request that failed with `error` is allowed."""
    if isinstance(error, BrokerError):
        return error.retry in _RESENDABLE
    if isinstance(error, ClientTimeoutError | ConnectionLostError):
        return idempotent
    return False


def backoff_delay(error: BaseException, attempt: int, base: float, cap: float) -> float:
    """How long to wait before attempt `attempt + 1`: the broker's `retry_after_ms`
    for `retry_after`, else full jitter in [0, min(cap, base * 2**attempt)]."""
    if isinstance(error, BrokerError) and error.retry is RetryClass.RETRY_AFTER:
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
    """Run `call()` until it succeeds, up to `attempts` times, resending only after
    errors whose retry class allows it (see the module); the last error is raised
    unchanged. `idempotent` only widens local timeouts and lost connections."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(attempts):
        try:
            return await call()
        except (BrokerError, ClientTimeoutError, ConnectionLostError) as exc:
            if attempt + 1 >= attempts or not should_retry(exc, idempotent=idempotent):
                raise
            wait = backoff_delay(exc, attempt, base_delay, max_delay)
            logger.debug("attempt %d failed (%r); retrying in %.3f s", attempt + 1, exc, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")
