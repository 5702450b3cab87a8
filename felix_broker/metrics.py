"""The broker's Prometheus metrics, owned per broker instance.

Every :class:`BrokerMetrics` has its own ``CollectorRegistry`` rather than the
process-global one, so several brokers can run in one process (tests do) and
each ``/metrics`` shows only its own broker. Label sets are kept small and
bounded: ``tenant`` appears only where the protocol names it
(``felix_tenant_publish_queue_full_total``), ``reason`` only takes the fixed
names of token checks or of ``publish_refused`` reasons, ``type`` and
``outcome`` only message types and error codes of the catalogue.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "BrokerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST


class BrokerMetrics:
    """One broker's metric objects, registered in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        r = self.registry
        self.publishes = Counter(
            "felix_broker_publishes", "Messages accepted for publishing.", registry=r
        )
        self.published_bytes = Counter(
            "felix_broker_published_bytes", "Payload bytes accepted for publishing.", registry=r
        )
        self.json_publishes = Counter(
            "felix_broker_json_publishes",
            "Publishes received on the JSON compatibility path, by message type.",
            ["frame"],
            registry=r,
        )
        self.tenant_publish_queue_full = Counter(
            "felix_tenant_publish_queue_full",
            "Publishes refused because the tenant's publish queue had no room.",
            ["tenant"],
            registry=r,
        )
        self.deliveries = Counter(
            "felix_broker_deliveries", "Events handed to subscribers' event streams.", registry=r
        )
        self.subscriber_queue_depth = Gauge(
            "felix_broker_subscriber_queue_depth",
            "Batches waiting in subscriber queues, summed over subscribers.",
            registry=r,
        )
        self.subscriber_drops = Counter(
            "felix_broker_subscriber_drops",
            "Events dropped because a subscriber queue was full.",
            registry=r,
        )
        self.connections = Gauge(
            "felix_broker_connections", "Client connections currently open.", registry=r
        )
        self.connections_accepted = Counter(
            "felix_broker_connections_accepted", "Client connections accepted.", registry=r
        )
        self.group_requests = Counter(
            "felix_broker_group_requests",
            "Consumer-group requests answered, by type and outcome (ok or the error code).",
            ["type", "outcome"],
            registry=r,
        )
        self.group_records = Counter(
            "felix_broker_group_records_claimed",
            "Records handed out by group polls (redeliveries included).",
            registry=r,
        )
        self.auth_failures = Counter(
            "felix_broker_auth_failures",
            "Refused auth attempts, by the check that failed.",
            ["reason"],
            registry=r,
        )
        self.auth_timeouts = Counter(
            "felix_broker_auth_timeouts",
            "Streams abandoned because they did not authenticate within auth_timeout_ms.",
            registry=r,
        )
        self.subscriber_queued_bytes = Gauge(
            "felix_broker_subscriber_queued_bytes",
            "Encoded event bytes queued for all subscribers (bounded by "
            "subscriber_queued_bytes_max).",
            registry=r,
        )
        self.failed_logs = Gauge(
            "felix_broker_failed_logs",
            "Logs (streams, caches, groups) in the failed state after an I/O error; "
            "they take no writes until the broker restarts.",
            registry=r,
        )
        self.token_expiries = Counter(
            "felix_broker_token_expiries",
            "Streams whose token expired (plus the leeway) while they were open.",
            registry=r,
        )
        self.internal_errors = Counter(
            "felix_broker_internal_errors",
            "Requests answered `internal` after an unexpected exception, by request type.",
            ["type"],
            registry=r,
        )

        self.publish_inflight_bytes = Gauge(
            "felix_broker_publish_inflight_bytes",
            "Publish payload bytes read and not yet appended (bounded by pub_inflight_bytes).",
            registry=r,
        )
        self.requests_not_served = Counter(
            "felix_broker_requests_not_served",
            "Requests answered as not served (no handler, or their feature withheld), by type.",
            ["type"],
            registry=r,
        )
        self.task_failures = Counter(
            "felix_broker_task_failures",
            "Broker tasks that ended with an unexpected exception, by what started them.",
            ["type"],
            registry=r,
        )
        self.producer_duplicates = Counter(
            "felix_broker_producer_duplicates",
            "Idempotent batches answered with their original offset; nothing appended.",
            registry=r,
        )
        self.producer_refusals = Counter(
            "felix_broker_producer_refusals",
            "Idempotent batches refused, by publish_refused reason.",
            ["reason"],
            registry=r,
        )
        self.conditional_refusals = Counter(
            "felix_broker_conditional_refusals",
            "Conditional writes (publish_if, commit with expected_offset) refused offset_mismatch.",
            ["type"],
            registry=r,
        )
        self.publish_widths = Counter(
            "felix_broker_publish_widths",
            "publish_width announcements received (never answered).",
            registry=r,
        )
        self.stale_width_refusals = Counter(
            "felix_broker_stale_width_refusals",
            "Keyed batches refused stale_width: routed by a width the stream does not have.",
            registry=r,
        )
        self.commits = Counter(
            "felix_broker_commits",
            "Atomic commits answered, by outcome (ok, offset_mismatch or the error code).",
            ["outcome"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
