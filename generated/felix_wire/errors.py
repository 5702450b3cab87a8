# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Error codes and retry classes, and one exception class per error code.

These are *remote* errors: what a broker said when it refused a request (JSON
`error` / `publish_error` or a binary ack with a code). Unknown codes are kept
as unknown codes named `code_{number}` and still carry a retry class;
unknown retry classes read as fatal. A client must act on the class it receives,
not on the default table.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Any, Mapping

__all__ = [
    "RetryClass",
    "ErrorCode",
    "ERROR_CODE_BY_NAME",
    "DETAIL_REASONS",
    "retry_class_from_wire",
    "error_code_from_wire",
    "BrokerError",
    "UnauthenticatedError",
    "ForbiddenError",
    "NotFoundError",
    "InvalidRequestError",
    "ShardUnavailableError",
    "NotLeaderError",
    "QuorumTimeoutError",
    "LeadershipLostError",
    "UnacknowledgedError",
    "OverloadedError",
    "LimitExceededError",
    "DrainingError",
    "InternalError",
    "StorageError",
    "StaleClaimError",
    "RevokedError",
    "StaleWidthError",
    "UnknownCodeError",
    "ERROR_CLASSES",
    "broker_error",
]


class RetryClass(enum.IntEnum):
    """What a refused request's sender may do next; the value is the binary ack byte."""

    RETRY = 1
    """nothing applied; safe to resend"""
    RETRY_AFTER = 2
    """nothing applied; wait first (detail.retry_after_ms if present)"""
    REDIRECT = 3
    """nothing applied; send to the shard owner"""
    OUTCOME_UNKNOWN = 4
    """may have been applied; only idempotent requests are safe to resend"""
    FATAL = 5
    """resending fails the same way"""

    @property
    def wire(self) -> str:
        """The JSON spelling."""
        return self.name.lower()

    @property
    def may_have_applied(self) -> bool:
        return self is RetryClass.OUTCOME_UNKNOWN


class ErrorCode(enum.IntEnum):
    """Error codes; the value is the u16 of binary acks, `.wire` the JSON spelling."""

    UNAUTHENTICATED = 1
    """request before auth; token refused"""
    FORBIDDEN = 2
    """permission missing; tenant differs from the token's; forward refused by the owner"""
    NOT_FOUND = 3
    """tenant, namespace, stream or cache unknown on this broker (may not have synced yet)"""
    INVALID_REQUEST = 4
    """malformed frame or batch, unknown frame flags, missing request_id, second auth, unexpected message type, out-of-range request"""
    SHARD_UNAVAILABLE = 5
    """nobody can serve the shard now; detail.reason says why"""
    NOT_LEADER = 6
    """only where the not_leader message cannot be sent"""
    QUORUM_TIMEOUT = 7
    """Quorum write not confirmed by a majority in time"""
    LEADERSHIP_LOST = 8
    """leadership moved after the write, before a majority held it"""
    UNACKNOWLEDGED = 9
    """the broker stopped waiting for an answer it needed"""
    OVERLOADED = 10
    """shedding load; outcome_unknown if already queued"""
    LIMIT_EXCEEDED = 11
    """a configured limit, e.g. too many subscriptions on a connection"""
    DRAINING = 12
    """broker shutting down"""
    INTERNAL = 13
    """anything else (sent as retry for reads, fatal for configuration problems)"""
    STORAGE = 14
    """storage layer failure (retry for reads)"""
    STALE_CLAIM = 15
    """group settle for a claim that no longer stands; sent as fatal to group_extend and to a group_nack naming attempts"""
    REVOKED = 16
    """not in the protocol document's table; the official client 0.6.2 maps it to AuthError. Default class fatal is our inference (a revoked credential fails the same way on resend)."""
    STALE_WIDTH = 17
    """seed only (publish_width refusal); the official client 0.6.2 knows number 17. Default class retry is our inference: nothing was applied and the client re-reads the width and resends."""

    @property
    def wire(self) -> str:
        return self.name.lower()

    @property
    def default_retry(self) -> RetryClass:
        return _DEFAULT_RETRY[self]


