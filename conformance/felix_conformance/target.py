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
    StreamClosedError,
    TransportConfig,
    connect,
)
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.features import FEATURE_INFO
from felix_wire.flags import KNOWN_FLAGS
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth, server_capabilities
from felix_wire.messages import AuthOk, Error, Ok
from felix_wire.wire_errors import WireError

__all__ = [
    "ALL_FEATURES",
    "FIXTURE_VARIABLES",
    "Advertised",
    "Target",
    "TargetRefusedError",
    "TargetUnreachableError",
    "fixture_ca_file",
    "parse_host_port",
    "probe",
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
    "durable_stream",
    "memory_stream",
    "missing_stream",
    "cache",
    "single_shard_cache",
)
CONNECT_TIMEOUT = 10.0


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

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def transport_config(self) -> TransportConfig:
        return TransportConfig.client(self.ca_pem, server_name=self.server_name)

    async def connect(self) -> Connection:
        try:
            return await asyncio.wait_for(
                connect(self.transport_config(), self.host, self.port), CONNECT_TIMEOUT
            )
        except (ConnectionClosedError, OSError, TimeoutError) as exc:
            raise TargetUnreachableError(f"cannot connect to {self.address}: {exc}") from None


def target_from_fixture(path: Path, *, server_name: str | None = None) -> Target:
    """The target a `felix-broker fixture` document describes (its first address).

    A relative `ca_file` is relative to the fixture document's folder, as the
    broker wrote it there, not to wherever the kit happens to run.
    """
    document: dict[str, Any] = json.loads(path.read_text())
    host, port = parse_host_port(document["addrs"][0])
    variables = {name: document[name] for name in FIXTURE_VARIABLES if name in document}
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
    """Variables every run has: a tenant that is surely not the token's."""
    out = dict(variables)
    if "tenant_id" in out:
        out.setdefault("other_tenant", f"{out['tenant_id']}-conformance-other")
    return out


@dataclass(frozen=True)
class Advertised:
    """What the target answered to an auth offering everything."""

    flags: int
    features: int
    legacy: bool  # plain `ok`: an old broker that negotiates nothing


async def probe(target: Target, timeout: float = CONNECT_TIMEOUT) -> Advertised:
    connection = await target.connect()
    try:
        stream = await connection.open_bidi_stream()
        auth = client_auth(
            target.variables.get("tenant_id", ""),
            target.variables.get("token", ""),
            client_flags=KNOWN_FLAGS,
            client_features=ALL_FEATURES,
        )
        await stream.write(encode_frame(auth))
        reader = FrameReader()
        async with asyncio.timeout(timeout):
            while True:
                data = await stream.read()
                if not data:
                    raise TargetRefusedError("the target ended the stream without answering auth")
                frames = reader.feed(data)
                if frames:
                    break
        answer = decode_payload(frames[0].flags, frames[0].payload)
    except (StreamClosedError, ConnectionClosedError, TimeoutError, WireError) as exc:
        raise TargetRefusedError(f"no usable answer to auth: {exc!r}") from None
    finally:
        connection.close()
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
