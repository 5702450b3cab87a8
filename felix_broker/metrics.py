"""The broker's Prometheus metrics, owned per broker instance.

Every :class:`BrokerMetrics` has its own ``CollectorRegistry`` rather than the
process-global one, so several brokers can run in one process (tests do) and
each ``/metrics`` shows only its own broker.

Names follow one scheme, ``felix_<area>_<what>[_<unit>]``, where the area is
the capability that counts (``connections``, ``auth``, ``request``,
``stream``, ``storage``, ``group``, ``cache``, ``fleet``, ``task`` for the
broker's own tasks), ``tenant`` for the series
labelled by tenant, and ``build`` for :data:`felix_build_info`. Counters end in
``_total`` (added by the client library), durations are histograms in seconds
(``_seconds``) with :data:`LATENCY_BUCKETS`, from 25 µs to 10 s. The names the
protocol documents stay as they are (``felix_tenant_publish_queue_full_total``);
the cache's own counters (``felix_cache_evictions_total``, ...) live beside the
cache service and follow the same scheme.

Label sets are kept small and bounded: ``tenant`` appears only where the
protocol names it, ``reason`` only takes the fixed names of token checks or of
``publish_refused`` reasons,
``type`` only the message types the broker dispatches, ``outcome`` ``ok`` or an
error code. Hot paths take a label child once (:meth:`BrokerMetrics.request_timer`)
instead of looking labels up per call.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "BrokerMetrics", "build_version"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Upper bounds in seconds: a loopback request is tens of µs, an fsync on a busy
# disk or a long poll reaches seconds.
LATENCY_BUCKETS = (
    25e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    5.0,
    10.0,
)

_DISTRIBUTION = "felix-suite"


def build_version() -> str:
    """The installed version of this broker ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


