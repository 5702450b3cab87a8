"""``felix-controlplane admin backup-point``: one consistent backup point of a fleet.

Reads the fleet's members (from its etcd, ``--etcd-endpoints``, or from a control
plane's admin listener, ``--admin-url`` with the bootstrap secret), asks every
member's ops listener for ``GET /backup/offsets``, and accepts the collection
only when it is one point:

- the members (node ids and incarnations) are the same before and after it;
- with etcd, every assignment's leader and generation are the same before and
  after it, and every ``active`` shard is reported by its leader at exactly that
  generation;
- no shard is reported by two brokers, and no broker skipped a shard for a
  reason worth asking again (``settling``, ``refused``, ``moved``, ``error``).

Otherwise it collects again, up to ``--attempts`` whole collections (default 5),
``--retry-delay`` apart. The point goes to stdout as JSON::

    {"attempts": 1, "collected_at_ms": ..., "members": [...],
     "shards": [{tenant_id, namespace, name, shard, kind, node_id, generation, logs}],
     "not_durable": [{tenant_id, namespace, name, shard, kind, node_id}]}

A failure is one JSON line on stderr (``{"error": code, "message": ...}``) and an
exit code:

====  ======================  ====================================================
0     (a point)
2     (usage)                 a bad option (argparse)
3     ``broker_unreachable``  a member's ops listener did not answer (or the
                              member registered none: FELIX_OPS_ADVERTISE_ADDR)
4     ``not_consistent``      leaders or generations kept changing, or shards
                              stayed skipped, for every attempt
5     ``fleet_unreachable``   the fleet's etcd or the control plane did not answer
6     ``bad_answer``          a broker's or the control plane's answer was not
                              what this tool reads
====  ======================  ====================================================

The point is not a cross-shard snapshot: brokers are read one after another
with no write pause (as upstream's), so each shard's offsets are a committed
prefix at that shard's own instant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from felix_common.etcd import EtcdClient, EtcdUnavailableError, parse_endpoints
from felix_common.fleet import Keyspace, RecordError, decode_assignment, decode_member

__all__ = ["BackupPointError", "build_parser", "collect", "main"]

RETRYABLE = frozenset({"settling", "refused", "moved", "error"})

EXIT_BROKER_UNREACHABLE = 3
EXIT_NOT_CONSISTENT = 4
EXIT_FLEET_UNREACHABLE = 5
EXIT_BAD_ANSWER = 6


class BackupPointError(Exception):
    """A typed failure: its `code` and `exit_code`."""

    def __init__(self, code: str, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class MemberInfo:
    node_id: str
    incarnation: int
    ops_addr: str


# (kind, tenant, namespace, name, shard)
ShardKey = tuple[str, str, str, str, int]


Assignments = dict[ShardKey, tuple[str | None, int, str]]


class _Source(Protocol):
    """Where the members (and, with etcd, the assignments) come from."""

    async def members(self) -> dict[str, MemberInfo]: ...

    async def assignments(self) -> Assignments | None:
        """Per shard (leader, generation, state); None when the source has none."""
        ...

    async def close(self) -> None: ...


class _EtcdSource:
    def __init__(self, endpoints: list[tuple[str, int]], prefix: str, timeout: float) -> None:
        self._client = EtcdClient(endpoints, timeout_s=timeout)
        self._keys = Keyspace(prefix)

    async def members(self) -> dict[str, MemberInfo]:
        try:
            _, kvs = await self._client.get_prefix(self._keys.members)
        except EtcdUnavailableError as exc:
            raise BackupPointError(
                "fleet_unreachable", EXIT_FLEET_UNREACHABLE, f"etcd: {exc}"
            ) from None
        found: dict[str, MemberInfo] = {}
        for kv in kvs:
            try:
                record = decode_member(kv.value)
            except RecordError:
                continue
            found[record.node_id] = MemberInfo(
                record.node_id, record.incarnation, record.ops_addr or ""
            )
        return found

    async def assignments(self) -> dict[ShardKey, tuple[str | None, int, str]]:
        try:
            _, kvs = await self._client.get_prefix(self._keys.assignments)
        except EtcdUnavailableError as exc:
            raise BackupPointError(
                "fleet_unreachable", EXIT_FLEET_UNREACHABLE, f"etcd: {exc}"
            ) from None
        found: dict[ShardKey, tuple[str | None, int, str]] = {}
        for kv in kvs:
            try:
                shard = self._keys.shard_of(kv.key)
                record = decode_assignment(kv.value)
            except RecordError:
                continue
            key = (shard.kind.value, shard.tenant, shard.namespace, shard.name, shard.shard)
            found[key] = (record.leader, kv.mod_revision, str(record.state))
        return found

    async def close(self) -> None:
        await self._client.close()


class _ControlPlaneSource:
    def __init__(self, session: aiohttp.ClientSession, url: str, secret: str) -> None:
        self._session = session
        self._url = url.rstrip("/") + "/v1/fleet/members"
        self._headers = {"Authorization": f"Bearer {secret}"}

    async def assignments(self) -> Assignments | None:
        return None  # the control plane's API lists members only

    async def close(self) -> None:
        return None  # the session is the caller's

    async def members(self) -> dict[str, MemberInfo]:
        try:
            async with self._session.get(self._url, headers=self._headers) as response:
                body = await response.json(content_type=None)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackupPointError(
                "fleet_unreachable", EXIT_FLEET_UNREACHABLE, f"control plane {self._url}: {exc}"
            ) from None
        except ValueError:
            raise BackupPointError(
                "bad_answer", EXIT_BAD_ANSWER, f"control plane {self._url}: not JSON"
            ) from None
        if status != 200:
            message = body.get("message") if isinstance(body, dict) else body
            raise BackupPointError(
                "fleet_unreachable",
                EXIT_FLEET_UNREACHABLE,
                f"control plane {self._url} answered {status}: {message}",
            )
        try:
            return {
                item["node_id"]: MemberInfo(
                    item["node_id"], int(item["incarnation"]), item.get("ops_addr", "")
                )
                for item in body["items"]
            }
        except (KeyError, TypeError, ValueError):
            raise BackupPointError(
                "bad_answer", EXIT_BAD_ANSWER, f"control plane {self._url}: unexpected members"
            ) from None


async def _offsets(session: aiohttp.ClientSession, member: MemberInfo) -> dict[str, Any]:
    if not member.ops_addr:
        raise BackupPointError(
            "broker_unreachable",
            EXIT_BROKER_UNREACHABLE,
            f"broker {member.node_id} registered no ops address "
            "(set its FELIX_OPS_ADVERTISE_ADDR, or bind metrics_bind to a specific host)",
        )
    url = f"http://{member.ops_addr}/backup/offsets"
    try:
        async with session.get(url) as response:
            status = response.status
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BackupPointError(
            "broker_unreachable",
            EXIT_BROKER_UNREACHABLE,
            f"broker {member.node_id} at {url}: {exc or type(exc).__name__}",
        ) from None
    except ValueError:
        raise BackupPointError(
            "bad_answer", EXIT_BAD_ANSWER, f"broker {member.node_id} at {url}: not JSON"
        ) from None
    if (
        status != 200
        or not isinstance(body, dict)
        or not isinstance(body.get("shards"), list)
        or not isinstance(body.get("skipped"), list)
    ):
        raise BackupPointError(
            "bad_answer",
            EXIT_BAD_ANSWER,
            f"broker {member.node_id} at {url} answered {status} without a backup-offsets body",
        )
    if body.get("node_id") != member.node_id:
        raise BackupPointError(
            "bad_answer",
            EXIT_BAD_ANSWER,
            f"{url} answered as {body.get('node_id')!r}, registered as {member.node_id!r}",
        )
    return body


def _key(entry: dict[str, Any]) -> ShardKey:
    return (
        str(entry["kind"]),
        str(entry["tenant_id"]),
        str(entry["namespace"]),
        str(entry["name"]),
        int(entry["shard"]),
    )


def _judge(
    members: dict[str, MemberInfo],
    answers: dict[str, dict[str, Any]],
    assignments: dict[ShardKey, tuple[str | None, int, str]] | None,
) -> tuple[dict[str, Any] | None, str]:
    """The point, or None and why it is not one."""
    shards: dict[ShardKey, dict[str, Any]] = {}
    not_durable: list[dict[str, Any]] = []
    for node_id, answer in sorted(answers.items()):
        try:
            for entry in answer["shards"]:
                key = _key(entry)
                if key in shards:
                    other = shards[key]["node_id"]
                    return None, f"{key} reported by both {other} and {node_id}"
                shards[key] = dict(entry) | {"node_id": node_id}
            for entry in answer["skipped"]:
                reason = entry.get("reason")
                if reason in RETRYABLE:
                    detail = entry.get("detail", "")
                    return None, f"{node_id} skipped {_key(entry)}: {reason} {detail}".rstrip()
                not_durable.append(dict(entry) | {"node_id": node_id})
        except (KeyError, TypeError, ValueError) as exc:
            raise BackupPointError(
                "bad_answer", EXIT_BAD_ANSWER, f"broker {node_id}: malformed entry ({exc})"
            ) from None
    if assignments is not None:
        for key, (leader, generation, state) in sorted(assignments.items()):
            if state != "active" or leader is None or leader not in members:
                continue
            reported = shards.get(key)
            durable_elsewhere = any(_key(e) == key for e in not_durable)
            if reported is None:
                if durable_elsewhere:
                    continue
                return None, f"{key}: its leader {leader} did not report it"
            if reported["node_id"] != leader or int(reported["generation"]) != generation:
                return None, (
                    f"{key}: reported by {reported['node_id']} at generation "
                    f"{reported['generation']}, assigned to {leader} at {generation}"
                )
    point = {
        "members": [
            {"node_id": m.node_id, "incarnation": m.incarnation, "ops_addr": m.ops_addr}
            for _, m in sorted(members.items())
        ],
        "shards": [shards[k] for k in sorted(shards)],
        "not_durable": sorted(not_durable, key=_key),
    }
    return point, ""


async def collect(
    source: _Source,
    session: aiohttp.ClientSession,
    *,
    attempts: int = 5,
    retry_delay: float = 0.5,
) -> dict[str, Any]:
    """One consistent point, or BackupPointError after `attempts` whole collections."""
    why = "no attempt made"
    last_error: BackupPointError | None = None
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            await asyncio.sleep(retry_delay)
        before = await source.members()
        if not before:
            raise BackupPointError(
                "fleet_unreachable", EXIT_FLEET_UNREACHABLE, "the fleet has no live member"
            )
        assigned = await source.assignments()
        try:
            answers = {
                node_id: await _offsets(session, member)
                for node_id, member in sorted(before.items())
            }
        except BackupPointError as exc:
            if exc.exit_code != EXIT_BROKER_UNREACHABLE:
                raise
            # A member that went away meanwhile is a changed fleet: ask again.
            last_error, why = exc, str(exc)
            continue
        last_error = None
        after = await source.members()
        if {k: m.incarnation for k, m in after.items()} != {
            k: m.incarnation for k, m in before.items()
        }:
            why = "the fleet's members changed during the collection"
            continue
        if assigned is not None and await source.assignments() != assigned:
            why = "leaders or generations changed during the collection"
            continue
        point, why = _judge(before, answers, assigned)
        if point is not None:
            return {"attempts": attempt, "collected_at_ms": int(time.time() * 1000)} | point
    if last_error is not None:
        raise last_error
    raise BackupPointError(
        "not_consistent",
        EXIT_NOT_CONSISTENT,
        f"no consistent point after {attempts} attempts: {why}",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="felix-controlplane admin backup-point",
        description="Collect one consistent backup point (every shard leader's committed "
        "offsets) from a fleet's brokers and print it as JSON.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--etcd-endpoints",
        metavar="HOST:PORT[,...]",
        help="read members and assignments from the fleet's etcd",
    )
    where.add_argument(
        "--admin-url",
        metavar="URL",
        help="read members from a control plane's admin listener (GET /v1/fleet/members)",
    )
    parser.add_argument(
        "--etcd-prefix", default="/felix", help="the fleet's etcd prefix (default: %(default)s)"
    )
    parser.add_argument(
        "--bootstrap-secret-file",
        type=Path,
        metavar="FILE",
        help="the admin listener's bearer secret (with --admin-url; default: "
        "$FELIX_CONTROLPLANE_BOOTSTRAP_SECRET)",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=5,
        help="whole collections before giving up (default: %(default)s)",
    )
    parser.add_argument(
        "--retry-delay",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="pause between collections (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="bound of each HTTP or etcd call (default: %(default)s)",
    )
    return parser


async def _run(args: argparse.Namespace, secret: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        source: _Source
        if args.etcd_endpoints:
            source = _EtcdSource(
                parse_endpoints(args.etcd_endpoints), args.etcd_prefix, args.timeout
            )
        else:
            source = _ControlPlaneSource(session, args.admin_url, secret)
        try:
            return await collect(
                source, session, attempts=args.attempts, retry_delay=args.retry_delay
            )
        finally:
            await source.close()


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.attempts <= 100:
        parser.error("--attempts must be between 1 and 100")
    if args.etcd_endpoints:
        try:
            parse_endpoints(args.etcd_endpoints)
        except ValueError as exc:
            parser.error(f"--etcd-endpoints: {exc}")
    secret = ""
    if args.admin_url:
        if args.bootstrap_secret_file is not None:
            try:
                secret = args.bootstrap_secret_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                parser.error(f"--bootstrap-secret-file: {exc}")
        else:
            secret = os.environ.get("FELIX_CONTROLPLANE_BOOTSTRAP_SECRET", "")
        if not secret:
            parser.error(
                "--admin-url needs the bootstrap secret: --bootstrap-secret-file or "
                "FELIX_CONTROLPLANE_BOOTSTRAP_SECRET"
            )
    try:
        point = asyncio.run(_run(args, secret))
    except BackupPointError as exc:
        print(json.dumps({"error": exc.code, "message": str(exc)}), file=sys.stderr)
        return exc.exit_code
    print(json.dumps(point, indent=2))
    return 0
