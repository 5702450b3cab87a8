"""The `felix-conformance client` adapter for the official client (`pip install felix-client`,
imported as `felix`).

    felix-conformance client --adapter "python conformance/adapters/official_felix_adapter.py"

JSON lines on stdin/stdout per `felix_conformance/schema/adapter.schema.json`.
The official client is synchronous: each request runs on a worker thread, and
a cache_get of several keys runs one thread per key so the gets are in flight
together.
"""

from __future__ import annotations

import base64
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import felix


class _NotInClientError(Exception):
    """An operation the official client has no API for."""


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, _NotInClientError):
        return {"kind": "unsupported", "message": str(exc)}
    if isinstance(exc, felix.ConnectionError):
        return {"kind": "connection", "message": str(exc)}
    if isinstance(exc, felix.FelixError):
        text = str(exc)
        if exc.code is None and ("not supported" in text or "unsupported" in text):
            return {"kind": "unsupported", "message": text}
        return {"kind": "broker", "code": exc.code, "retry": exc.retry, "message": text}
    if isinstance(exc, TimeoutError):
        return {"kind": "timeout", "message": str(exc) or "timed out"}
    return {"kind": "client", "message": f"{type(exc).__name__}: {exc}"}


class Adapter:
    def __init__(self) -> None:
        self.client: Any = None
        self.tenant = self.namespace = ""
        self.pool = ThreadPoolExecutor(max_workers=8)

    def perform(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "connect":
            self.tenant, self.namespace = request["tenant_id"], request["namespace"]
            self.client = felix.Client(
                [request["addr"]],
                tenant_id=self.tenant,
                token=request["token"],
                server_name=request["server_name"],
                ca_file=request["ca_file"],
            )
            return {}
        if op == "close":
            if self.client is not None:
                self.client.__exit__(None, None, None)  # the client closes as a context manager
            self.client = None
            return {}
        c, t, ns = self.client, self.tenant, self.namespace
        if op == "publish":
            key = base64.b64decode(request["key"]) if "key" in request else None
            payload = base64.b64decode(request["payload"])
            offset = c.publish(t, ns, request["stream"], payload, key=key, ack=request["ack"])
            return {"offset": offset}
        if op == "publish_many":
            payloads = [base64.b64decode(p) for p in request["payloads"]]
            offsets = list(
                self.pool.map(
                    lambda p: c.publish(t, ns, request["stream"], p, ack="per_message"), payloads
                )
            )
            return {"offsets": offsets}
        if op == "publish_if":
            raise _NotInClientError("the official client has no conditional publish (publish_if)")
        if op == "cache_put":
            c.cache_put(t, ns, request["cache"], request["key"], base64.b64decode(request["value"]))
            return {}
        if op == "cache_get":
            keys = request["keys"]
            found = list(self.pool.map(lambda k: c.cache_get(t, ns, request["cache"], k), keys))
            return {
                "values": {
                    k: None if v is None else base64.b64encode(v).decode()
                    for k, v in zip(keys, found, strict=True)
                }
            }
        if op == "cache_delete":
            c.cache_delete(t, ns, request["cache"], request["key"])
            return {}
        if op == "subscribe":
            payloads: list[str] = []
            with c.subscribe(t, ns, request["stream"]) as events:
                while len(payloads) < request["count"]:
                    event = events.next_event(timeout=float(request["timeout"]))
                    if event is None:
                        raise TimeoutError(f"no event within {request['timeout']} s")
                    payloads.append(base64.b64encode(bytes(event.payload)).decode())
            return {"payloads": payloads}
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    adapter = Adapter()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"id": request["id"], "ok": True, "result": adapter.perform(request)}
        except Exception as exc:  # every failure is reported, the adapter stays up
            reply = {"id": request["id"], "ok": False, "error": _error(exc)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    if adapter.client is not None:
        adapter.client.__exit__(None, None, None)
    adapter.pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
