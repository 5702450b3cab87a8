"""felix_client: the reference asyncio client of the Felix wire protocol.

    client = await felix_client.connect("127.0.0.1:5000", tenant_id="acme",
                                        token=token, ca_file="ca.pem")
    async with client:
        async with client.subscribe("orders") as sub:  # every shard
            await client.publish("orders", b"hello", key=b"user-1")
            event = await sub.next(timeout=5)
        async with client.consumer("jobs", group="fulfilment") as consumer:
            async for record in consumer:
                await record.ack()

Errors: every broker refusal is the generated `BrokerError` subclass for its
wire code (re-exported here); local errors derive from `ClientError`.
"""

from felix_transport import __version__
from felix_wire.features import Feature
from felix_wire.messages import AckMode, ShardKind

from ._events import CacheChange
from .cache import Cache, CacheEntry, CacheWatchFeed, ConditionResult, ShardedCacheWatch
from .client import Client, ClientConfig, ReadPage, StreamRecord, connect
from .errors import (
    BrokerError,
    BrokerUnreachableError,
    ClientError,
    ClientTimeoutError,
    ConnectionLostError,
    CursorError,
    DrainingError,
    ErrorCode,
    ForbiddenError,
    InternalError,
    InvalidRequestError,
    LeadershipLostError,
    LimitExceededError,
    NotFoundError,
    NotLeaderError,
    NotSupportedByBrokerError,
    OverloadedError,
    PayloadTooLargeError,
    ProtocolViolationError,
    QuorumTimeoutError,
    RetryClass,
    RevokedError,
    ShardLostError,
    ShardUnavailableError,
    StaleClaimError,
    StaleWidthError,
    StorageError,
    UnacknowledgedError,
    UnauthenticatedError,
    UnknownCodeError,
)
from .groups import ClaimedRecord, Consumer, ConsumerRecord, Group, GroupState, SeekResult
from .retry import retry, should_retry
from .subscription import Event, ShardedFeed, Start, StartVector, StreamSubscription, Subscription

__all__ = [
    "AckMode",
    "BrokerError",
    "BrokerUnreachableError",
    "Cache",
    "CacheChange",
    "CacheEntry",
    "CacheWatchFeed",
    "ClaimedRecord",
    "Client",
    "ClientConfig",
    "ClientError",
    "ClientTimeoutError",
    "ConditionResult",
    "ConnectionLostError",
    "Consumer",
    "ConsumerRecord",
    "CursorError",
    "DrainingError",
    "ErrorCode",
    "Event",
    "Feature",
    "ForbiddenError",
    "Group",
    "GroupState",
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
    "ReadPage",
    "RetryClass",
    "RevokedError",
    "SeekResult",
    "ShardKind",
    "ShardLostError",
    "ShardUnavailableError",
    "ShardedCacheWatch",
    "ShardedFeed",
    "StaleClaimError",
    "StaleWidthError",
    "Start",
    "StartVector",
    "StorageError",
    "StreamRecord",
    "StreamSubscription",
    "Subscription",
    "UnacknowledgedError",
    "UnauthenticatedError",
    "UnknownCodeError",
    "__version__",
    "connect",
    "retry",
    "should_retry",
]
