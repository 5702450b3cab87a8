"""The `felix-conformance client` adapter for `felix_client`, the reference client.

    felix-conformance client --adapter "python conformance/adapters/felix_client_adapter.py"

It reads one request per line on stdin and writes one reply per line on stdout,
as `felix_conformance/schema/adapter.schema.json` describes, performing each
request with a `felix_client.Client`. It lives outside the kit's package: the
kit imports no client, the client imports no kit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import felix_client
from felix_client import (
    BrokerError,
    ClientTimeoutError,
    ConnectionLostError,
    NotSupportedByBrokerError,
)
from felix_client.retry import retry


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, BrokerError):
        code = exc.code.wire if isinstance(exc.code, felix_client.ErrorCode) else exc.code
        return {"kind": "broker", "code": code, "retry": exc.retry.wire, "message": str(exc)}
    if isinstance(exc, NotSupportedByBrokerError):
        return {"kind": "unsupported", "message": str(exc)}
    if isinstance(exc, ClientTimeoutError | TimeoutError):
        return {"kind": "timeout", "message": str(exc) or "timed out"}
    if isinstance(exc, ConnectionLostError | ConnectionError):
        return {"kind": "connection", "message": str(exc)}
    return {"kind": "client", "message": f"{type(exc).__name__}: {exc}"}


class Adapter:
    def __init__(self) -> None:
        self.client: felix_client.Client | None = None

    async def perform(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "connect":
            self.client = await felix_client.connect(
                [request["addr"]],
                tenant_id=request["tenant_id"],
                token=request["token"],
                namespace=request["namespace"],
                server_name=request["server_name"],
                ca_file=request["ca_file"],
                config=felix_client.ClientConfig(request_timeout=8.0),
            )
            return {}
        client = self.client
        if op == "close":
            if client is not None:
                await client.aclose()
            self.client = None
            return {}
        assert client is not None, "connect comes first"
        if op == "publish":
            key = base64.b64decode(request["key"]) if "key" in request else None

            async def publish() -> int | None:
                assert client is not None
                return await client.publish(
                    request["stream"],
                    base64.b64decode(request["payload"]),
                    key=key,
                    ack=request["ack"],
                )

            # The client's retry helper acts on the refusal's retry class.
            offset = await (retry(publish) if request.get("retry") else publish())
            return {"offset": offset}
        if op == "publish_many":
            offsets = await asyncio.gather(
                *(
                    client.publish(request["stream"], base64.b64decode(p), ack="per_message")
                    for p in request["payloads"]
                )
            )
            return {"offsets": list(offsets)}
        if op == "publish_if":
            offset = await client.publish_if(
                request["stream"],
                base64.b64decode(request["payload"]),
                expected_offset=int(request["expected_offset"]),
            )
            return {"offset": offset}
        if op == "cache_put":
            await client.cache(request["cache"]).put(
                request["key"], base64.b64decode(request["value"])
            )
            return {}
        if op == "cache_get":
            cache = client.cache(request["cache"])
            found = await asyncio.gather(*(cache.get(k) for k in request["keys"]))
            values = {
                k: None if v is None else base64.b64encode(v).decode()
                for k, v in zip(request["keys"], found, strict=True)
            }
            return {"values": values}
        if op == "cache_delete":
            await client.cache(request["cache"]).delete(request["key"])
            return {}
        if op == "subscribe":
            payloads: list[str] = []
            offsets: list[int | None] = []
            dropped: list[int] = []
            async with client.subscribe(request["stream"]) as events:
                while len(payloads) < request["count"]:
                    event = await events.next(timeout=float(request["timeout"]))
                    payloads.append(base64.b64encode(event.payload).decode())
                    offsets.append(event.offset)
                    dropped.append(event.dropped_before)
            return {"payloads": payloads, "offsets": offsets, "dropped": dropped}
        raise ValueError(f"unknown op {op!r}")


async def main() -> int:
    adapter = Adapter()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        request = json.loads(line)
        try:
            reply = {"id": request["id"], "ok": True, "result": await adapter.perform(request)}
        except Exception as exc:  # every failure is reported, the adapter stays up
            reply = {"id": request["id"], "ok": False, "error": _error(exc)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    if adapter.client is not None:
        await adapter.client.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
