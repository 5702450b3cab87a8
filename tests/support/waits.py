"""A bounded wait for the async tests: poll a condition until it holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], seconds: float = 10.0) -> None:
    """Return once `check()` is true, polling every 20 ms; `TimeoutError` after
    `seconds`."""
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.02)
