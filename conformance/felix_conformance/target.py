"""The target broker: where it is, how to trust it, its setup, what it advertises.

`probe` authenticates once offering every flag and feature the catalogue knows,
and reads back what the target advertises; cases needing something it did not
advertise are "unsupported" rather than failed. This is all the kit learns
about a target besides the wire itself, so it works against any broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from felix_transport import (
    Connection,
    ConnectionClosedError,
    Stream,
    StreamClosedError,
    TransportConfig,
    connect,
)
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.features import FEATURE_INFO, Feature
from felix_wire.flags import KNOWN_FLAGS
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth, server_capabilities
from felix_wire.messages import (
    AuthOk,
    CacheShards,
    CacheShardsView,
    Error,
    Ok,
    ShardKind,
    ShardOwner,
    ShardOwners,
    ShardOwnersView,
    StreamShards,
    StreamShardsView,
    Topology,
    TopologyView,
)
from felix_wire.wire_errors import WireError

__all__ = [
    "ALL_FEATURES",
    "CACHE_VARIABLES",
    "FIXTURE_VARIABLES",
    "LIMITED_BROKER",
    "STREAM_VARIABLES",
    "Advertised",
    "Discovery",
    "Target",
    "TargetRefusedError",
    "TargetUnreachableError",
    "discover",
    "fixture_ca_file",
    "parse_host_port",
    "probe",
    "shard_owners",
    "target_from_fixture",
]

_log = logging.getLogger(__name__)

# Every feature with a known bit: the probe offers them all so the target's
# answer is not limited by what we offered.
ALL_FEATURES = sum(info.value for info in FEATURE_INFO.values() if info.value is not None)
# Names a `felix-broker fixture` document provides that transcripts may use.
FIXTURE_VARIABLES = (
    "tenant_id",
    "namespace",
    "token",
    "unauthorized_token",
    "inspector_token",
    "durable_stream",
    "leader_durable_stream",
    "memory_stream",
    "publisher_stream",
    "missing_stream",
    "cache",
    "single_shard_cache",
    "movable_stream",
    "quorum_stream",
    "quorum_cache",
    "flood_stream",
    "control_url",
)
CONNECT_TIMEOUT = 10.0
CONNECT_ATTEMPTS = 2
KEEPALIVE_INTERVAL = 2.0  # below the 6 s QUIC idle timeout both sides default to


class TargetUnreachableError(Exception):
    """No QUIC connection could be made (address, trust or ALPN problem)."""


class TargetRefusedError(Exception):
    """The target refused the kit's own credentials."""


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    ca_pem: bytes
    server_name: str = "localhost"
    variables: dict[str, Any] = field(default_factory=dict)
    # Variables the profile named but the target turned out not to have, and why.
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def at(self, address: str) -> Target:
        """The same target setup reached at another broker of its fleet (HOST:PORT)."""
        host, port = parse_host_port(address)
        return Target(host, port, self.ca_pem, self.server_name, self.variables, self.unavailable)

    def transport_config(
        self, alpn: tuple[str, ...] | None = None, *, keepalive: bool = False
    ) -> TransportConfig:
        """The kit's client configuration; `alpn` given, the handshake offers exactly
        those ALPN ids (none when empty), else the kit's default (none offered).
        `keepalive` PINGs every KEEPALIVE_INTERVAL so an idle connection the case
        holds (one of a connection cap's) is not lost to the idle timeout."""
        options: dict[str, Any] = {"server_name": self.server_name}
        if alpn:
            options.update(alpn_protocols=alpn, offer_alpn=True)
        if keepalive:
            options["keepalive_interval"] = KEEPALIVE_INTERVAL
        return TransportConfig.client(self.ca_pem, **options)

    @property
    def fleet(self) -> list[str]:
        """HOST:PORT of every broker of the target's fleet (the profile's `brokers`);
        just the target when none is known."""
        brokers = self.variables.get("brokers")
        if isinstance(brokers, list) and brokers:
            return [str(b) for b in brokers]
        return [self.address]

    async def connect(
        self,
        address: str | None = None,
        alpn: tuple[str, ...] | None = None,
        *,
        keepalive: bool = False,
    ) -> Connection:
        """A new connection to the target, or to `address` (HOST:PORT of another
        broker of its fleet, trusted with the same CA and server name). A handshake
        that fails is tried once more: on a loaded machine a lost Initial packet can
        end one in an idle timeout, and a case must not fail for that; two failures
        in a row are the broker's."""
        host, port = (self.host, self.port) if address is None else parse_host_port(address)
        where = f"{host}:{port}"
        problems: list[str] = []
        for _attempt in range(CONNECT_ATTEMPTS):
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    return await connect(
                        self.transport_config(alpn, keepalive=keepalive), host, port
                    )
            except (ConnectionClosedError, OSError, TimeoutError) as exc:
                problems.append(str(exc) or type(exc).__name__)
                _log.warning("connecting to %s failed: %s", where, problems[-1])
        raise TargetUnreachableError(f"cannot connect to {where}: {'; '.join(problems)}")


