"""Hostile bodies on every writing route of the control plane: every answer is a
typed JSON refusal or success, never a 500, and a refused request writes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felix_controlplane.http import Request

from .support import BOOTSTRAP_SECRET, control_plane, fake_idp, setup_tenant

pytestmark = pytest.mark.timeout(120)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(
            ["name", "shards", "durability", "retention", "routing", "consistency", "perms",
             "subject", "ttl_seconds", "audience", "actions", "resources", "permissions",
             "policy", "subjects", "groups", "issuer", "jwks_url", "tenant", "admin", "x"]
        ),
        inner,
        max_size=5,
    ),
    max_leaves=12,
)  # fmt: skip
_bodies = (
    _json.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
    | st.integers(min_value=1, max_value=3000).map(lambda n: b"[" * n + b"]" * n)
    | st.just(b'{"name": "1e99999"}')
    | st.just(b'{"shards": 1e400}')
)
_ROUTES = [
    ("POST", "/v1/tenants/acme/namespaces"),
    ("POST", "/v1/tenants/acme/namespaces/ns/streams"),
    ("POST", "/v1/tenants/acme/namespaces/ns/caches"),
    ("PUT", "/v1/tenants/acme/policies/p"),
    ("PUT", "/v1/tenants/acme/assignments/a"),
    ("PUT", "/v1/tenants/acme/identity-providers/i"),
    ("POST", "/v1/tenants/acme/tokens"),
    ("POST", "/v1/tenants/acme/token/exchange"),
]


async def test_hostile_bodies_on_every_writing_route(tmp_path: Path) -> None:
    async with control_plane(tmp_path) as plane, fake_idp() as idp:
        admin = await setup_tenant(plane, idp, "acme")
        upstream = idp.token("alice")
        seen: set[int] = set()

        async def send(method: str, path: str, token: str, body: bytes, peer: str) -> Any:
            request = Request(method, path, {}, {"authorization": f"Bearer {token}"}, body, peer)
            handler = plane.control.handle_admin if peer else plane.control.handle
            return await handler(request)

        @settings(
            max_examples=400,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(route=st.sampled_from([*_ROUTES, ("POST", "/v1/bootstrap")]), body=_bodies)
        def one(route: tuple[str, str], body: bytes) -> None:
            method, path = route
            if path == "/v1/bootstrap":
                token, peer = BOOTSTRAP_SECRET, "127.0.0.1"
            else:
                token, peer = (upstream if path.endswith("/exchange") else admin), ""
            response = asyncio.run_coroutine_threadsafe(
                send(method, path, token, body, peer), loop
            ).result(timeout=30)
            seen.add(response.status)
            assert response.status < 500, (route, body[:200], response.body)
            if response.status >= 400:
                assert isinstance(response.body, dict) and response.body.get("error")

        loop = asyncio.get_running_loop()
        await asyncio.to_thread(one)
        assert 400 in seen, seen
