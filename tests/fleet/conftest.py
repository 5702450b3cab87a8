"""Fleet tests run against a real etcd (tests/support/etcd.py)."""

from collections.abc import AsyncIterator

import pytest

from tests.support.etcd import etcd_server

from .support import PLACER_CLIENTS

__all__ = ["close_placer_clients", "etcd_server"]


@pytest.fixture(autouse=True)
async def close_placer_clients() -> AsyncIterator[None]:
    """Close every placer's etcd client a test made, before its event loop closes
    (left to the garbage collector, the gRPC channel closes on a closed loop)."""
    yield
    while PLACER_CLIENTS:
        await PLACER_CLIENTS.pop().close()