def target_from_fixture(path: Path, *, server_name: str | None = None) -> Target:
    """The target a `felix-broker fixture` document describes (its first address).

    A relative `ca_file` is relative to the fixture document's folder, as the
    broker wrote it there, not to wherever the kit happens to run.
    """
    document: dict[str, Any] = json.loads(path.read_text())
    host, port = parse_host_port(document["addrs"][0])
    variables = {name: document[name] for name in FIXTURE_VARIABLES if name in document}
    if len(document["addrs"]) > 1:
        variables["brokers"] = list(document["addrs"])  # a fleet: cluster cases run
    if document.get("limited_addrs"):
        variables[LIMITED_BROKER] = document["limited_addrs"][0]  # the limit cases run
    return Target(
        host,
        port,
        fixture_ca_file(path, document).read_bytes(),
        server_name or "localhost",
        with_defaults(variables),
    )


def fixture_ca_file(path: Path, document: dict[str, Any]) -> Path:
    """The CA file a fixture document names, resolved against the document's folder."""
    ca_file = Path(document["ca_file"])
    return ca_file if ca_file.is_absolute() else path.parent / ca_file


def with_defaults(variables: dict[str, Any]) -> dict[str, Any]:
    """Variables every run has unless the profile names them: a tenant that is
    surely not the token's, a stream name that surely does not exist
    (discovery checks that it does not), and durable_stream as the
    leader_durable_stream."""
    out = dict(variables)
    if "tenant_id" in out:
        out.setdefault("other_tenant", f"{out['tenant_id']}-conformance-other")
    out.setdefault("missing_stream", "conformance-no-such-stream")
    # The idempotent, conditional and commit cases need a Leader stream; a profile
    # naming none has them use durable_stream (a single broker's is one).
    if "durable_stream" in out:
        out.setdefault("leader_durable_stream", out["durable_stream"])
    return out


@dataclass(frozen=True)
class Advertised:
    """What the target answered to an auth offering everything."""

    flags: int
    features: int
    legacy: bool  # plain `ok`: an old broker that negotiates nothing


class _Control:
    """One authenticated control stream to the target, for the kit's own questions."""

    def __init__(self, connection: Connection, stream: Stream, timeout: float) -> None:
        self.connection = connection
        self.stream = stream
        self.timeout = timeout
        self.reader = FrameReader()
        self.pending: list[Any] = []

    async def next_answer(self) -> Any:
        async with asyncio.timeout(self.timeout):
            while not self.pending:
                data = await self.stream.read()
                if not data:
                    raise TargetRefusedError("the target ended the stream without answering")
                self.pending += [decode_payload(f.flags, f.payload) for f in self.reader.feed(data)]
        return self.pending.pop(0)

    async def send(self, message: Any) -> None:
        await self.stream.write(encode_frame(message))


