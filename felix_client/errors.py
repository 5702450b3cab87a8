"""The client's exception tree.

Remote errors (what a broker said when it refused a request) are the generated
`BrokerError` classes of `felix_wire.errors`, one per wire code, each with its
`code`, `retry` class and `detail`; they are re-exported here unchanged so an
application imports every error from one place. Local errors (what the client
decided on its own) derive from `ClientError` and never pretend to carry a
wire code.
"""

from __future__ import annotations

from felix_wire.errors import (
    BrokerError,
    DrainingError,
    ErrorCode,
    ForbiddenError,
    InternalError,
    InvalidRequestError,
    LeadershipLostError,
    LimitExceededError,
    NotFoundError,
    NotLeaderError,
    OverloadedError,
    QuorumTimeoutError,
    RetryClass,
    RevokedError,
    ShardUnavailableError,
    StaleClaimError,
    StaleWidthError,
    StorageError,
    UnacknowledgedError,
    UnauthenticatedError,
    UnknownCodeError,
)

__all__ = [
    "BrokerError",
    "BrokerUnreachableError",
    "ClientError",
    "ClientTimeoutError",
    "ConnectionLostError",
    "CursorError",
    "DrainingError",
    "ErrorCode",
    "ForbiddenError",
    "InternalError",
    "InvalidRequestError",
    "LeadershipLostError",
    "LimitExceededError",
    "NotFoundError",
    "NotLeaderError",
    "NotSupportedByBrokerError",
    "OverloadedError",
    "PayloadTooLargeError",
    "ProtocolViolationError",
    "QuorumTimeoutError",
    "RetryClass",
    "RevokedError",
    "ShardLostError",
    "ShardUnavailableError",
    "StaleClaimError",
    "StaleWidthError",
    "StorageError",
    "UnacknowledgedError",
    "UnauthenticatedError",
    "UnknownCodeError",
]


class ClientError(Exception):
    """Base of every error the client raises on its own (not a broker refusal)."""


class NotSupportedByBrokerError(ClientError):
    """The broker did not advertise what this request needs.

    Raised before anything is sent when the negotiated capabilities lack the
    feature (`missing` names it), or when a broker answered `unsupported`
    (`missing` is then empty). Nothing was applied either way.
    """

    def __init__(self, request_type: str, missing: list[str] | tuple[str, ...] = ()) -> None:
        needs = f" (needs {', '.join(missing)})" if missing else ""
        super().__init__(f"{request_type} is not supported by this broker{needs}")
        self.request_type = request_type
        self.missing = tuple(missing)


class ClientTimeoutError(ClientError, TimeoutError):
    """No answer within the client's timeout. The request may still have been
    applied: the retry helper treats it like `outcome_unknown`."""


class ConnectionLostError(ClientError):
    """The stream or connection carrying a request ended before its answer.
    Like a timeout, the outcome is unknown."""


class ProtocolViolationError(ClientError):
    """The broker sent something the protocol does not allow here."""


class CursorError(ClientError):
    """A start offset the broker cannot serve (`subscribe_cursor_error`): `reason`
    is `too_old` (retention removed it) or `in_future`; `available` is the oldest
    retained offset or the current tail respectively."""

    def __init__(self, reason: str, requested: int, available: int) -> None:
        super().__init__(f"offset {requested} is {reason}; available: {available}")
        self.reason = reason
        self.requested = requested
        self.available = available


class BrokerUnreachableError(ConnectionLostError):
    """No broker completed a QUIC handshake at any of the addresses within the
    connect timeout (`ClientConfig.connect_timeout`): most often nothing listens
    there. Nothing was sent."""


class PayloadTooLargeError(ClientError, ValueError):
    """A request would not fit in one frame (the protocol's 16 MiB limit); it was
    refused before anything was sent."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} of {size:,} bytes exceeds the frame limit of {limit // (1024 * 1024)} MiB"
            f" ({limit:,} bytes); nothing was sent"
        )
        self.size = size
        self.limit = limit


class ShardLostError(ConnectionLostError):
    """One shard of a multi-shard subscription or watch failed; the other shards
    keep delivering. `shard` names it and `position` is where it would resume (the
    offset after the last item delivered from it, None when none was)."""

    def __init__(self, shard: int, position: int | None, cause: BaseException) -> None:
        super().__init__(f"shard {shard} was lost ({cause}); the other shards keep delivering")
        self.shard = shard
        self.position = position
        self.cause = cause