_DEFAULT_RETRY: Mapping[ErrorCode, RetryClass] = MappingProxyType(
    {
        ErrorCode.UNAUTHENTICATED: RetryClass.FATAL,
        ErrorCode.FORBIDDEN: RetryClass.FATAL,
        ErrorCode.NOT_FOUND: RetryClass.RETRY_AFTER,
        ErrorCode.INVALID_REQUEST: RetryClass.FATAL,
        ErrorCode.SHARD_UNAVAILABLE: RetryClass.RETRY,
        ErrorCode.NOT_LEADER: RetryClass.REDIRECT,
        ErrorCode.QUORUM_TIMEOUT: RetryClass.OUTCOME_UNKNOWN,
        ErrorCode.LEADERSHIP_LOST: RetryClass.OUTCOME_UNKNOWN,
        ErrorCode.UNACKNOWLEDGED: RetryClass.OUTCOME_UNKNOWN,
        ErrorCode.OVERLOADED: RetryClass.RETRY_AFTER,
        ErrorCode.LIMIT_EXCEEDED: RetryClass.FATAL,
        ErrorCode.DRAINING: RetryClass.RETRY,
        ErrorCode.INTERNAL: RetryClass.OUTCOME_UNKNOWN,
        ErrorCode.STORAGE: RetryClass.OUTCOME_UNKNOWN,
        ErrorCode.STALE_CLAIM: RetryClass.RETRY,
        ErrorCode.REVOKED: RetryClass.FATAL,
        ErrorCode.STALE_WIDTH: RetryClass.RETRY,
    }
)

ERROR_CODE_BY_NAME: Mapping[str, ErrorCode] = MappingProxyType({c.wire: c for c in ErrorCode})
_RETRY_BY_NAME: Mapping[str, RetryClass] = MappingProxyType({r.wire: r for r in RetryClass})

# Known `detail.reason` words, per code.
DETAIL_REASONS: Mapping[ErrorCode, tuple[str, ...]] = MappingProxyType(
    {
        ErrorCode.SHARD_UNAVAILABLE: (
            "not_assigned",
            "owner_unavailable",
            "not_ready",
            "stale",
            "fenced",
            "moving",
            "region_not_routable",
        ),
        ErrorCode.OVERLOADED: ("publish_queue_full", "tenant_quota"),
    }
)


def retry_class_from_wire(value: str | int | None) -> RetryClass | None:
    """A JSON string or binary byte as a RetryClass; unknown values read as fatal."""
    if value is None:
        return None
    if isinstance(value, str):
        return _RETRY_BY_NAME.get(value, RetryClass.FATAL)
    try:
        return RetryClass(value)
    except ValueError:
        return RetryClass.FATAL


def error_code_from_wire(value: str | int) -> ErrorCode | str:
    """A JSON string or binary u16 as an ErrorCode, or the unknown code's name."""
    if isinstance(value, str):
        return ERROR_CODE_BY_NAME.get(value, value)
    try:
        return ErrorCode(value)
    except ValueError:
        return "code_{number}".format(number=value)


class BrokerError(Exception):
    """A request the broker refused. `code` is an ErrorCode, or a string for an
    unknown code (or None when the broker sent no code); `retry` is the class the
    broker sent, or the code's default when it sent none."""

    default_code: ErrorCode | None = None

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | str | None = None,
        retry: RetryClass | None = None,
        detail: Mapping[str, Any] | None = None,
        request_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        if retry is None and isinstance(self.code, ErrorCode):
            retry = self.code.default_retry
        self.retry = retry if retry is not None else RetryClass.FATAL
        self.detail = dict(detail) if detail else {}
        self.request_id = request_id

    @property
    def code_name(self) -> str | None:
        return self.code.wire if isinstance(self.code, ErrorCode) else self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code_name!r}, retry={self.retry.wire!r})"


class UnauthenticatedError(BrokerError):
    """unauthenticated (1, default fatal): request before auth; token refused"""

    default_code = ErrorCode.UNAUTHENTICATED


class ForbiddenError(BrokerError):
    """forbidden (2, default fatal): permission missing; tenant differs from the token's; forward refused by the owner"""

    default_code = ErrorCode.FORBIDDEN


class NotFoundError(BrokerError):
    """not_found (3, default retry_after): tenant, namespace, stream or cache unknown on this broker (may not have synced yet)"""

    default_code = ErrorCode.NOT_FOUND


class InvalidRequestError(BrokerError):
    """invalid_request (4, default fatal): malformed frame or batch, unknown frame flags, missing request_id, second auth, unexpected message type, out-of-range request"""

    default_code = ErrorCode.INVALID_REQUEST


class ShardUnavailableError(BrokerError):
    """shard_unavailable (5, default retry): nobody can serve the shard now; detail.reason says why"""

    default_code = ErrorCode.SHARD_UNAVAILABLE