async def _authenticated(target: Target, timeout: float) -> tuple[_Control, Any]:
    """A control stream with the kit's auth sent, and the target's answer to it."""
    connection = await target.connect()
    try:
        stream = await connection.open_bidi_stream()
        control = _Control(connection, stream, timeout)
        await control.send(
            client_auth(
                target.variables.get("tenant_id", ""),
                target.variables.get("token", ""),
                client_flags=KNOWN_FLAGS,
                client_features=ALL_FEATURES,
            )
        )
        answer = await control.next_answer()
    except (StreamClosedError, ConnectionClosedError, TimeoutError, WireError) as exc:
        connection.close()
        raise TargetRefusedError(f"no usable answer to auth: {exc!r}") from None
    except BaseException:
        connection.close()
        raise
    return control, answer


async def probe(target: Target, timeout: float = CONNECT_TIMEOUT) -> Advertised:
    control, answer = await _authenticated(target, timeout)
    control.connection.close()
    if isinstance(answer, Error):
        raise TargetRefusedError(f"the target refused the token: {answer.message}")
    if not isinstance(answer, AuthOk | Ok):
        raise TargetRefusedError(f"unexpected answer to auth: {answer!r}")
    capabilities = server_capabilities(answer)
    _log.info(
        "target %s advertises flags %#06x features %#x",
        target.address,
        capabilities.flags,
        capabilities.features,
    )
    return Advertised(capabilities.flags, capabilities.features, isinstance(answer, Ok))


async def shard_owners(
    target: Target, names: list[tuple[str, str]], timeout: float = CONNECT_TIMEOUT
) -> dict[tuple[str, str], list[ShardOwner]]:
    """The owners the target reports (`shard_owners`) for each (kind, name), kind
    "stream" or "cache"; a name it answered with anything else is left out."""
    control, answer = await _authenticated(target, timeout)
    found: dict[tuple[str, str], list[ShardOwner]] = {}
    try:
        if not isinstance(answer, AuthOk | Ok):
            raise TargetRefusedError(f"the target refused the kit's auth: {answer!r}")
        for request_id, (kind, name) in enumerate(names, start=(1 << 40) + 1):
            await control.send(
                ShardOwners(
                    tenant_id=str(target.variables.get("tenant_id", "")),
                    namespace=str(target.variables.get("namespace", "")),
                    name=name,
                    kind=ShardKind(kind),
                    request_id=request_id,
                )
            )
            reply = await control.next_answer()
            if isinstance(reply, ShardOwnersView):
                found[(kind, name)] = list(reply.owners)
    except (StreamClosedError, ConnectionClosedError, TimeoutError, WireError) as exc:
        raise TargetRefusedError(f"no usable answer to shard_owners: {exc!r}") from None
    finally:
        control.connection.close()
    return found


# The profile variable naming a broker with small bounds (the fixture's
# `limited_addrs`): the cases reaching a limit with a handful of frames need it.
LIMITED_BROKER = "limited_broker"

# Profile variables naming streams and caches, and what each must be on the target.
STREAM_VARIABLES = (
    "durable_stream",
    "leader_durable_stream",
    "memory_stream",
    "publisher_stream",
    "movable_stream",
    "quorum_stream",
    "flood_stream",
)
CACHE_VARIABLES = ("cache", "single_shard_cache", "quorum_cache")


@dataclass(frozen=True)
class Discovery:
    """What the kit learnt about the target's setup before the cases ran."""

    target: Target  # with variables the target turned out to lack removed
    notes: tuple[str, ...]  # one line per finding, for the reports


