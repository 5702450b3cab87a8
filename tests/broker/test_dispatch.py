"""The dispatch table against the generated catalogue.

Every client-to-broker message type is either handled or listed in
`NOT_SERVED` with the reason, and every feature the broker advertises has a
handler for each request it gates. A message added to the spec fails here
until someone decides which it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

from felix_broker.app import Broker
from felix_broker.session.dispatch import NOT_SERVED
from felix_wire.catalogue import FEATURES
from felix_wire.gating import MESSAGE_GATES
from felix_wire.messages import CLIENT_TO_BROKER, MESSAGE_CLASSES

from .harness import running_broker

BROKER_PACKAGE = Path(__file__).resolve().parents[2] / "felix_broker"


def _gated_requests(features: int) -> dict[str, set[str]]:
    """Feature name -> the client requests it gates, for every feature in `features`."""
    out: dict[str, set[str]] = {}
    for name, info in FEATURES.items():
        if info.value is None or not features & info.value:
            continue
        out[name] = {
            kind
            for kind, gate in MESSAGE_GATES.items()
            if kind in CLIENT_TO_BROKER and gate.features == info.value
        }
    return out


def _unserved_advertised(broker: Broker) -> dict[str, set[str]]:
    handled = broker.table.handled()
    gated = _gated_requests(broker.features)
    return {name: kinds - handled for name, kinds in gated.items() if kinds - handled}


async def test_every_client_request_is_handled_or_deliberately_not_served(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path) as broker:
        handled = broker.table.handled()
    assert not handled & NOT_SERVED.keys(), "listed as not served, yet handled"
    unknown = (handled | NOT_SERVED.keys()) - CLIENT_TO_BROKER - {"publish_batch_frame"}
    assert not unknown, f"not client-to-broker types in the catalogue: {sorted(unknown)}"
    undecided = CLIENT_TO_BROKER - handled - NOT_SERVED.keys()
    assert not undecided, f"neither handled nor listed in NOT_SERVED: {sorted(undecided)}"
    assert all(reason.strip() for reason in NOT_SERVED.values())


async def test_every_advertised_feature_has_its_handlers(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        assert _unserved_advertised(broker) == {}
    async with running_broker(tmp_path / "memory", durable_storage_dir="") as broker:
        assert _unserved_advertised(broker) == {}
        # Without a log, groups and bounded reads are neither advertised nor handled.
        assert "group_poll" not in broker.table.handled()
        assert "stream_read" not in broker.table.handled()


async def test_nothing_not_served_is_advertised(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        gated = _gated_requests(broker.features)
    advertised = set().union(*gated.values())
    assert not advertised & NOT_SERVED.keys()


def _isinstance_chains(tree: ast.AST, message_names: set[str]) -> list[int]:
    """Functions (their lines) with two or more `if` tests of one value's type against
    message classes: a dispatch by isinstance, whether as if/elif or as early returns.
    One membership test (`isinstance(m, A | B)`) is not a chain."""
    lines: list[int] = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        tests: dict[str, set[int]] = {}
        for node in ast.walk(func):
            if not isinstance(node, ast.If | ast.IfExp):
                continue
            for call in ast.walk(node.test):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "isinstance"
                    and len(call.args) == 2
                    and any(
                        isinstance(n, ast.Name) and n.id in message_names
                        for n in ast.walk(call.args[1])
                    )
                ):
                    tests.setdefault(ast.unparse(call.args[0]), set()).add(id(node))
        if any(len(ifs) >= 2 for ifs in tests.values()):
            lines.append(func.lineno)
    return lines


def test_no_isinstance_dispatch_over_message_types() -> None:
    message_names = {cls.__name__ for cls in MESSAGE_CLASSES.values()}
    found = {}
    for path in sorted(BROKER_PACKAGE.rglob("*.py")):
        chains = _isinstance_chains(ast.parse(path.read_text()), message_names)
        if chains:
            found[str(path.relative_to(BROKER_PACKAGE))] = chains
    assert found == {}


def test_a_ready_path_is_only_for_concurrent_types_and_a_gate_replaces_it() -> None:
    import pytest

    from felix_broker.session.context import RequestContext
    from felix_broker.session.dispatch import DispatchTable
    from felix_wire.messages import CacheGet

    async def handler(_request: CacheGet, _ctx: RequestContext) -> None:
        return None

    def ready(_request: CacheGet, _ctx: RequestContext) -> bytes | None:
        return b"answer"

    table = DispatchTable()
    with pytest.raises(ValueError, match="concurrent"):
        table.register(CacheGet, handler, ready=ready)
    table.register(CacheGet, handler, concurrent=True, ready=ready)
    assert table._routes[CacheGet].ready is ready
    # A gate in front of the handler (the fleet's switches) must see every
    # request, so the wrapped route answers through the handler only.
    table.wrap(CacheGet, lambda inner: inner)
    assert table._routes[CacheGet].ready is None
