"""Broker configuration: every knob, its default, and where a value may come from.

Precedence, lowest to highest (a later source overrides an earlier one, knob by
knob):

1. built-in defaults (the values of §12, listed on :class:`BrokerConfig`);
2. the YAML file given with ``--config`` (top-level keys are the knob names,
   plus the ``catalog:`` section read by :mod:`felix_broker.catalog`);
3. ``FELIX_*`` environment variables (names of §12 where it gives one;
   where a knob has an alias, e.g. ``FELIX_SUB_QUEUE_CAPACITY`` for
   ``FELIX_SUBSCRIBER_QUEUE_CAPACITY``, the canonical name wins when both are
   set); ``FELIX_*`` variables this module does not know are ignored, because
   other Felix programs (the client) read their own;
4. explicit command-line overrides (``--set key=value`` and the few dedicated
   flags of :func:`add_cli_arguments`).

Anything wrong fails at start with a :class:`ConfigError` naming the key and
the source: an unknown key in the file or on the command line, a value of the
wrong type, out of range, outside its enum, or a malformed ``host:port``.
Relative paths are resolved against the working folder the broker starts in.
"""

# The knob helpers (_int, _bool, ...) return dataclasses.field(...) carrying the
# knob's metadata; RUF009 cannot see through them, so it is off for this file.
# ruff: noqa: RUF009

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

import yaml

from felix_broker.catalog import CatalogError, StaticCatalog, default_catalog, load_catalog

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "FsyncMode",
    "HostPort",
    "InvalidConfigValueError",
    "LaneShard",
    "QuicImpl",
    "QuorumReads",
    "SubscriberQueuePolicy",
    "UnknownConfigKeyError",
    "add_cli_arguments",
    "config_from_args",
    "load_config",
    "warn_ignored_knobs",
]

_log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_DEFAULT_DATA_DIR = "felix-data"
_U32_MAX = 2**32 - 1


class ConfigError(ValueError):
    """A configuration problem; ``key`` names the knob, ``source`` where it came from."""

    def __init__(self, key: str, source: str, reason: str) -> None:
        super().__init__(f"{key}: {reason} (from {source})")
        self.key = key
        self.source = source
        self.reason = reason


class UnknownConfigKeyError(ConfigError):
    """A key the broker does not know (a typo, or a knob of another program)."""


class InvalidConfigValueError(ConfigError):
    """A known key with a value of the wrong type, out of range or not allowed."""


class SubscriberQueuePolicy(StrEnum):
    """What a full subscriber queue does with the next batch."""

    BLOCK = "block"
    DROP_NEW = "drop_new"
    DROP_OLD = "drop_old"


class LaneShard(StrEnum):
    """How subscriptions are spread over writer lanes."""

    AUTO = "auto"
    SUBSCRIBER_ID_HASH = "subscriber_id_hash"
    CONNECTION_ID_HASH = "connection_id_hash"
    ROUND_ROBIN_PIN = "round_robin_pin"


class FsyncMode(StrEnum):
    """When durable storage calls fsync."""

    NONE = "none"
    PERIODIC = "periodic"
    ON_COMMIT = "on_commit"


class QuorumReads(StrEnum):
    """What confirms a read of a Quorum cache shard (FELIX_QUORUM_READS)."""

    LEASE = "lease"
    MAJORITY = "majority"


class QuicImpl(StrEnum):
    """Which QUIC stack the transport runs on."""

    QH3 = "qh3"
    AIOQUIC = "aioquic"


class UdpOffload(StrEnum):
    """Whether the transport batches datagrams with Linux UDP GSO/GRO."""

    AUTO = "auto"
    OFF = "off"


# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class HostPort:
    """A listen address; port 0 asks the OS for a free port (useful in tests)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """Parse ``host:port`` or ``[ipv6]:port``; raise ValueError with the reason."""
        if text.startswith("["):
            host, sep, port_text = text[1:].partition("]:")
            if not sep:
                raise ValueError(f"expected '[ipv6]:port', got {text!r}")
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv6 address") from None
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep or not host:
                raise ValueError(f"expected 'host:port', got {text!r}")
            if ":" in host:
                raise ValueError(f"write an IPv6 address as '[addr]:port', got {text!r}")
            labels = host.split(".")
            if not all(_HOST_LABEL.fullmatch(label) for label in labels):
                raise ValueError(f"{host!r} is not a valid host name or IPv4 address")
            if all(label.isdigit() for label in labels):
                # All-numeric names are never DNS names, so this must be an IPv4 literal.
                try:
                    ipaddress.IPv4Address(host)
                except ValueError:
                    raise ValueError(f"{host!r} is not a valid IPv4 address") from None
        # isascii: str.isdigit also accepts non-ASCII digits, which int() would take.
        if not (port_text.isascii() and port_text.isdigit()):
            raise ValueError(f"port {port_text!r} is not a number")
        port = int(port_text)
        if port > 65535:
            raise ValueError(f"port {port} is out of range 0-65535")
        return cls(host, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class _Kind(Enum):
    INT = "an integer"
    BOOL = "true or false"
    ENUM = "one of the listed values"
    BIND = "'host:port'"
    PATH = "a path"
    OPTIONAL_PATH = "a path or nothing"
    OPTIONAL_URL = "an http(s) URL or nothing"
    TEXT = "a string"
    ENDPOINTS = "comma-separated 'host:port' list, or nothing"


@dataclass(frozen=True, slots=True)
class _Knob:
    kind: _Kind
    env: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    enum: type[StrEnum] | None = None
    doc: str = ""  # what the knob does (docs/configuration.md is generated from it)
    ignored: str | None = None  # why this broker accepts the knob but does not use it


def _meta(knob: _Knob, doc: str, ignored: str | None) -> dict[str, _Knob]:
    return {"knob": dataclasses.replace(knob, doc=doc, ignored=ignored)}


def _int(
    default: int,
    *env: str,
    doc: str,
    minimum: int = 0,
    maximum: int = _U32_MAX,
    ignored: str | None = None,
) -> Any:
    knob = _Knob(_Kind.INT, env, minimum, maximum)
    return field(default=default, metadata=_meta(knob, doc, ignored))


def _bool(default: bool, *env: str, doc: str) -> Any:
    return field(default=default, metadata=_meta(_Knob(_Kind.BOOL, env), doc, None))


def _enum(default: StrEnum, *env: str, doc: str, ignored: str | None = None) -> Any:
    knob = _Knob(_Kind.ENUM, env, enum=type(default))
    return field(default=default, metadata=_meta(knob, doc, ignored))


def _bind(default: str, *env: str, doc: str) -> Any:
    knob = _Knob(_Kind.BIND, env)
    return field(default=HostPort.parse(default), metadata=_meta(knob, doc, None))


def _path(default: str, *env: str, doc: str) -> Any:
    return field(default=Path(default), metadata=_meta(_Knob(_Kind.PATH, env), doc, None))


def _optional_path(*env: str, doc: str) -> Any:
    return field(default=None, metadata=_meta(_Knob(_Kind.OPTIONAL_PATH, env), doc, None))


def _text(default: str, *env: str, doc: str) -> Any:
    return field(default=default, metadata=_meta(_Knob(_Kind.TEXT, env), doc, None))


def _endpoints(*env: str, doc: str) -> Any:
    knob = _Knob(_Kind.ENDPOINTS, env)
    return field(default=(), metadata=_meta(knob, doc, None))


def _endpoints_value(key: str, value: object, source: str) -> tuple[HostPort, ...]:
    if isinstance(value, tuple) and all(isinstance(v, HostPort) for v in value):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise InvalidConfigValueError(key, source, f"expected 'host:port,...', got {value!r}")
    out: list[HostPort] = []
    for part in value.split(","):
        if part.strip():
            try:
                out.append(HostPort.parse(part.strip()))
            except ValueError as exc:
                raise InvalidConfigValueError(key, source, str(exc)) from None
    return tuple(out)


def _optional_url(*env: str, doc: str) -> Any:
    return field(default=None, metadata=_meta(_Knob(_Kind.OPTIONAL_URL, env), doc, None))


# Why each knob this broker accepts but does not use is ignored (warned at start when set).
_NO_LANES = (
    "each subscription has its own writer task and QUIC stream, fed from its own bounded "
    "queue (subscriber_queue_capacity); there are no shared writer lanes to size or assign"
)
_IGNORED_SEND_WINDOW = (
    "the transport bounds each stream's send backlog (1 MiB high, 256 KiB low watermark) "
    "and the client's QUIC receive window bounds what is in flight; there is no separate "
    "cache send buffer to size"
)
_IGNORED_WORKERS = (
    "every publish of a tenant is appended by that tenant's one worker, in arrival order, "
    "so a shard's order and its group commit hold; on one event loop more executors per "
    "connection would add no parallelism"
)
_IGNORED_FANOUT = (
    "a flush encodes each event batch once per delivery variant and hands the same bytes "
    "to every subscriber in one pass; there are no per-subscriber fanout operations to batch"
)


def _url_value(key: str, value: object, source: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise InvalidConfigValueError(key, source, f"expected an http(s) URL, got {value!r}")
    return value.rstrip("/")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Every knob of a standalone broker, with the defaults of §12.

    Durations are in the unit their name ends with; sizes in bytes. Each knob's
    `doc` is its entry in docs/configuration.md (generated: config_doc.py).
    """

    # Listeners and transport.
    quic_bind: HostPort = _bind(
        "0.0.0.0:5000", "FELIX_QUIC_BIND", doc="The client QUIC listener (host:port)."
    )
    metrics_bind: HostPort = _bind(
        "0.0.0.0:8080",
        "FELIX_BROKER_METRICS_BIND",
        doc="The plain-HTTP listener: /live, /ready, /metrics, /backup/offsets.",
    )
    quic_impl: QuicImpl = _enum(
        QuicImpl.QH3, "FELIX_QUIC_IMPL", doc="The QUIC stack the transport runs on."
    )
    udp_gso: UdpOffload = _enum(
        UdpOffload.AUTO,
        "FELIX_UDP_GSO",
        doc=(
            "`auto`: a transmit's datagrams to one address leave in one `sendmsg` per up to "
            "64 segments (Linux UDP GSO, kernel >= 4.18) and the listener receives with UDP "
            "GRO (several datagrams per call); where the kernel refuses either, one datagram "
            "per call, detected once. "
            "`off`: one system call per datagram."
        ),
    )
    max_idle_timeout_ms: int = _int(
        6000,
        "FELIX_MAX_IDLE_TIMEOUT_MS",
        minimum=1,
        doc="A connection with no traffic for this long is closed.",
    )
    # QUIC's floor is 1200 bytes; 65527 is the largest UDP payload over IPv4.
    max_datagram_size: int = _int(
        1200,
        "FELIX_MAX_DATAGRAM_SIZE",
        minimum=1200,
        maximum=65527,
        doc="The largest UDP payload the broker sends.",
    )
    pub_conn_recv_window: int = _int(
        16 * _MIB,
        "FELIX_BROKER_PUB_CONN_RECV_WINDOW",
        minimum=1,
        doc="QUIC receive window of a client connection (bytes the client may have unread).",
    )
    pub_stream_recv_window: int = _int(
        16 * _MIB,
        "FELIX_BROKER_PUB_STREAM_RECV_WINDOW",
        minimum=1,
        doc="QUIC receive window of one client stream (capped at the connection's).",
    )
    cache_send_window: int = _int(
        256 * _MIB,
        "FELIX_CACHE_SEND_WINDOW",
        minimum=1,
        doc="Send window for cache answers.",
        ignored=_IGNORED_SEND_WINDOW,
    )

    # TLS. Without tls_cert/tls_key a development CA and leaf are kept in data_dir.
    tls_cert: Path | None = _optional_path(
        "FELIX_TLS_CERT",
        doc="PEM certificate chain; unset, a development CA and leaf are kept in data_dir.",
    )
    tls_key: Path | None = _optional_path(
        "FELIX_TLS_KEY", doc="PEM private key of tls_cert (given together with it)."
    )
    tls_ca: Path | None = _optional_path(
        "FELIX_TLS_CA", doc="The CA certificate of tls_cert, offered to clients to trust."
    )
    tls_cert_export: Path | None = _optional_path(
        "FELIX_TLS_CERT_EXPORT", doc="Where to copy the CA certificate clients should trust."
    )
    tls_require_alpn: bool = _bool(
        False, "FELIX_TLS_REQUIRE_ALPN", doc="Refuse clients that offer no ALPN protocol."
    )

    # Connections and authentication.
    preauth_max_frame_bytes: int = _int(
        65536,
        "FELIX_PREAUTH_MAX_FRAME_BYTES",
        minimum=1,
        doc="The largest frame a stream may send before it authenticates.",
    )
    preauth_max_streams_per_conn: int = _int(
        16,
        "FELIX_PREAUTH_MAX_STREAMS_PER_CONN",
        minimum=1,
        doc="Unauthenticated streams read at once per connection (more wait).",
    )
    auth_timeout_ms: int = _int(
        10000,
        "FELIX_AUTH_TIMEOUT_MS",
        doc="A connection that authenticates no stream in this time is closed, and every "
        "stream that has not authenticated this long after opening is abandoned (0: never).",
    )
    preauth_conn_recv_budget: int = _int(
        256 * 1024,
        "FELIX_PREAUTH_CONN_RECV_BUDGET",
        minimum=4096,
        doc="Bytes a connection's streams may hold unread until its first stream "
        "authenticates (each stream gets preauth_max_frame_bytes plus a header of credit).",
    )
    preauth_recv_budget: int = _int(
        16 * _MIB,
        "FELIX_PREAUTH_RECV_BUDGET",
        minimum=4096,
        doc="Bytes all connections not authenticated yet may hold unread together; at the "
        "bound their input pauses.",
    )
    max_client_connections: int = _int(
        8192,
        "FELIX_MAX_CLIENT_CONNECTIONS",
        minimum=1,
        doc="Client connections at once; more are refused in the handshake.",
    )
    max_frame_bytes: int = _int(
        16 * _MIB,
        "FELIX_MAX_FRAME_BYTES",
        minimum=1,
        doc="The largest frame an authenticated stream may send.",
    )
    max_inflight_requests_per_conn: int = _int(
        1024,
        "FELIX_MAX_INFLIGHT_REQUESTS_PER_CONN",
        minimum=1,
        doc="Requests running as their own tasks (cache and group requests) per connection; "
        "at the bound the stream carrying the next one is not read until one finishes, so "
        "QUIC flow control holds the client back.",
    )
    jwks_path: Path | None = _optional_path(
        "FELIX_JWKS_PATH",
        doc="A JWKS JSON file to verify tokens with; unset, the development issuer's keys.",
    )

    # Publishing.
    ack_on_commit: bool = _bool(
        False,
        "FELIX_ACK_ON_COMMIT",
        doc="Answer every acked publish after the write (with its offset), not once queued.",
    )
    record_publishers: bool = _bool(
        False, "FELIX_RECORD_PUBLISHERS", doc="Store each batch's publisher in durable logs."
    )
    publish_window: int = _int(
        256,
        "FELIX_BROKER_PUBLISH_WINDOW",
        doc="Acked publishes unanswered per stream; at the window the stream is not read "
        "(0: no pipelining, the pipeline features are not advertised).",
    )
    pub_conn_inflight_bytes: int = _int(
        16 * _MIB,
        "FELIX_BROKER_PUBLISH_CONN_INFLIGHT_BYTES",
        minimum=1,
        maximum=2**63 - 1,
        doc="Publish bytes read and not yet appended, per connection and identity; more "
        "waits (the stream is not read).",
    )
    pub_conn_total_inflight_bytes: int = _int(
        0,
        "FELIX_BROKER_PUBLISH_CONN_TOTAL_INFLIGHT_BYTES",
        maximum=2**63 - 1,
        doc="The same per connection across identities (0: 4 x pub_conn_inflight_bytes, "
        "at most pub_inflight_bytes).",
    )
    pub_inflight_bytes: int = _int(
        64 * _MIB,
        "FELIX_BROKER_PUBLISH_INFLIGHT_BYTES",
        minimum=1,
        maximum=2**63 - 1,
        doc="The same for the whole broker.",
    )
    pub_queue_depth: int = _int(
        64,
        "FELIX_BROKER_PUB_QUEUE_DEPTH",
        minimum=1,
        doc="Publish batches queued per tenant for its worker.",
    )
    pub_workers_per_conn: int = _int(
        4,
        "FELIX_BROKER_PUB_WORKERS_PER_CONN",
        minimum=1,
        doc="Publish executors per connection.",
        ignored=_IGNORED_WORKERS,
    )
    publish_queue_wait_timeout_ms: int = _int(
        2000,
        "FELIX_PUBLISH_QUEUE_WAIT_MS",
        doc="How long an acked publish waits for room in a full tenant queue before it is "
        "refused overloaded.",
    )
    ack_wait_timeout_ms: int = _int(
        2000,
        "FELIX_ACK_WAIT_TIMEOUT_MS",
        minimum=1,
        doc="How long a closing stream waits for its pending publish answers to go out.",
    )
    pub_ingress_wait: bool = _bool(
        False,
        "FELIX_PUB_INGRESS_WAIT",
        doc="Unacked publishes wait for queue room like acked ones instead of being shed.",
    )

    # Subscriptions and delivery.
    subscriber_queue_capacity: int = _int(
        512,
        "FELIX_SUBSCRIBER_QUEUE_CAPACITY",
        "FELIX_SUB_QUEUE_CAPACITY",
        minimum=1,
        doc="Event batches queued per subscriber (a client's queue_capacity is clamped).",
    )
    subscriber_queue_capacity_max: int = _int(
        4096,
        "FELIX_SUBSCRIBER_QUEUE_CAPACITY_MAX",
        minimum=1,
        doc="The most a subscribe's queue_capacity may ask for.",
    )
    subscriber_queue_policy: SubscriberQueuePolicy = _enum(
        SubscriberQueuePolicy.DROP_NEW,
        "FELIX_SUB_QUEUE_POLICY",
        doc="A full subscriber queue drops the new batch (drop_new), the oldest (drop_old), "
        "or makes the tenant's worker wait for room (block, loses nothing).",
    )
    subscriber_queue_max_bytes: int = _int(
        8 * _MIB,
        "FELIX_SUBSCRIBER_QUEUE_MAX_BYTES",
        minimum=1,
        maximum=2**63 - 1,
        doc="Encoded bytes one subscriber's queue may hold (an empty queue still takes one "
        "batch); at the bound the queue policy applies.",
    )
    subscriber_queued_bytes_max: int = _int(
        256 * _MIB,
        "FELIX_SUBSCRIBER_QUEUED_BYTES_MAX",
        minimum=1,
        maximum=2**63 - 1,
        doc="Encoded bytes all subscriber queues of the broker may hold together; at the "
        "bound each subscriber's queue policy applies.",
    )
    subscriber_writer_lanes: int = _int(
        4,
        "FELIX_SUB_WRITER_LANES",
        minimum=1,
        doc="Outbound writer lanes.",
        ignored=_NO_LANES,
    )
    subscriber_lane_queue_depth: int = _int(
        64,
        "FELIX_SUB_LANE_QUEUE_DEPTH",
        minimum=1,
        doc="Per-lane queue depth.",
        ignored=_NO_LANES,
    )
    max_subscriber_writer_lanes: int = _int(
        8,
        "FELIX_MAX_SUB_WRITER_LANES",
        minimum=1,
        doc="Safety clamp on subscriber_writer_lanes.",
        ignored=_NO_LANES,
    )
    subscriber_lane_shard: LaneShard = _enum(
        LaneShard.AUTO,
        "FELIX_SUB_LANE_SHARD",
        doc="How subscriptions are spread over writer lanes.",
        ignored=_NO_LANES,
    )
    event_batch_max_events: int = _int(
        64, "FELIX_EVENT_BATCH_MAX_EVENTS", minimum=1, doc="Events per delivered event batch."
    )
    event_batch_max_bytes: int = _int(
        65536,
        "FELIX_EVENT_BATCH_MAX_BYTES",
        minimum=1,
        doc="Payload bytes per delivered event batch (one bigger event still goes alone).",
    )
    event_batch_max_delay_us: int = _int(
        250,
        "FELIX_EVENT_BATCH_MAX_DELAY_US",
        doc="Under load, a worker pass stops taking more queued publishes once this long "
        "has gone by since its first append, so no record waits longer (plus one append) "
        "to be batched; 0 flushes every publish batch on its own.",
    )
    fanout_batch_size: int = _int(
        64,
        "FELIX_FANOUT_BATCH",
        minimum=1,
        doc="Fanout operations batched together.",
        ignored=_IGNORED_FANOUT,
    )
    max_subscriptions_per_conn: int = _int(
        4096,
        "FELIX_MAX_SUBSCRIPTIONS_PER_CONN",
        minimum=1,
        doc="Subscriptions per connection and identity.",
    )
    max_subscriptions_per_conn_total: int = _int(
        16384,
        "FELIX_MAX_SUBSCRIPTIONS_PER_CONN_TOTAL",
        minimum=1,
        doc="Subscriptions per connection across identities.",
    )

    # Durable storage: on by default in <data_dir>/durable; set FELIX_DURABLE_STORAGE_DIR
    # to an empty value to run in memory only (no durable streams, groups or counters).
    durable_storage_dir: Path | None = _optional_path(
        "FELIX_DURABLE_STORAGE_DIR",
        doc="Where durable logs live (default <data_dir>/durable); an empty value runs in "
        "memory only: no durable streams, consumer groups, counters or watches.",
    )
    durable_fsync_mode: FsyncMode = _enum(
        FsyncMode.PERIODIC,
        "FELIX_DURABLE_FSYNC_MODE",
        doc="When logs are fsynced: never (none), on a timer (periodic), or before a write "
        "is acknowledged or delivered (on_commit).",
    )
    durable_max_records_per_read: int = _int(
        10000,
        "FELIX_DURABLE_MAX_RECORDS_PER_READ",
        minimum=1,
        doc="The most records one stream_read page returns.",
    )
    durable_retention_max_age_ms: int = _int(
        0,
        "FELIX_DURABLE_RETENTION_MAX_AGE_MS",
        maximum=2**63 - 1,
        doc="Default retention by age for durable streams that set none (0: unbounded); "
        "whole sealed segments go, oldest first.",
    )
    durable_retention_max_bytes: int = _int(
        0,
        "FELIX_DURABLE_RETENTION_MAX_BYTES",
        maximum=2**63 - 1,
        doc="Default retention by size for durable streams that set none (0: unbounded).",
    )

    # Consumer groups.
    group_visibility_timeout_ms: int = _int(
        30000,
        "FELIX_GROUP_VISIBILITY_TIMEOUT_MS",
        minimum=1,
        doc="How long a polled record stays claimed before it is owed again.",
    )
    group_max_attempts: int = _int(
        5,
        "FELIX_GROUP_MAX_ATTEMPTS",
        minimum=1,
        doc="Deliveries of a record before it becomes a dead letter.",
    )
    group_max_wait_ms: int = _int(
        30000, "FELIX_GROUP_MAX_WAIT_MS", doc="The longest a group poll waits for records."
    )
    group_max_in_flight: int = _int(
        10000,
        "FELIX_GROUP_MAX_IN_FLIGHT",
        minimum=1,
        doc="Claimed, unsettled records per group.",
    )
    group_max_visibility_ms: int = _int(
        43_200_000,
        "FELIX_GROUP_MAX_VISIBILITY_MS",
        minimum=1,
        doc="The longest visibility a poll or extend may ask for (never below "
        "group_visibility_timeout_ms).",
    )

    # Process.
    data_dir: Path = _path(
        _DEFAULT_DATA_DIR,
        "FELIX_DATA_DIR",
        doc="Folder for keys, certificates and state (relative to the working folder).",
    )
    drain_timeout_ms: int = _int(
        10000,
        "FELIX_DRAIN_TIMEOUT_MS",
        doc="How long a draining broker waits for in-flight work before closing.",
    )

    # Control plane: with a URL, the catalog and the tenants' token keys come from it
    # (the config-file catalog and the development issuer are then not used).
    controlplane_url: str | None = _optional_url(
        "FELIX_CONTROLPLANE_URL",
        doc="Take the catalog and the tenants' token keys from this control plane.",
    )
    controlplane_sync_token_file: Path | None = _optional_path(
        "FELIX_CONTROLPLANE_SYNC_TOKEN_FILE",
        doc="A file holding the control plane's sync token (or set "
        "FELIX_CONTROLPLANE_SYNC_TOKEN to the token itself).",
    )
    controlplane_ca: Path | None = _optional_path(
        "FELIX_CONTROLPLANE_CA", doc="The CA certificate to trust for the control plane."
    )

    # Features a broker can be told not to offer (a fleet member that has not enabled
    # them yet; the client fixture's no-commit broker).
    test_faults_file: Path | None = _optional_path(
        "FELIX_TEST_FAULTS",
        doc="Test mode only: a fault file (JSON: fsync_delay_ms, fsync_fail, peer_blocked, "
        "peer_blocked_out, peer_blocked_in, clock_offset_ms) every fsync, peer message and "
        "wall-clock read consults, so a chaos run or the client fixture can slow or fail the "
        "disk, cut replication with named members, lose peer messages one way or both ways, "
        "or jump the broker's clock; unset (the default), fsync is plain, peers uncut and the "
        "clock the host's.",
    )
    test_quorum_ack_before_majority: bool = _bool(
        False,
        "FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY",
        doc="Test mode only (needs FELIX_TEST_FAULTS): a deliberately broken broker whose "
        "Quorum shards count only the leader's own disk toward the quorum mark, so a write "
        "is acknowledged before a majority holds it; the chaos tests show the history "
        "checker catching it.",
    )
    withhold_atomic_commit: bool = _bool(
        False,
        "FELIX_WITHHOLD_ATOMIC_COMMIT",
        doc="Do not advertise FEATURE_ATOMIC_COMMIT: commit and state_get are then answered "
        "as not served (unsupported), and counted in felix_request_not_served.",
    )

    # The fleet. A broker joins one only with both node_id and etcd_endpoints (otherwise
    # it is standalone and imports nothing of etcd). A member also needs its peer
    # listener (peer_bind) and its peer certificate (peer_tls_*), whose one DNS name is
    # its node id: node_id must be that name, or the broker refuses to start. The
    # addresses it registers are client_advertise_addr and peer_advertise_addr (or the
    # bound ones). A peer certificate without node_id makes a fleet member whose routes
    # are set in-process (tests); the node id is then the certificate's.
    node_id: str = _text(
        "",
        "FELIX_NODE_ID",
        doc="This broker's node id in a fleet, the one its peer certificate names (else it "
        "refuses to start); empty: a standalone broker (no etcd).",
    )
    etcd_endpoints: tuple[HostPort, ...] = _endpoints(
        "FELIX_ETCD_ENDPOINTS",
        doc="The fleet's etcd cluster, as comma-separated host:port (with node_id).",
    )
    etcd_prefix: str = _text(
        "/felix",
        "FELIX_ETCD_PREFIX",
        doc="The etcd key prefix under which the fleet keeps members and assignments.",
    )
    node_lease_ttl_ms: int = _int(
        10000,
        "FELIX_NODE_LEASE_TTL_MS",
        minimum=1000,
        maximum=600_000,
        doc="TTL of this broker's etcd lease; keepalive every third of it. The broker "
        "stops serving what it leads once no keepalive succeeded for three quarters of it.",
    )
    shard_move_hold_ms: int = _int(
        2000,
        "FELIX_SHARD_MOVE_HOLD_MS",
        minimum=0,
        maximum=600_000,
        doc="How long a write (publish, cache or counter op) for a shard in a move waits "
        "for the move's cut-over before it is refused shard_unavailable/moving with "
        "retry_after_ms (nothing written).",
    )
    shard_move_hold_max: int = _int(
        1024,
        "FELIX_SHARD_MOVE_HOLD_MAX",
        minimum=0,
        maximum=1_000_000,
        doc="How many writes this broker holds at once for shards in a move; one more is "
        "refused shard_unavailable/moving at once.",
    )
    shard_move_catchup_bytes: int = _int(
        1 << 20,
        "FELIX_SHARD_MOVE_CATCHUP_BYTES",
        minimum=0,
        maximum=1 << 40,
        doc="A moving shard is first copied to its successor while its old leader still "
        "takes writes, in passes that each send what was appended since the previous one; "
        "a pass that sent at most this many bytes is the last, then writes are held (the "
        "fence) and only the remaining delta is sent.",
    )
    shard_move_catchup_passes: int = _int(
        8,
        "FELIX_SHARD_MOVE_CATCHUP_PASSES",
        minimum=0,
        maximum=1000,
        doc="At most this many catch-up passes before the fence, even if writes outpace "
        "them (the hold then covers a larger last delta); 0 fences at once and copies the "
        "whole shard under the fence.",
    )
    shutdown_handoff_timeout_ms: int = _int(
        30000,
        "FELIX_SHUTDOWN_HANDOFF_TIMEOUT_MS",
        minimum=0,
        maximum=3_600_000,
        doc="A fleet member told to stop (SIGTERM) first asks the control plane to drain it "
        "and keeps serving until it leads nothing, for at most this long; whatever it still "
        "leads then fails over. 0 stops at once.",
    )
    publish_quorum_timeout_ms: int = _int(
        5000,
        "FELIX_PUBLISH_QUORUM_TIMEOUT_MS",
        minimum=1,
        maximum=600_000,
        doc="How long a publish to a Quorum stream waits for a majority of its replica set "
        "to hold it durably; past it the publish is answered quorum_timeout (outcome "
        "unknown: the batch may still commit).",
    )
    quorum_reads: QuorumReads = _enum(
        QuorumReads.LEASE,
        "FELIX_QUORUM_READS",
        doc="What confirms a get or counter_get of a replicated Quorum cache on its leader: "
        "the leader's etcd lease (lease), or a round to the replica set in which a majority, "
        "the leader included, confirms it still holds its generation (majority; a failed "
        "round answers leadership_lost). majority takes effect only once the fleet "
        "finalized the lease_free_reads feature: until then, and on Leader or unreplicated "
        "caches, every read uses the lease and this knob has no effect. Watches and stream "
        "readers always use the lease.",
    )
    client_advertise_addr: str = _text(
        "",
        "FELIX_CLIENT_ADVERTISE_ADDR",
        doc="host:port clients reach this broker at, as registered in the fleet; empty: "
        "the QUIC listener's address when it is bound to a specific host, else none.",
    )
    peer_advertise_addr: str = _text(
        "",
        "FELIX_PEER_ADVERTISE_ADDR",
        doc="host:port other brokers reach this broker's peer listener at, as registered "
        "in the fleet; empty: peer_bind's address (a wildcard peer_bind needs this set).",
    )
    ops_advertise_addr: str = _text(
        "",
        "FELIX_OPS_ADVERTISE_ADDR",
        doc="host:port the ops listener (metrics_bind: /backup/offsets) is reached at, as "
        "registered in the fleet for felix-controlplane admin backup-point; empty: "
        "metrics_bind's address when it is bound to a specific host, else none.",
    )
    fleet_features_override: str = _text(
        "",
        "FELIX_TEST_FLEET_FEATURES",
        doc="Test knob: comma-separated fleet features this broker reports in place of "
        "the ones it implements (to build a mixed fleet); empty: what it implements. "
        "It changes only what is reported, not what the broker can do.",
    )
    peer_bind: HostPort = _bind(
        "0.0.0.0:5100",
        "FELIX_PEER_BIND",
        doc="The peer listener of a fleet member (host:port), ALPN felix-peer/1.",
    )
    peer_tls_cert: Path | None = _optional_path(
        "FELIX_PEER_TLS_CERT",
        doc="PEM peer certificate, signed by the fleet CA, naming this broker's node id as "
        "its one DNS name; set, the broker is a fleet member.",
    )
    peer_tls_key: Path | None = _optional_path(
        "FELIX_PEER_TLS_KEY", doc="PEM private key of peer_tls_cert."
    )
    peer_tls_ca: Path | None = _optional_path(
        "FELIX_PEER_TLS_CA", doc="The fleet CA: every peer's certificate must be signed by it."
    )

    catalog: StaticCatalog = field(default_factory=default_catalog)

    @property
    def durable_enabled(self) -> bool:
        """Whether durable storage (and so groups and counters) is available."""
        return self.durable_storage_dir is not None

    @property
    def effective_pub_conn_total_inflight_bytes(self) -> int:
        """The per-connection budget across identities (0 in config means derived)."""
        if self.pub_conn_total_inflight_bytes:
            return self.pub_conn_total_inflight_bytes
        return min(4 * self.pub_conn_inflight_bytes, self.pub_inflight_bytes)

    @property
    def effective_group_max_visibility_ms(self) -> int:
        """The visibility cap, never below the visibility timeout (§12)."""
        return max(self.group_max_visibility_ms, self.group_visibility_timeout_ms)

    def ignored_knobs(self) -> dict[str, str]:
        """Knobs set to something other than their default that this broker ignores,
        with the reason."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            knob = f.metadata.get("knob")
            ignored = knob.ignored if knob is not None else None
            if ignored is not None and getattr(self, f.name) != f.default:
                out[f.name] = ignored
        return out


def warn_ignored_knobs(config: BrokerConfig) -> None:
    """Warn once (at start) for every ignored knob the operator set."""
    for key, why in config.ignored_knobs().items():
        _log.warning("%s is set, but this broker ignores it: %s", key, why)


_KNOBS: dict[str, _Knob] = {
    f.name: f.metadata["knob"] for f in dataclasses.fields(BrokerConfig) if "knob" in f.metadata
}
_CATALOG_KEY = "catalog"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _check_int(key: str, knob: _Knob, value: int, source: str) -> int:
    lo, hi = knob.minimum, knob.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise InvalidConfigValueError(key, source, f"must be between {lo} and {hi}, got {value}")
    return value


def _enum_value(key: str, knob: _Knob, value: object, source: str) -> StrEnum:
    assert knob.enum is not None
    for member in knob.enum:
        if value == member.value:
            return member
    allowed = ", ".join(m.value for m in knob.enum)
    raise InvalidConfigValueError(key, source, f"expected one of {allowed}, got {value!r}")


def _bind_value(key: str, value: object, source: str) -> HostPort:
    if not isinstance(value, str):
        raise InvalidConfigValueError(key, source, f"expected 'host:port', got {value!r}")
    try:
        return HostPort.parse(value)
    except ValueError as exc:
        raise InvalidConfigValueError(key, source, str(exc)) from None


def _typed(key: str, knob: _Knob, value: object, source: str) -> object:
    """Validate a value that already has a type (from YAML or a programmatic override)."""
    kind = knob.kind
    if kind is _Kind.OPTIONAL_URL:
        return _url_value(key, value, source)
    if kind is _Kind.ENDPOINTS:
        return _endpoints_value(key, value, source)
    if kind is _Kind.TEXT:
        if not isinstance(value, str):
            raise InvalidConfigValueError(key, source, f"expected a string, got {value!r}")
        return value.strip()
    if kind is _Kind.INT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidConfigValueError(key, source, f"expected an integer, got {value!r}")
        return _check_int(key, knob, value, source)
    if kind is _Kind.BOOL:
        if not isinstance(value, bool):
            raise InvalidConfigValueError(key, source, f"expected true or false, got {value!r}")
        return value
    if kind is _Kind.ENUM:
        return _enum_value(key, knob, value, source)
    if kind is _Kind.BIND:
        if isinstance(value, HostPort):
            return value
        return _bind_value(key, value, source)
    if value is None and kind is _Kind.OPTIONAL_PATH:
        return None
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value:
        raise InvalidConfigValueError(key, source, f"expected {kind.value}, got {value!r}")
    return Path(value)


def _from_text(key: str, knob: _Knob, text: str, source: str) -> object:
    """Parse a value given as text (an environment variable or a ``--set``)."""
    kind = knob.kind
    stripped = text.strip()
    if kind is _Kind.TEXT:
        return stripped
    if kind is _Kind.ENDPOINTS:
        return _endpoints_value(key, stripped, source)
    if kind is _Kind.INT:
        try:
            number = int(stripped, 10)
        except ValueError:
            raise InvalidConfigValueError(
                key, source, f"expected an integer, got {text!r}"
            ) from None
        return _check_int(key, knob, number, source)
    if kind is _Kind.BOOL:
        lowered = stripped.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise InvalidConfigValueError(key, source, f"expected true or false, got {text!r}")
    if kind is _Kind.ENUM:
        return _enum_value(key, knob, stripped, source)
    if kind is _Kind.BIND:
        return _bind_value(key, stripped, source)
    if kind is _Kind.OPTIONAL_URL:
        return _url_value(key, stripped, source)
    if not stripped:
        if kind is _Kind.OPTIONAL_PATH:
            return None
        raise InvalidConfigValueError(key, source, "expected a path, got an empty value")
    return Path(stripped)


def _read_yaml(path: Path) -> Mapping[str, object]:
    source = f"config file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--config", source, f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("--config", source, f"not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("--config", source, "the top level must be a mapping of knob names")
    return data


def _knob_for(key: object, source: str) -> _Knob:
    knob = _KNOBS.get(key) if isinstance(key, str) else None
    if knob is None:
        raise UnknownConfigKeyError(str(key), source, "unknown configuration key")
    return knob


def load_config(
    config_file: Path | str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    cwd: Path | None = None,
) -> BrokerConfig:
    """Build the configuration from defaults, file, environment and overrides.

    ``environ`` defaults to ``os.environ``; ``overrides`` are the command-line
    values (text is parsed like an environment variable, typed values are
    checked like YAML); ``cwd`` (default: the process's) resolves relative
    paths. Raises :class:`ConfigError` naming the key and source.
    """
    base = Path.cwd() if cwd is None else cwd
    # Any: each value was checked against its knob; the dataclass takes them by name.
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    catalog_section: object = None

    if config_file is not None:
        path = Path(config_file)
        source = f"config file {path}"
        for key, value in _read_yaml(path).items():
            if key == _CATALOG_KEY:
                catalog_section = value
                continue
            knob = _knob_for(key, source)
            values[str(key)] = _typed(str(key), knob, value, source)
            sources[str(key)] = source

    env = os.environ if environ is None else environ
    for key, knob in _KNOBS.items():
        for name in knob.env:  # canonical name first, so it beats its alias
            if name in env:
                source = f"environment variable {name}"
                values[key] = _from_text(key, knob, env[name], source)
                sources[key] = source
                break

    for key, value in (overrides or {}).items():
        source = "command line"
        knob = _knob_for(key, source)
        if isinstance(value, str):
            values[key] = _from_text(key, knob, value, source)
        else:
            values[key] = _typed(key, knob, value, source)
        sources[key] = source

    for key, value in values.items():
        if isinstance(value, Path) and not value.is_absolute():
            values[key] = base / value
    values.setdefault("data_dir", base / _DEFAULT_DATA_DIR)
    # Durable storage is on unless a source set the directory (an empty value is None,
    # which turns it off).
    values.setdefault("durable_storage_dir", values["data_dir"] / "durable")

    try:
        catalog = load_catalog(catalog_section)
    except CatalogError as exc:
        source = f"config file {config_file}"
        raise InvalidConfigValueError(exc.path, source, exc.reason) from exc

    config = BrokerConfig(catalog=catalog, **values)
    _cross_check(config, sources, f"config file {config_file}")
    return config


def _cross_check(config: BrokerConfig, sources: Mapping[str, str], file_source: str) -> None:
    """Checks that involve more than one knob, so no single value is wrong on its own."""

    def fail(key: str, reason: str) -> None:
        raise InvalidConfigValueError(key, sources.get(key, "defaults"), reason)

    if (config.tls_cert is None) != (config.tls_key is None):
        fail(
            "tls_key" if config.tls_key is None else "tls_cert",
            "tls_cert and tls_key must be given together",
        )
    if config.tls_ca is not None and config.tls_cert is None:
        fail("tls_ca", "tls_ca describes a configured tls_cert; none is configured")
    peer = {"peer_tls_cert": config.peer_tls_cert, "peer_tls_key": config.peer_tls_key}
    peer["peer_tls_ca"] = config.peer_tls_ca
    if any(v is not None for v in peer.values()) and any(v is None for v in peer.values()):
        missing = next(k for k, v in peer.items() if v is None)
        fail(missing, "peer_tls_cert, peer_tls_key and peer_tls_ca must be given together")
    if config.subscriber_queue_capacity > config.subscriber_queue_capacity_max:
        fail(
            "subscriber_queue_capacity",
            f"{config.subscriber_queue_capacity} exceeds subscriber_queue_capacity_max "
            f"{config.subscriber_queue_capacity_max}",
        )
    if config.test_quorum_ack_before_majority and config.test_faults_file is None:
        fail(
            "test_quorum_ack_before_majority",
            "a deliberately broken broker is for test mode only: it needs test_faults_file",
        )
    if config.preauth_max_frame_bytes > config.max_frame_bytes:
        fail(
            "preauth_max_frame_bytes",
            f"{config.preauth_max_frame_bytes} exceeds max_frame_bytes {config.max_frame_bytes}",
        )
    if bool(config.node_id) != bool(config.etcd_endpoints):
        fail(
            "etcd_endpoints" if config.node_id else "node_id",
            "node_id and etcd_endpoints go together (a fleet member needs both)",
        )
    if not config.etcd_prefix.startswith("/") or config.etcd_prefix.endswith("/"):
        fail("etcd_prefix", f"must start with '/' and not end with it, got {config.etcd_prefix!r}")
    if config.durable_storage_dir is None:
        for spec in config.catalog.streams():
            if spec.durable:
                raise InvalidConfigValueError(
                    f"catalog.tenants.{spec.tenant_id}.namespaces.{spec.namespace}"
                    f".streams.{spec.name}.durable",
                    file_source,
                    "a durable stream needs durable_storage_dir (FELIX_DURABLE_STORAGE_DIR)",
                )


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config``, ``--set key=value`` and shortcuts for the common knobs."""
    parser.add_argument("--config", type=Path, help="YAML configuration file")
    parser.add_argument(
        "--set",
        dest="config_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one configuration knob (highest precedence; repeatable)",
    )
    parser.add_argument("--quic-bind", help="client QUIC listener, host:port")
    parser.add_argument("--metrics-bind", help="HTTP metrics/health listener, host:port")
    parser.add_argument("--data-dir", help="folder for keys, certificates and state")


def config_from_args(
    args: argparse.Namespace,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> BrokerConfig:
    """Load the configuration for arguments from a parser set up by :func:`add_cli_arguments`."""
    overrides: dict[str, object] = {}
    items: Sequence[str] = args.config_set
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(item, "command line", "expected --set KEY=VALUE")
        overrides[key.strip()] = value
    for key in ("quic_bind", "metrics_bind", "data_dir"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    return load_config(args.config, environ=environ, overrides=overrides, cwd=cwd)