async def discover(
    target: Target, advertised: Advertised, timeout: float = CONNECT_TIMEOUT
) -> Discovery:
    """Check the profile's streams and caches against the target (shard counts),
    where it advertised the discovery requests, and learn the fleet from
    topology_view when the profile names no `brokers` (a view of two or more).

    A stream or cache the target reports as unknown (0 shards) is removed from
    the variables and noted in `unavailable`, so cases needing it get "setup"
    with the reason rather than a fail; a `single_shard_cache` with more than one
    shard likewise. `missing_stream` must really be missing. A `cache` with one
    shard serves as `single_shard_cache` when the profile names none. A target
    that does not answer is left as the profile describes it.
    """
    variables = dict(target.variables)
    unavailable = dict(target.unavailable)
    notes: list[str] = []
    asks: list[tuple[str, Any]] = []
    request_id = 1 << 40  # far from any id a transcript uses
    if advertised.features & int(Feature.FEATURE_STREAM_SHARDS):
        for name in (*STREAM_VARIABLES, "missing_stream"):
            if isinstance(variables.get(name), str):
                request_id += 1
                asks.append(
                    (
                        name,
                        StreamShards(
                            tenant_id=str(variables.get("tenant_id", "")),
                            namespace=str(variables.get("namespace", "")),
                            stream=variables[name],
                            request_id=request_id,
                        ),
                    )
                )
    if advertised.features & int(Feature.FEATURE_CACHE_SHARDS):
        for name in CACHE_VARIABLES:
            if isinstance(variables.get(name), str):
                request_id += 1
                asks.append(
                    (
                        name,
                        CacheShards(
                            tenant_id=str(variables.get("tenant_id", "")),
                            namespace=str(variables.get("namespace", "")),
                            cache=variables[name],
                            request_id=request_id,
                        ),
                    )
                )
    # No fleet named: a target that serves topology can tell it (two brokers or more).
    ask_fleet = "brokers" not in variables and bool(
        advertised.features & int(Feature.FEATURE_TOPOLOGY)
    )
    if not asks and not ask_fleet:
        return Discovery(target, ("discovery: the target advertised no shard discovery",))
    shards: dict[str, int] = {}
    try:
        control, answer = await _authenticated(target, timeout)
    except (TargetRefusedError, TargetUnreachableError) as exc:
        return Discovery(target, (f"discovery skipped: {exc}",))
    try:
        if isinstance(answer, AuthOk | Ok):
            for name, ask in asks:
                await control.send(ask)
                reply = await control.next_answer()
                if isinstance(reply, StreamShardsView | CacheShardsView):
                    shards[name] = reply.shards
                else:
                    notes.append(f"discovery: {name}: unexpected answer {type(reply).__name__}")
            if ask_fleet:
                await control.send(Topology())
                view = await control.next_answer()
                fleet = [b.addr for b in view.brokers] if isinstance(view, TopologyView) else []
                if len(fleet) > 1:
                    variables["brokers"] = fleet
                    notes.append(f"brokers: {len(fleet)} from topology_view ({', '.join(fleet)})")
    except (StreamClosedError, ConnectionClosedError, TimeoutError, WireError) as exc:
        notes.append(f"discovery stopped: {exc!r}")
    except TargetRefusedError as exc:
        notes.append(f"discovery stopped: {exc}")
    finally:
        control.connection.close()
    for name, count in shards.items():
        value = variables[name]
        if name == "missing_stream":
            if count:
                unavailable[name] = f"stream {value!r} exists ({count} shards)"
                del variables[name]
            else:
                notes.append(f"missing_stream = {value!r}: unknown to the target, as it must be")
            continue
        kind = "cache" if name in CACHE_VARIABLES else "stream"
        if count == 0:
            unavailable[name] = f"{kind} {value!r} does not exist on the target"
            del variables[name]
        elif name == "single_shard_cache" and count != 1:
            unavailable[name] = f"cache {value!r} has {count} shards, not 1"
            del variables[name]
        else:
            notes.append(f"{name} = {value!r}: {count} shard{'s' if count != 1 else ''}")
    if "single_shard_cache" not in variables and shards.get("cache") == 1:
        variables["single_shard_cache"] = variables["cache"]
        unavailable.pop("single_shard_cache", None)
        notes.append("single_shard_cache = cache (it has one shard)")
    for name, why in unavailable.items():
        notes.append(f"{name}: {why}")
    found = Target(
        target.host, target.port, target.ca_pem, target.server_name, variables, unavailable
    )
    return Discovery(found, tuple(notes))
