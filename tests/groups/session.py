"""Group requests on one authenticated stream, with a request-id counter and a scope."""

from __future__ import annotations

from typing import Any

from felix_wire.messages import AckMode, GroupPoll, GroupRecords, Publish, PublishOk

from ..support.wire import WireStream


class GroupSession:
    """Requests on `stream`, each carrying `scope` (tenant, namespace, stream, shard and
    group) under the fields given, and the next request id."""

    def __init__(self, stream: WireStream, scope: dict[str, Any]) -> None:
        self.stream = stream
        self.scope = scope
        self.rid = 0

    def next_id(self) -> int:
        self.rid += 1
        return self.rid

    async def call(self, cls: Any, timeout: float = 5.0, **fields: Any) -> Any:
        message = cls(**{**self.scope, **fields, "request_id": self.next_id()})
        await self.stream.send(message)
        return await self.stream.recv(timeout=timeout)

    async def poll(self, n: int = 10, wait_ms: int = 0, **kw: Any) -> list[Any]:
        answer = await self.call(GroupPoll, max_records=n, wait_ms=wait_ms, **kw)
        assert isinstance(answer, GroupRecords), answer
        return list(answer.records)

    async def publish(self, *payloads: bytes) -> list[int]:
        """Acked JSON publishes to the scope's stream, one per payload; their offsets."""
        offsets = []
        for payload in payloads:
            await self.stream.send(
                Publish(
                    tenant_id=self.scope["tenant_id"],
                    namespace=self.scope["namespace"],
                    stream=self.scope["stream"],
                    payload=payload,
                    ack=AckMode.PER_MESSAGE,
                    request_id=self.next_id(),
                )
            )
            answer = await self.stream.recv()
            assert isinstance(answer, PublishOk), answer
            offsets.append(answer.offset)
        return offsets
