"""The suite's asyncio guard (tests/conftest.py) sees what asyncio only logs."""

from __future__ import annotations

import asyncio
import gc

from .conftest import ASYNCIO_ERRORS


def test_an_unretrieved_future_exception_is_caught_by_the_guard() -> None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        future.set_exception(RuntimeError("nobody looks"))
        del future
        gc.collect()
    finally:
        loop.close()
    assert any("Future exception was never retrieved" in m for m in ASYNCIO_ERRORS.messages)
    ASYNCIO_ERRORS.messages.clear()  # seen on purpose: let this test pass
