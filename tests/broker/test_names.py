"""The one name rule at every broker entry point (issue 20, finding 1): catalog files,
specs however made, the control plane's sync and API validation, and requests over
real QUIC. Hostile names come from the generated strategy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from felix_broker.catalog import CacheSpec, CatalogError, StreamSpec, load_catalog
from felix_broker.catalog.live import LiveCatalog
from felix_common import feed
from felix_controlplane.model import ApiError, check_name
from felix_wire.errors import ErrorCode
from felix_wire.messages import (
    CacheGet,
    CachePut,
    Error,
    GroupDescribe,
    GroupPoll,
    Message,
    Subscribe,
)
from felix_wire.names import InvalidNameError
from felix_wire.strategies import hostile_names, valid_names

from ..fleet.harness import TOPOLOGIES
from ..support.wire import NS, TENANT, WireClient
from .harness import running_broker

POSITIONS = st.sampled_from(["tenant", "namespace", "stream", "cache"])


def catalog_section(tenant: str, namespace: str, stream: str, cache: str) -> dict[str, object]:
    body = {"streams": {stream: {"durable": True}}, "caches": {cache: {"shards": 1}}}
    return {"tenants": {tenant: {"namespaces": {namespace: body}}}}


@given(POSITIONS, hostile_names())
def test_a_catalog_file_with_a_hostile_name_is_refused_naming_where(
    position: str, hostile: str
) -> None:
    names = {"tenant": "t", "namespace": "n", "stream": "s", "cache": "c"}
    names[position] = hostile
    with pytest.raises(CatalogError) as info:
        load_catalog(catalog_section(**names))
    assert "invalid name" in str(info.value)


def test_the_issue_catalog_of_dot_dot_names_is_refused() -> None:
    with pytest.raises(CatalogError):
        load_catalog(catalog_section("..", "..", "..", ".."))
    with pytest.raises(CatalogError):
        load_catalog(catalog_section("t", ".", "a", "a"))


@given(st.integers(0, 2), hostile_names(), valid_names(), valid_names())
def test_specs_refuse_hostile_names_however_they_are_made(
    position: int, hostile: str, a: str, b: str
) -> None:
    names = [a, b, a]
    names[position] = hostile
    with pytest.raises(InvalidNameError):
        StreamSpec(*names, durable=True)
    with pytest.raises(InvalidNameError):
        CacheSpec(*names)


@given(hostile_names())
def test_the_control_plane_refuses_hostile_names(hostile: str) -> None:
    with pytest.raises(ApiError) as info:
        check_name(hostile, "namespace.name")
    assert info.value.status == 400


@pytest.mark.parametrize("hostile", [".", "..", "a/b", "x" * 200, "\x00"])
def test_catalog_sync_ignores_hostile_names(hostile: str) -> None:
    live = LiveCatalog("http://127.0.0.1:9", sync_token="x")
    changes = [
        {"op": "put", "kind": "tenant", "tenant": hostile, "namespace": "", "name": ""},
        {"op": "put", "kind": "namespace", "tenant": "t", "namespace": "", "name": hostile},
        {
            "op": "put",
            "kind": "cache",
            "tenant": "t",
            "namespace": hostile,
            "name": "c",
            "body": {"name": "c", "shards": 1},
        },
        {
            "op": "put",
            "kind": "stream",
            "tenant": "t",
            "namespace": "n",
            "name": hostile,
            "body": {"name": hostile, "durability": "durable"},
        },
    ]
    for seq, change in enumerate(changes, start=1):
        live._apply(feed.Change(seq=seq, **change))  # type: ignore[arg-type]
    assert not live.tenant_exists(hostile)
    assert not live.namespace_exists("t", hostile)
    assert live.streams() == [] and live.caches() == []


HOSTILE = [".", "..", "../..", "a/b", "\x00", "x" * 129, "\u2025", "", "..\\x"]


def tree(root: Path) -> set[str]:
    return {str(Path(d).relative_to(root)) for d, _subs, _files in os.walk(root)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_requests_with_hostile_names_create_nothing_on_disk(
    tmp_path: Path, topology: str
) -> None:
    """Refused wherever they arrive, by every broker alike: a non-owner forwards or
    redirects nothing with an unsafe name (group names included: it checks them
    before it routes the request by its shard)."""
    async with running_broker(tmp_path, topology=topology) as broker:
        client = await WireClient.connect(broker)
        control, _ = await client.authed()

        async def refused(request: Message) -> Error:
            await control.send(request)
            answer = await control.recv()
            assert isinstance(answer, Error), answer
            return answer

        before = tree(tmp_path.parent)
        for rid, hostile in enumerate(HOSTILE, start=1):
            scope = {"tenant_id": TENANT, "namespace": NS, "stream": "log", "shard": 0}
            # Group names follow the rule too (they go into permission objects).
            for request in (
                GroupDescribe(**scope, group=hostile, request_id=rid),
                GroupPoll(**scope, group=hostile, max_records=1, request_id=rid),
            ):
                answer = await refused(request)
                assert answer.code == ErrorCode.INVALID_REQUEST.wire
            for tenant, namespace, name in ((TENANT, hostile, "c"), (TENANT, NS, hostile)):
                await refused(
                    CachePut(
                        tenant_id=tenant,
                        namespace=namespace,
                        cache=name,
                        key="k",
                        value=b"v",
                        request_id=rid,
                    )
                )
                await refused(
                    CacheGet(
                        tenant_id=tenant, namespace=namespace, cache=name, key="k", request_id=rid
                    )
                )
                await refused(Subscribe(tenant_id=tenant, namespace=namespace, stream=name))
        # Nothing appeared anywhere near the data directory.
        new = tree(tmp_path.parent) - before
        assert all(d == tmp_path.name or d.startswith(tmp_path.name + os.sep) for d in new), new
        assert {d for d in tree(tmp_path) if ".." in d or "\x00" in d} == set()
        client.close()