class BrokerMetrics:
    """One broker's metric objects, registered in its own registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        quic_impl: str = "",
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        self._fsync = fsync  # os.fsync, or a test-mode fault file's (felix_broker.chaos.faults)
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        r = self.registry
        self.build_info = Info(
            "felix_build", "The broker's version and runtime (the value is always 1).", registry=r
        )
        self.build_info.info(
            {
                "version": build_version(),
                "python": platform.python_version(),
                "implementation": platform.python_implementation(),
                "quic_impl": quic_impl,
            }
        )
        # -- connections and auth ---------------------------------------------------
        self.connections = Gauge(
            "felix_connections_open", "Client connections currently open.", registry=r
        )
        self.connections_accepted = Counter(
            "felix_connections_accepted", "Client connections accepted.", registry=r
        )
        self.auth_failures = Counter(
            "felix_auth_failures",
            "Refused auth attempts, by the check that failed.",
            ["reason"],
            registry=r,
        )
        # -- requests -----------------------------------------------------------------
        self.request_seconds = Histogram(
            "felix_request_seconds",
            "Time from a request's frame being decoded to its answer being queued for "
            "sending, by message type.",
            ["type"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._request_children: dict[str, Histogram] = {}
        # -- streams ------------------------------------------------------------------
        self.publishes = Counter(
            "felix_stream_published_records", "Records accepted for publishing.", registry=r
        )
        self.published_bytes = Counter(
            "felix_stream_published_bytes", "Payload bytes accepted for publishing.", registry=r
        )
        self.json_publishes = Counter(
            "felix_stream_json_publishes",
            "Publishes received on the JSON compatibility path, by message type.",
            ["frame"],
            registry=r,
        )
        self.publish_ack_seconds = Histogram(
            "felix_stream_publish_ack_seconds",
            "Time from an acknowledged publish being received to its answer being queued "
            "(after the write or the fsync where the ack waits for it).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tenant_publish_queue_full = Counter(
            "felix_tenant_publish_queue_full",
            "Publishes refused because the tenant's publish queue had no room.",
            ["tenant"],
            registry=r,
        )
        self.deliveries = Counter(
            "felix_stream_delivered_records",
            "Records handed to subscribers' event streams.",
            registry=r,
        )
        self.subscriber_queue_depth = Gauge(
            "felix_stream_subscriber_queue_batches",
            "Batches waiting in subscriber queues, summed over subscribers.",
            registry=r,
        )
        self.subscriber_drops = Counter(
            "felix_stream_subscriber_dropped_records",
            "Records dropped because a subscriber queue was full.",
            registry=r,
        )
        # -- storage ------------------------------------------------------------------
        self.fsync_seconds = Histogram(
            "felix_storage_fsync_seconds",
            "Duration of each fsync of a durable log file.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # -- consumer groups ----------------------------------------------------------
        self.group_requests = Counter(
            "felix_group_requests",
            "Consumer-group requests answered, by type and outcome (ok or the error code).",
            ["type", "outcome"],
            registry=r,
        )
        self.group_records = Counter(
            "felix_group_records_claimed",
            "Records handed out by group polls (redeliveries included).",
            registry=r,
        )
        self.group_poll_ack_seconds = Histogram(
            "felix_group_poll_ack_seconds",
            "Time from a record being handed out by a group poll to its ack being durable.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # -- auth, streams, storage and requests (issue 20) ---------------------------
        self.auth_timeouts = Counter(
            "felix_auth_timeouts",
            "Streams abandoned because they did not authenticate within auth_timeout_ms.",
            registry=r,
        )
        self.subscriber_queued_bytes = Gauge(
            "felix_stream_subscriber_queued_bytes",
            "Encoded event bytes queued for all subscribers (bounded by "
            "subscriber_queued_bytes_max).",
            registry=r,
        )
        self.fleet_feature_enabled = Gauge(
            "felix_fleet_feature_enabled",
            "1 for each fleet feature this fleet member acts on (finalized and implemented).",
            ["feature"],
            registry=r,
        )
        self.failed_logs = Gauge(
            "felix_storage_failed_logs",
            "Logs (streams, caches, groups) in the failed state after an I/O error; "
            "they take no writes until the broker restarts.",
            registry=r,
        )
        self.token_expiries = Counter(
            "felix_auth_token_expiries",
            "Streams whose token expired (plus the leeway) while they were open.",
            registry=r,
        )
        self.internal_errors = Counter(
            "felix_request_internal_errors",
            "Requests answered `internal` after an unexpected exception, by request type.",
            ["type"],
            registry=r,
        )

        # -- broker tasks -------------------------------------------------------------
        self.publish_inflight_bytes = Gauge(
            "felix_stream_publish_inflight_bytes",
            "Publish payload bytes read and not yet appended (bounded by pub_inflight_bytes).",
            registry=r,
        )
        self.requests_not_served = Counter(
            "felix_request_not_served",
            "Requests answered as not served (no handler, or their feature withheld), by type.",
            ["type"],
            registry=r,
        )
        self.task_failures = Counter(
            "felix_task_failures",
            "Broker tasks that ended with an unexpected exception, by what started them.",
            ["type"],
            registry=r,
        )
        self.producer_duplicates = Counter(
            "felix_stream_producer_duplicates",
            "Idempotent batches answered with their original offset; nothing appended.",
            registry=r,
        )
        self.producer_refusals = Counter(
            "felix_stream_producer_refusals",
            "Idempotent batches refused, by publish_refused reason.",
            ["reason"],
            registry=r,
        )
        self.conditional_refusals = Counter(
            "felix_stream_conditional_refusals",
            "Conditional writes (publish_if, commit with expected_offset) refused offset_mismatch.",
            ["type"],
            registry=r,
        )
        self.publish_widths = Counter(
            "felix_stream_publish_widths",
            "publish_width announcements received (never answered).",
            registry=r,
        )
        self.stale_width_refusals = Counter(
            "felix_stream_stale_width_refusals",
            "Keyed batches refused stale_width: routed by a width the stream does not have.",
            registry=r,
        )
        self.commits = Counter(
            "felix_stream_commits",
            "Atomic commits answered, by outcome (ok, offset_mismatch or the error code).",
            ["outcome"],
            registry=r,
        )

    def request_timer(self, message_type: str) -> Histogram:
        """The request-duration child for one message type, looked up once per type."""
        child = self._request_children.get(message_type)
        if child is None:
            child = self.request_seconds.labels(type=message_type)
            self._request_children[message_type] = child
        return child

    def timed_fsync(self) -> Callable[[int], None]:
        """An ``os.fsync`` that observes its duration in ``felix_storage_fsync_seconds``
        (what the logs are given to sync with; thread-safe, as the fsync threads call it)."""
        observe = self.fsync_seconds.observe
        sync = self._fsync

        def fsync(fd: int) -> None:
            started = time.perf_counter()
            try:
                sync(fd)
            finally:
                observe(time.perf_counter() - started)

        return fsync

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
