"""`felix`: publish, subscribe, read, use a cache, and inspect a token from a shell.

Connection options come from flags or the environment: --addr (FELIX_ADDR,
comma-separated), --tenant (FELIX_TENANT), --token (FELIX_TOKEN) or
--token-file (FELIX_TOKEN_FILE), --ca-file (FELIX_CA_FILE), --namespace
(FELIX_NAMESPACE, default "default"). Output is one readable line per item, or
one JSON object per line with --json. Exit status: 0 on success, 1 when the
broker or the connection failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt

from felix_transport import __version__

from .cache import CacheWatchFeed, ShardedCacheWatch
from .client import Client, ClientConfig, connect, parse_addr
from .errors import BrokerError, ClientError, ShardLostError
from .groups import ClaimedRecord, ConsumerRecord, Group
from .subscription import ShardedFeed, Start, StreamSubscription, Subscription

__all__ = ["main"]

_TIME_CLAIMS = ("exp", "iat", "nbf")


class UsageError(Exception):
    """Bad or missing options (exit status 2)."""


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {text}")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return int(text)


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection (flags override FELIX_* variables)")
    group.add_argument("--addr", action="append", help="broker host:port (repeatable; FELIX_ADDR)")
    group.add_argument("--tenant", help="tenant id (FELIX_TENANT)")
    group.add_argument("--token", help="Felix token (FELIX_TOKEN)")
    group.add_argument("--token-file", type=Path, help="file holding the token (FELIX_TOKEN_FILE)")
    group.add_argument("--ca-file", type=Path, help="CA certificate PEM (FELIX_CA_FILE)")
    group.add_argument("--namespace", help="namespace (FELIX_NAMESPACE; default: default)")
    group.add_argument("--server-name", default="localhost", help="TLS server name")
    group.add_argument("--offer-alpn", action="store_true", help="offer ALPN felix/1")
    group.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=ClientConfig.connect_timeout,
        help=f"seconds to wait for the broker to answer (default {ClientConfig.connect_timeout})",
    )
    common.add_argument("--json", action="store_true", help="one JSON object per line")
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="felix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    publish = commands.add_parser("publish", parents=[common], help="publish records")
    publish.add_argument("stream")
    publish.add_argument("messages", nargs="*", help="payloads (default: one per stdin line)")
    publish.add_argument("--key", help="routing key")
    publish.add_argument("--ack", choices=["none", "per_message"], default="per_message")
    publish.add_argument("--batch", action="store_true", help="send all messages as one batch")

    subscribe = commands.add_parser("subscribe", parents=[common], help="print events")
    subscribe.add_argument("stream")
    subscribe.add_argument("--from", dest="start", default="latest", help="latest|earliest|N")
    subscribe.add_argument("--shard", type=int, help="one shard only (default: every shard)")
    subscribe.add_argument("--count", type=_count, help="stop after N events")
    subscribe.add_argument("--timeout", type=_seconds, help="stop after S seconds without events")

    read = commands.add_parser("read", parents=[common], help="read a range of a stream")
    read.add_argument("stream")
    read.add_argument("--from", dest="start", type=int, required=True, help="first offset")
    read.add_argument("--to", dest="end", type=int, help="end offset (exclusive)")
    read.add_argument("--shard", type=int, help="one shard only (default: every shard)")
    read.add_argument("--max-records", type=_count, help="records per page")

    cache = commands.add_parser("cache", help="cache operations")
    ops = cache.add_subparsers(dest="op", required=True)
    get = ops.add_parser("get", parents=[common], help="print a value")
    get.add_argument("cache")
    get.add_argument("key")
    put = ops.add_parser("put", parents=[common], help="store a value")
    put.add_argument("cache")
    put.add_argument("key")
    put.add_argument("value")
    put.add_argument("--ttl", type=_seconds, help="seconds until it expires")
    delete = ops.add_parser("delete", parents=[common], help="remove a key")
    delete.add_argument("cache")
    delete.add_argument("key")
    watch = ops.add_parser("watch", parents=[common], help="print changes")
    watch.add_argument("cache")
    target = watch.add_mutually_exclusive_group(required=True)
    target.add_argument("--key")
    target.add_argument("--prefix")
    watch.add_argument("--shard", type=int)
    watch.add_argument("--retained", action="store_true", help="current values first")
    watch.add_argument("--count", type=_count, help="stop after N changes")
    watch.add_argument("--timeout", type=_seconds, help="stop after S seconds without changes")

    counter = commands.add_parser("counter", help="counters of a cache")
    counter_ops = counter.add_subparsers(dest="op", required=True)
    add = counter_ops.add_parser("add", parents=[common], help="add to a counter, print the sum")
    add.add_argument("cache")
    add.add_argument("key")
    add.add_argument("delta", type=int, help="may be negative (write -5 as -- -5 or =-5)")
    counter_get = counter_ops.add_parser("get", parents=[common], help="print a counter")
    counter_get.add_argument("cache")
    counter_get.add_argument("key")

    _group_commands(commands, common)

    consume = commands.add_parser(
        "consume", parents=[common], help="print a group's records and ack each one"
    )
    consume.add_argument("stream")
    consume.add_argument("--group", required=True, help="the consumer group")
    consume.add_argument("--consumer", help="this member's name (reclaims its claims on start)")
    consume.add_argument("--count", type=_count, help="stop after N records")
    consume.add_argument("--timeout", type=_seconds, help="stop after S seconds without records")
    consume.add_argument("--max-in-flight", type=_count, default=64, help="default 64")

    token = commands.add_parser("token", parents=[common], help="print a token's claims")
    del token
    return parser


def _group_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    group = commands.add_parser("group", help="consumer-group operations")
    ops = group.add_subparsers(dest="op", required=True)

    def op(name: str, text: str, *, shard: str) -> argparse.ArgumentParser:
        """`shard`: "one" (required: offsets are per shard) or "all" (default every shard)."""
        parser = ops.add_parser(name, parents=[common], help=text)
        parser.add_argument("stream")
        parser.add_argument("group")
        if shard == "one":
            parser.add_argument("--shard", type=int, required=True, help="the records' shard")
        else:
            parser.add_argument("--shard", type=int, help="one shard only (default: every shard)")
        return parser

    poll = op("poll", "claim records and print them (they stay claimed)", shard="all")
    poll.add_argument("--max-records", type=_count, default=10, help="per shard (default 10)")
    poll.add_argument("--wait", type=float, default=0.0, help="long-poll seconds (default 0)")
    poll.add_argument("--consumer", help="member name")
    poll.add_argument("--visibility", type=_seconds, help="seconds the claims stand")
    for name, text in (("ack", "finish claimed records"), ("nack", "hand claimed records back")):
        settle = op(name, text, shard="one")
        settle.add_argument("offsets", type=int, nargs="+", metavar="OFFSET")
        if name == "nack":
            settle.add_argument("--delay", type=float, help="owed again after S seconds")
            settle.add_argument("--attempts", type=int, default=0, help="the delivery handed back")
    op("info", "the group's cursor, tail and counts", shard="all")
    op("dead-letters", "list dead-lettered offsets", shard="all")
    for name, text in (("redrive", "put dead letters back"), ("discard", "drop dead letters")):
        op(name, text, shard="one").add_argument("offsets", type=int, nargs="+", metavar="OFFSET")
    seek = op("seek", "move the group's cursor", shard="all")
    seek.add_argument("--to", dest="start", required=True, help="earliest|latest|OFFSET")
    seek.add_argument("--if-new", action="store_true", help="only where the group has no cursor")
    op("delete", "remove the group's state", shard="all")


# -- output --------------------------------------------------------------------------


def _text(payload: bytes) -> str:
    return payload.decode("utf-8", errors="backslashreplace")


def _emit(args: argparse.Namespace, record: dict[str, Any], line: str) -> None:
    if args.json:
        print(json.dumps(record, separators=(",", ":")), flush=True)
    else:
        print(line, flush=True)


def _payload_fields(payload: bytes) -> dict[str, Any]:
    return {"payload": _text(payload), "payload_base64": base64.b64encode(payload).decode()}


# -- options -------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    path = args.token_file or (Path(p) if (p := _env("FELIX_TOKEN_FILE")) else None)
    if path is not None:
        return Path(path).read_text().strip()
    token = _env("FELIX_TOKEN")
    if token is None:
        raise UsageError("no token: give --token/--token-file or FELIX_TOKEN/FELIX_TOKEN_FILE")
    return token


async def _connect(args: argparse.Namespace) -> Client:
    addrs = args.addr or [a.strip() for a in (_env("FELIX_ADDR") or "").split(",") if a.strip()]
    if not addrs:
        raise UsageError("no broker address: give --addr or FELIX_ADDR")
    for addr in addrs:
        try:
            parse_addr(addr)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    tenant = args.tenant or _env("FELIX_TENANT")
    if not tenant:
        raise UsageError("no tenant: give --tenant or FELIX_TENANT")
    ca_file = args.ca_file or _env("FELIX_CA_FILE")
    if ca_file is not None and not Path(ca_file).is_file():
        raise UsageError(f"no CA certificate at {ca_file}")
    return await connect(
        addrs,
        tenant_id=tenant,
        token=_token(args),
        namespace=args.namespace or _env("FELIX_NAMESPACE") or "default",
        server_name=args.server_name,
        ca_file=ca_file,
        offer_alpn=args.offer_alpn,
        config=ClientConfig(connect_timeout=args.connect_timeout),
    )


def _start(text: str) -> Start:
    if text in ("latest", "earliest"):
        return "latest" if text == "latest" else "earliest"
    if text.isdigit():
        return int(text)
    raise UsageError(f"--from must be latest, earliest or an offset, not {text!r}")


# -- commands ------------------------------------------------------------------------


async def _publish(client: Client, args: argparse.Namespace) -> None:
    messages = [m.encode() for m in args.messages] or [
        line.rstrip("\n").encode() for line in sys.stdin
    ]
    key = args.key.encode() if args.key is not None else None
    if args.batch and messages:
        offset = await client.publish_batch(
            args.stream, messages, key=key, ack="per_batch" if args.ack != "none" else "none"
        )
        _emit(
            args, {"published": len(messages), "offset": offset}, _published(len(messages), offset)
        )
        return
    for message in messages:
        offset = await client.publish(args.stream, message, key=key, ack=args.ack)
        _emit(args, {"published": 1, "offset": offset}, _published(1, offset))


def _published(count: int, offset: int | None) -> str:
    where = f" at offset {offset}" if offset is not None else ""
    return f"published {count} record(s){where}"


async def _subscribe(client: Client, args: argparse.Namespace) -> None:
    seen = 0
    start = _start(args.start)
    sub: Subscription | StreamSubscription = (
        client.subscribe(args.stream, start=start)
        if args.shard is None
        else client.subscribe(args.stream, start=start, shard=args.shard)
    )
    async with sub:
        while args.count is None or seen < args.count:
            try:
                event = await sub.next(timeout=args.timeout)
            except (StopAsyncIteration, TimeoutError):
                return
            except ShardLostError as lost:
                await _recover(sub, lost)
                continue
            seen += 1
            record = {
                "offset": event.offset,
                "shard": event.shard,
                "timestamp_micros": event.timestamp_micros,
                "publisher": event.publisher,
                "dropped_before": event.dropped_before,
                **_payload_fields(event.payload),
            }
            offset = "-" if event.offset is None else str(event.offset)
            gap = f" (after a gap of {event.dropped_before})" if event.dropped_before else ""
            _emit(args, record, f"[{event.shard}:{offset}] {_text(event.payload)}{gap}")


async def _recover(feed: object, lost: ShardLostError) -> None:
    """Say that a shard was lost, and open it again from where it stopped (once;
    the other shards keep going either way)."""
    print(f"felix: {lost}", file=sys.stderr, flush=True)
    if not isinstance(feed, ShardedFeed):
        return  # only feeds of several shards lose one of them
    await asyncio.sleep(0.5)
    try:
        await feed.recover(lost.shard)
    except (BrokerError, ClientError) as exc:
        print(f"felix: shard {lost.shard} stays lost: {exc}", file=sys.stderr, flush=True)
    else:
        print(f"felix: shard {lost.shard} recovered", file=sys.stderr, flush=True)


async def _read(client: Client, args: argparse.Namespace) -> None:
    pages = client.stream_read(
        args.stream, start=args.start, end=args.end, shard=args.shard, max_records=args.max_records
    )
    async for page in pages:
        for r in page.records:
            record = {
                "offset": r.offset,
                "shard": r.shard,
                "timestamp_micros": r.timestamp_micros,
                "publisher": r.publisher,
                **_payload_fields(r.payload),
            }
            _emit(args, record, f"[{r.shard}:{r.offset}] {_text(r.payload)}")


async def _cache(client: Client, args: argparse.Namespace) -> None:
    cache = client.cache(args.cache)
    if args.op == "get":
        entry = await cache.get_entry(args.key)
        if entry is None:
            _emit(args, {"key": args.key, "value": None}, f"{args.key}: (none)")
        else:
            record = {"key": args.key, "version": entry.version, **_payload_fields(entry.value)}
            _emit(args, record, f"{args.key}: {_text(entry.value)}")
    elif args.op == "put":
        await cache.put(args.key, args.value.encode(), ttl=args.ttl)
        _emit(args, {"key": args.key, "stored": True}, f"{args.key}: stored")
    elif args.op == "delete":
        removed = await cache.delete(args.key)
        record = {"key": args.key, "removed": removed is not None}
        _emit(args, record, f"{args.key}: {'deleted' if removed is not None else 'was not there'}")
    else:
        await _watch(client, args)


async def _watch(client: Client, args: argparse.Namespace) -> None:
    cache = client.cache(args.cache)
    feed: CacheWatchFeed | ShardedCacheWatch = (
        cache.watch(key=args.key, retained=args.retained)
        if args.key is not None
        else cache.watch(prefix=args.prefix, retained=args.retained)
        if args.shard is None
        else cache.watch(prefix=args.prefix, shard=args.shard, retained=args.retained)
    )
    seen = 0
    async with feed:
        while args.count is None or seen < args.count:
            try:
                change = await feed.next(timeout=args.timeout)
            except (StopAsyncIteration, TimeoutError):
                return
            except ShardLostError as lost:
                await _recover(feed, lost)
                continue
            seen += 1
            fields = _payload_fields(change.value) if change.value is not None else {"value": None}
            record = {"key": change.key, "offset": change.offset, **fields}
            shown = "(deleted)" if change.value is None else _text(change.value)
            _emit(args, record, f"[{change.offset}] {change.key}: {shown}")


def _token_command(args: argparse.Namespace) -> None:
    token = _token(args)
    try:
        header = jwt.get_unverified_header(token)
        # Shown, not trusted: the broker verifies the signature, this only reads.
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise UsageError(f"not a token: {exc}") from None
    if args.json:
        print(json.dumps({"header": header, "claims": claims}, sort_keys=True))
        return
    for name, value in sorted(header.items()):
        print(f"header.{name}: {value}")
    for name, value in sorted(claims.items()):
        if name in _TIME_CLAIMS and isinstance(value, int | float):
            when = datetime.fromtimestamp(value, UTC).isoformat()
            print(f"{name}: {value} ({when})")
        elif isinstance(value, list):
            print(f"{name}: {', '.join(str(v) for v in value)}")
        else:
            print(f"{name}: {value}")


async def _counter(client: Client, args: argparse.Namespace) -> None:
    cache = client.cache(args.cache)
    if args.op == "add":
        value: int | None = await cache.counter_add(args.key, args.delta)
    else:
        value = await cache.counter_get(args.key)
    shown = "(none)" if value is None else str(value)
    _emit(args, {"key": args.key, "value": value}, f"{args.key}: {shown}")


async def _shards(client: Client, args: argparse.Namespace) -> list[int]:
    if args.shard is not None:
        return [args.shard]
    return list(range(max(1, await client.stream_shards(args.stream))))


def _claimed(args: argparse.Namespace, record: ClaimedRecord | ConsumerRecord) -> None:
    claimed = record.record if isinstance(record, ConsumerRecord) else record
    fields = {
        "shard": claimed.shard,
        "offset": claimed.offset,
        "attempts": claimed.attempts,
        "timestamp_micros": claimed.timestamp_micros,
        "publisher": claimed.publisher,
        **_payload_fields(claimed.payload),
    }
    line = f"[{claimed.shard}:{claimed.offset}] {_text(claimed.payload)}"
    _emit(args, fields, line + (f" (attempt {claimed.attempts})" if claimed.attempts > 1 else ""))


async def _group(client: Client, args: argparse.Namespace) -> None:
    group = client.group(args.stream, args.group)
    await _GROUP_OPS[args.op](client, group, args)


async def _group_poll(client: Client, group: Group, args: argparse.Namespace) -> None:
    async def one(shard: int) -> list[ClaimedRecord]:
        return await group.poll(
            shard,
            max_records=args.max_records,
            wait=args.wait,
            consumer=args.consumer,
            visibility=args.visibility,
        )

    for records in await asyncio.gather(*(one(s) for s in await _shards(client, args))):
        for record in records:
            _claimed(args, record)


async def _group_settle(client: Client, group: Group, args: argparse.Namespace) -> None:
    for offset in args.offsets:
        if args.op == "ack":
            await group.ack(args.shard, offset)
        elif args.op == "nack":
            await group.nack(args.shard, offset, delay=args.delay, attempts=args.attempts)
        elif args.op == "redrive":
            await group.redrive(args.shard, offset)
        else:
            await group.discard(args.shard, offset)
        done = {"ack": "acked", "nack": "nacked", "redrive": "redriven", "discard": "discarded"}
        record = {"shard": args.shard, "offset": offset, args.op: True}
        _emit(args, record, f"[{args.shard}:{offset}] {done[args.op]}")


async def _group_info(client: Client, group: Group, args: argparse.Namespace) -> None:
    for shard in await _shards(client, args):
        state = await group.describe(shard)
        record = {"shard": shard, **dataclasses.asdict(state)}
        committed = "none" if state.committed is None else str(state.committed)
        _emit(
            args,
            record,
            f"shard {shard}: committed {committed}, tail {state.tail}, in flight "
            f"{state.in_flight}, owed {state.owed}, dead letters {state.dead_letters}",
        )


async def _group_dead_letters(client: Client, group: Group, args: argparse.Namespace) -> None:
    for shard in await _shards(client, args):
        offsets = await group.dead_letters(shard)
        shown = ", ".join(map(str, offsets)) or "none"
        _emit(args, {"shard": shard, "offsets": offsets}, f"shard {shard}: {shown}")


async def _group_seek(client: Client, group: Group, args: argparse.Namespace) -> None:
    start = _start(args.start)
    for shard in await _shards(client, args):
        result = await group.seek(shard, start, if_new=args.if_new)
        record = {"shard": shard, "offset": result.offset, "moved": result.moved}
        verb = "moved to" if result.moved else "stays at"
        _emit(args, record, f"shard {shard}: {verb} {result.offset}")


async def _group_delete(client: Client, group: Group, args: argparse.Namespace) -> None:
    for shard in await _shards(client, args):
        existed = await group.delete(shard)
        what = "deleted" if existed else "had no state"
        _emit(args, {"shard": shard, "existed": existed}, f"shard {shard}: {what}")


_GROUP_OPS: dict[str, Callable[[Client, Group, argparse.Namespace], Awaitable[None]]] = {
    "poll": _group_poll,
    "ack": _group_settle,
    "nack": _group_settle,
    "redrive": _group_settle,
    "discard": _group_settle,
    "info": _group_info,
    "dead-letters": _group_dead_letters,
    "seek": _group_seek,
    "delete": _group_delete,
}


async def _consume(client: Client, args: argparse.Namespace) -> None:
    seen = 0
    consumer = client.consumer(
        args.stream,
        group=args.group,
        consumer=args.consumer,
        # Never claim more than --count: what is claimed and not shown is handed back.
        max_in_flight=min(args.max_in_flight, args.count or args.max_in_flight),
        wait=min(1.0, args.timeout) if args.timeout else 1.0,
    )
    async with consumer:
        while args.count is None or seen < args.count:
            try:
                record = await consumer.next(timeout=args.timeout)
            except (StopAsyncIteration, TimeoutError):
                return
            _claimed(args, record)  # printed first: a record is acked once it was shown
            await record.ack()
            seen += 1


_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], Awaitable[None]]] = {
    "publish": _publish,
    "subscribe": _subscribe,
    "read": _read,
    "cache": _cache,
    "counter": _counter,
    "group": _group,
    "consume": _consume,
}


async def _run(args: argparse.Namespace) -> None:
    client = await _connect(args)
    async with client:
        await _COMMANDS[args.command](client, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # usage errors: one line and status 2 (argparse)
    try:
        if args.command == "token":
            _token_command(args)
        else:
            asyncio.run(_run(args))
    except UsageError as exc:
        print(f"felix: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`felix subscribe | head -1`): say so once, and keep
        # the interpreter's final flush from failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        print("felix: output closed by the reader", file=sys.stderr)
        return 1
    except (BrokerError, ClientError, OSError) as exc:
        print(f"felix: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