class NotLeaderError(BrokerError):
    """not_leader (6, default redirect): only where the not_leader message cannot be sent"""

    default_code = ErrorCode.NOT_LEADER


class QuorumTimeoutError(BrokerError):
    """quorum_timeout (7, default outcome_unknown): Quorum write not confirmed by a majority in time"""

    default_code = ErrorCode.QUORUM_TIMEOUT


class LeadershipLostError(BrokerError):
    """leadership_lost (8, default outcome_unknown): leadership moved after the write, before a majority held it"""

    default_code = ErrorCode.LEADERSHIP_LOST


class UnacknowledgedError(BrokerError):
    """unacknowledged (9, default outcome_unknown): the broker stopped waiting for an answer it needed"""

    default_code = ErrorCode.UNACKNOWLEDGED


class OverloadedError(BrokerError):
    """overloaded (10, default retry_after): shedding load; outcome_unknown if already queued"""

    default_code = ErrorCode.OVERLOADED


class LimitExceededError(BrokerError):
    """limit_exceeded (11, default fatal): a configured limit, e.g. too many subscriptions on a connection"""

    default_code = ErrorCode.LIMIT_EXCEEDED


class DrainingError(BrokerError):
    """draining (12, default retry): broker shutting down"""

    default_code = ErrorCode.DRAINING


class InternalError(BrokerError):
    """internal (13, default outcome_unknown): anything else (sent as retry for reads, fatal for configuration problems)"""

    default_code = ErrorCode.INTERNAL


class StorageError(BrokerError):
    """storage (14, default outcome_unknown): storage layer failure (retry for reads)"""

    default_code = ErrorCode.STORAGE


class StaleClaimError(BrokerError):
    """stale_claim (15, default retry): group settle for a claim that no longer stands; sent as fatal to group_extend and to a group_nack naming attempts"""

    default_code = ErrorCode.STALE_CLAIM


class RevokedError(BrokerError):
    """revoked (16, default fatal): not in the protocol document's table; the official client 0.6.2 maps it to AuthError. Default class fatal is our inference (a revoked credential fails the same way on resend)."""

    default_code = ErrorCode.REVOKED


class StaleWidthError(BrokerError):
    """stale_width (17, default retry): seed only (publish_width refusal); the official client 0.6.2 knows number 17. Default class retry is our inference: nothing was applied and the client re-reads the width and resends."""

    default_code = ErrorCode.STALE_WIDTH


class UnknownCodeError(BrokerError):
    """A code this catalogue does not know; its retry class still applies."""


ERROR_CLASSES: Mapping[ErrorCode, type[BrokerError]] = MappingProxyType(
    {
        ErrorCode.UNAUTHENTICATED: UnauthenticatedError,
        ErrorCode.FORBIDDEN: ForbiddenError,
        ErrorCode.NOT_FOUND: NotFoundError,
        ErrorCode.INVALID_REQUEST: InvalidRequestError,
        ErrorCode.SHARD_UNAVAILABLE: ShardUnavailableError,
        ErrorCode.NOT_LEADER: NotLeaderError,
        ErrorCode.QUORUM_TIMEOUT: QuorumTimeoutError,
        ErrorCode.LEADERSHIP_LOST: LeadershipLostError,
        ErrorCode.UNACKNOWLEDGED: UnacknowledgedError,
        ErrorCode.OVERLOADED: OverloadedError,
        ErrorCode.LIMIT_EXCEEDED: LimitExceededError,
        ErrorCode.DRAINING: DrainingError,
        ErrorCode.INTERNAL: InternalError,
        ErrorCode.STORAGE: StorageError,
        ErrorCode.STALE_CLAIM: StaleClaimError,
        ErrorCode.REVOKED: RevokedError,
        ErrorCode.STALE_WIDTH: StaleWidthError,
    }
)


def broker_error(
    message: str,
    code: str | int | None = None,
    retry: str | int | None = None,
    detail: Mapping[str, Any] | None = None,
    request_id: int | None = None,
) -> BrokerError:
    """The typed exception for a refusal as it came off the wire (JSON or binary)."""
    resolved = error_code_from_wire(code) if code is not None else None
    if isinstance(resolved, ErrorCode):
        cls: type[BrokerError] = ERROR_CLASSES[resolved]
    elif resolved is None:
        cls = BrokerError
    else:
        cls = UnknownCodeError
    return cls(
        message,
        code=resolved,
        retry=retry_class_from_wire(retry),
        detail=detail,
        request_id=request_id,
    )
