"""A small client adapter written directly on felix_wire + felix_transport, for
testing the client tester: correct by default, deliberately broken with --break.

    python tests/conformance/raw_adapter.py [--break MODE]

Modes (each breaks one rule a client must keep):
  no-flags        auth without client_flags (negotiates nothing)
  ungated         sends cache_delete whatever the broker advertised
  never-reads     reports success without reading any answer
  arrival-order   matches answers to requests by arrival order, not request_id
  binary-always   publishes acked binary batches even to a broker that negotiated nothing
  resend          resends a refused publish once at once whatever its retry class
                  (outcome_unknown and fatal too, retry_after without waiting)
  strict-types    treats a message type it does not know as a protocol failure
  ignore-not-leader  offers FEATURE_REDIRECT but reports a not_leader as a failure
  no-reconnect    keeps using a connection the broker closed
  impatient       gives up on an answer after 1 s (reports a timeout)
  no-keepalive    sends no QUIC PINGs, so an idle connection idles out
  resume-latest   subscribes again from latest after subscription_lagged / shard_moved
  no-gap          reports no events lost whatever the offsets say
  skips-as-gaps   ignores skipped_before: offsets holding no event count as lost
  no-window       hands every publish of publish_many over at once, whatever window
  binary-events   reads only event batches: a JSON `event` is passed over
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import Any

from felix_transport import (
    Connection,
    ConnectionClosedError,
    Stream,
    StreamClosedError,
    TransportConfig,
    connect,
)
from felix_wire.binary import (
    BinaryAckMode,
    EventBatchLegacyFrame,
    EventBatchSharedFrame,
    PublishAckFrame,
)
from felix_wire.binary import PublishBatchFrame as BinaryPublish
from felix_wire.codec import decode_payload, encode_frame
from felix_wire.errors import ErrorCode, RetryClass
from felix_wire.features import Capabilities, Feature
from felix_wire.flags import ORIGINAL_V1_FLAGS
from felix_wire.frame import FrameReader
from felix_wire.gating import client_auth, server_capabilities
from felix_wire.messages import (
    AckMode,
    Auth,
    AuthOk,
    CacheDelete,
    CacheGet,
    CacheValue,
    Error,
    Event,
    EventBatch,
    NotLeader,
    Ok,
    Publish,
    PublishError,
    PublishIf,
    PublishOk,
    ShardMoved,
    StartOffset,
    Subscribe,
    SubscriptionLagged,
    Unknown,
)

MODES = (
    "none", "no-flags", "ungated", "never-reads", "arrival-order", "binary-always", "resend",
    "strict-types", "ignore-not-leader", "no-reconnect", "impatient", "no-keepalive",
    "resume-latest", "no-gap", "skips-as-gaps", "no-window", "binary-events",
)  # fmt: skip
# shared events with offsets and skips, acked binary publish, owner, codes and detail
FLAGS = 0x0004 | 0x0020 | 0x0800 | 0x0001 | 0x0008 | 0x0010 | 0x0080 | 0x0200 | 0x0400
FEATURES = (
    int(Feature.FEATURE_ERROR_CODES) | int(Feature.FEATURE_UNSUPPORTED)
    | int(Feature.FEATURE_REDIRECT) | int(Feature.FEATURE_SUBSCRIPTION_LAGGED)
    | int(Feature.FEATURE_SHARD_MOVED) | int(Feature.FEATURE_PUBLISH_PIPELINE)
)  # fmt: skip


class Reader:
    def __init__(self, stream: Stream, *, skip_unknown: bool = True) -> None:
        self.stream = stream
        self.frames = FrameReader()
        self.pending: list[Any] = []
        self.skip_unknown = skip_unknown

    async def next(self, timeout: float = 8.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                while not self.pending:
                    data = await self.stream.read()
                    if not data:
                        raise ConnectionError("the broker ended the stream")
                    self.pending += [
                        decode_payload(f.flags, f.payload) for f in self.frames.feed(data)
                    ]
                value = self.pending.pop(0)
                if not (self.skip_unknown and isinstance(value, Unknown)):
                    return value


class RawClient:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connection: Connection | None = None
        self.control: Reader | None = None
        self.server = Capabilities(int(ORIGINAL_V1_FLAGS), 0)
        self.legacy = False
        self.next_id = 0
        self.tenant = self.namespace = ""
        self.connect_request: dict[str, Any] = {}

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    async def send(self, value: Any) -> None:
        assert self.control is not None
        await self.control.stream.write(encode_frame(value))

    async def connect(self, request: dict[str, Any]) -> dict[str, Any]:
        self.connect_request = request
        host, _, port = request["addr"].rpartition(":")
        keepalive = None if self.mode == "no-keepalive" else 0.5
        config = TransportConfig.client(
            Path(request["ca_file"]).read_bytes(),
            server_name=request["server_name"],
            keepalive_interval=keepalive,
        )
        self.connection = await connect(config, host, int(port))
        stream = await self.connection.open_bidi_stream()
        self.control = Reader(stream, skip_unknown=self.mode != "strict-types")
        self.tenant, self.namespace = request["tenant_id"], request["namespace"]
        if self.mode == "no-flags":
            auth = Auth(tenant_id=self.tenant, token=request["token"])
        else:
            auth = client_auth(
                self.tenant, request["token"], client_flags=FLAGS, client_features=FEATURES
            )
        await self.send(auth)
        answer = await self.control.next()
        if isinstance(answer, Error):
            return _fail("broker", answer.message, answer.code)
        assert isinstance(answer, AuthOk | Ok)
        self.legacy = isinstance(answer, Ok)
        self.server = server_capabilities(answer)
        return _ok({})

    async def publish(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.control is not None
        rid = self.rid()
        payload = base64.b64decode(request["payload"])
        binary = self.mode == "binary-always" or (not self.legacy and self.server.has(0x0009))
        if binary:
            await self.send(
                BinaryPublish(
                    request_id=rid, ack_mode=BinaryAckMode.PER_MESSAGE, tenant_id=self.tenant,
                    namespace=self.namespace, stream=request["stream"], payloads=[payload],
                )
            )  # fmt: skip
        else:
            await self.send(
                Publish(
                    tenant_id=self.tenant, namespace=self.namespace, stream=request["stream"],
                    payload=payload, request_id=rid, ack=AckMode.PER_MESSAGE,
                )
            )  # fmt: skip
        if self.mode == "never-reads":
            return _ok({"offset": None})
        answer = await self.control.next(1.0 if self.mode == "impatient" else 8.0)
        refused = isinstance(answer, PublishError) or (
            isinstance(answer, PublishAckFrame) and answer.status != 0
        )
        if refused and self.mode == "resend" and not request.get("resent"):
            return await self.publish({**request, "resent": True})
        if refused and request.get("retry") and request.get("attempt", 1) < 3:
            # The retry policy: resend only what the class allows, after what it asks.
            retry = getattr(answer, "retry", None)
            wire = retry.wire if isinstance(retry, RetryClass) else retry
            if wire in ("retry", "retry_after"):
                if isinstance(answer, PublishAckFrame):
                    wait_ms = answer.retry_after_ms or 0
                else:
                    wait_ms = (answer.detail.retry_after_ms if answer.detail else None) or 0
                await asyncio.sleep(wait_ms / 1000)
                return await self.publish({**request, "attempt": request.get("attempt", 1) + 1})
        if isinstance(answer, PublishOk):
            return _ok({"offset": answer.offset})
        if isinstance(answer, PublishError):
            return _fail("broker", answer.message, answer.code, answer.retry)
        if isinstance(answer, PublishAckFrame):
            if answer.status == 0:
                return _ok({"offset": answer.offset})
            code = _code_name(answer.code)
            retry = answer.retry.wire if isinstance(answer.retry, RetryClass) else None
            return _fail("broker", answer.message, code, retry)
        return _fail("client", f"unexpected answer {answer!r}")

    async def publish_if(self, request: dict[str, Any]) -> dict[str, Any]:
        """One conditional write on the control stream; `resend` sends it again once
        whatever the refusal's class."""
        assert self.control is not None
        await self.send(
            PublishIf(
                tenant_id=self.tenant, namespace=self.namespace, stream=request["stream"],
                payloads=[base64.b64decode(request["payload"])],
                expected_offset=int(request["expected_offset"]), request_id=self.rid(),
            )
        )  # fmt: skip
        if self.mode == "never-reads":
            return _ok({"offset": None})
        answer = await self.control.next(1.0 if self.mode == "impatient" else 8.0)
        if isinstance(answer, PublishOk):
            return _ok({"offset": answer.offset})
        if self.mode == "resend" and not request.get("resent"):
            return await self.publish_if({**request, "resent": True})
        if isinstance(answer, Error):
            return _fail("broker", answer.message, answer.code, answer.retry)
        return _fail("client", f"unexpected answer {answer!r}")

    async def publish_many(self, request: dict[str, Any]) -> dict[str, Any]:
        """One after the other: within any publish window the broker grants."""
        if self.mode == "no-window":
            return await self._publish_all_at_once(request)
        offsets: list[int | None] = []
        for payload in request["payloads"]:
            one = {"op": "publish", "stream": request["stream"], "payload": payload}
            reply = await self.publish({**one, "ack": "per_message"})
            if not reply["ok"]:
                return reply
            offsets.append(reply["result"]["offset"])
        return _ok({"offsets": offsets})

    async def _publish_all_at_once(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.control is not None
        ids = []
        for payload in request["payloads"]:
            ids.append(self.rid())
            await self.send(
                Publish(
                    tenant_id=self.tenant, namespace=self.namespace, stream=request["stream"],
                    payload=base64.b64decode(payload), request_id=ids[-1],
                    ack=AckMode.PER_MESSAGE,
                )
            )  # fmt: skip
        offsets: dict[int, int | None] = {}
        while len(offsets) < len(ids):
            answer = await self.control.next()
            if not isinstance(answer, PublishOk):
                return _fail("client", f"unexpected answer {answer!r}")
            offsets[answer.request_id] = answer.offset
        return _ok({"offsets": [offsets[i] for i in ids]})

    async def cache_get(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.control is not None
        sent: list[tuple[int, str]] = []
        for key in request["keys"]:
            rid = self.rid()
            sent.append((rid, key))
            await self.send(
                CacheGet(tenant_id=self.tenant, namespace=self.namespace,
                         cache=request["cache"], key=key, request_id=rid)
            )  # fmt: skip
        if self.mode == "never-reads":
            return _ok({"values": {k: None for _, k in sent}})
        by_id = dict(sent)
        values: dict[str, str | None] = {}
        for i in range(len(sent)):
            answer = await self.control.next()
            assert isinstance(answer, CacheValue)
            key = sent[i][1] if self.mode == "arrival-order" else by_id[answer.request_id or 0]
            values[key] = None if answer.value is None else base64.b64encode(answer.value).decode()
        return _ok({"values": values})

    async def cache_delete(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.control is not None
        if self.mode != "ungated" and not self.server.has_feature(
            int(Feature.FEATURE_CACHE_DELETE)
        ):
            return _fail("unsupported", "the broker did not advertise FEATURE_CACHE_DELETE")
        await self.send(
            CacheDelete(tenant_id=self.tenant, namespace=self.namespace,
                        cache=request["cache"], key=request["key"], request_id=self.rid())
        )  # fmt: skip
        if self.mode == "never-reads":
            return _ok({})
        answer = await self.control.next()
        if isinstance(answer, Error):
            return _fail("broker", answer.message, answer.code)
        return _ok({})

    async def subscribe(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.control is not None and self.connection is not None
        start = StartOffset(offset=request["from"]) if "from" in request else None
        await self.send(
            Subscribe(
                tenant_id=self.tenant, namespace=self.namespace, stream=request["stream"],
                start=start,
            )
        )  # fmt: skip
        if self.mode == "never-reads":
            return _ok({"payloads": []})
        answer = await self.control.next()  # subscribed, or not_leader
        if isinstance(answer, NotLeader):
            if self.mode == "ignore-not-leader" or answer.addr is None or request.get("hops"):
                return _fail("broker", f"not the leader (node {answer.node_id})", "not_leader")
            if self.connection is not None:
                self.connection.close()
            await self.connect({**self.connect_request, "addr": answer.addr})
            return await self.subscribe({**request, "hops": 1})
        if isinstance(answer, Error):
            return _fail("broker", answer.message, answer.code, answer.retry)
        assert self.connection is not None
        events = Reader(await self.connection.accept_stream())
        await events.next()  # event_stream_hello
        payloads: list[str] = list(request.get("payloads", []))
        offsets: list[int | None] = list(request.get("offsets", []))
        dropped: list[int] = list(request.get("dropped", []))
        while len(payloads) < request["count"]:
            batch = await events.next(float(request["timeout"]))
            if isinstance(batch, SubscriptionLagged | ShardMoved):
                # The stream ended: resume from resume_from (lagged) or past what we have.
                after = next((o for o in reversed(offsets) if o is not None), None)
                resume = batch.resume_from
                if isinstance(batch, ShardMoved) and after is not None:
                    resume = max(after + 1, resume or 0)
                again = {**request, "payloads": payloads, "offsets": offsets, "dropped": dropped}
                again.pop("from", None)
                if resume is not None and self.mode != "resume-latest":
                    again["from"] = resume
                return await self.subscribe(again)
            if isinstance(batch, Event) and self.mode != "binary-events":  # JSON, one event
                payloads.append(base64.b64encode(batch.payload).decode())
                offsets.append(batch.offset)
                dropped.append(0)
            if isinstance(batch, EventBatchSharedFrame | EventBatchLegacyFrame | EventBatch):
                base = getattr(batch, "base_offset", None)
                skipped = getattr(batch, "skipped_before", None) or 0
                if self.mode == "skips-as-gaps":
                    skipped = 0
                for i, p in enumerate(batch.payloads):
                    offset = None if base is None else base + i
                    last = next((o for o in reversed(offsets) if o is not None), None)
                    lost = 0 if offset is None or last is None else offset - last - 1
                    lost -= skipped if i == 0 else 0  # offsets holding no event, not lost
                    payloads.append(base64.b64encode(p).decode())
                    offsets.append(offset)
                    dropped.append(0 if self.mode == "no-gap" else max(lost, 0))
        return _ok({"payloads": payloads, "offsets": offsets, "dropped": dropped})

    async def close(self) -> dict[str, Any]:
        if self.connection is not None:
            self.connection.close()
        return _ok({})


def _code_name(code: int | None) -> str | None:
    if code is None:
        return None
    try:
        return ErrorCode(code).wire
    except ValueError:
        return str(code)


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "result": result}


def _fail(
    kind: str, message: str, code: str | None = None, retry: str | None = None
) -> dict[str, Any]:
    return {"ok": False, "error": {"kind": kind, "message": message, "code": code, "retry": retry}}


async def main(mode: str) -> int:
    client = RawClient(mode)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        request = json.loads(line)
        perform = getattr(client, request["op"])
        try:
            lost = client.connection is not None and client.connection.closed
            if lost and request["op"] not in ("connect", "close") and mode != "no-reconnect":
                await client.connect(client.connect_request)  # a closed link: connect again
            reply = await (perform() if request["op"] == "close" else perform(request))
        except (StreamClosedError, ConnectionClosedError, ConnectionError) as exc:
            reply = _fail("connection", f"{type(exc).__name__}: {exc}")
        except TimeoutError:
            reply = _fail("timeout", "no answer in time")
        except Exception as exc:  # reported, never fatal to the adapter
            reply = _fail("client", f"{type(exc).__name__}: {exc}")
        sys.stdout.write(json.dumps({"id": request["id"], **reply}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--break", dest="mode", choices=MODES, default="none")
    sys.exit(asyncio.run(main(parser.parse_args().mode)))
