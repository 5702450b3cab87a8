"""The control plane's fleet routes: fleet features and the fleet's members.

Served on the **admin listener** (loopback only, the bootstrap secret as bearer):
a fleet feature is a switch for every tenant's data at once, so no tenant's
token may flip it. Every answer is read from the fleet's etcd (``--etcd-endpoints``);
a control plane without one has no fleet and answers 409 ``no_fleet``.

=============================================  ==========================================
``GET  /v1/fleet/features``                    per feature: which live brokers implement
                                               it, which lack it, finalized or not; and
                                               ``supported`` (every live broker has it),
                                               ``enabled`` (finalized), ``serving_nodes``
``POST /v1/fleet/features/{name}/finalize``    finalize (one-way); ``?dry_run=true`` only
                                               says what would happen
``GET  /v1/fleet/members``                     live members and their addresses
=============================================  ==========================================

Finalizing writes ``P/features/{name}`` (`FinalizedFeature`) in one transaction
that compares the key's ``create_revision == 0`` and every live member key's
``mod_revision`` with the one checked, so a broker that re-registered in between
(perhaps without the feature) makes the write fail and the check run again
(bounded). A broker registering for the first time in that window is not seen by
the compare; it finds the feature finalized when it reads the fleet and logs
that it lacks it. Refusals:

- 409 ``no_fleet``: no etcd (``--store sqlite`` without ``--etcd-endpoints``);
- 409 ``no_live_brokers``: nobody to check the feature against;
- 409 ``not_supported``: some live broker does not implement it (``lacking``);
- 409 ``conflict``: members kept changing for every bounded attempt.

Finalizing an already finalized feature answers 200 with ``already: true``.
Once finalized, a broker without the feature refuses to join.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from felix_common.etcd import Compare, EtcdClient, EtcdUnavailableError, Put
from felix_common.fleet import (
    FinalizedFeature,
    Keyspace,
    Member,
    RecordError,
    decode_finalized_feature,
    decode_member,
    encode_record,
)
from felix_controlplane.http import Request, Response, error
from felix_controlplane.model import ApiError

__all__ = ["FEATURE_NAME", "FleetRoutes"]

_log = logging.getLogger(__name__)

FEATURE_NAME = r"([a-z][a-z0-9_]{0,63})"
# Attempts at the finalize transaction while members change under it.
_FINALIZE_ATTEMPTS = 5

Route = Callable[[Request, dict[str, str]], Awaitable[Response]]


class FleetRoutes:
    """The fleet routes over the fleet's etcd (`client` None: no fleet)."""

    def __init__(self, client: EtcdClient | None, keys: Keyspace, holder: str) -> None:
        self._client = client
        self._keys = keys
        self._holder = holder

    def routes(self) -> list[tuple[str, re.Pattern[str], Route]]:
        """The admin listener's table entries for these routes."""
        return [
            ("GET", re.compile(r"^/v1/fleet/features$"), self._list),
            ("POST", re.compile(rf"^/v1/fleet/features/{FEATURE_NAME}/finalize$"), self._finalize),
            ("GET", re.compile(r"^/v1/fleet/members$"), self._members),
        ]

    # -- reads ----------------------------------------------------------------------------

    def _etcd(self) -> EtcdClient:
        if self._client is None:
            raise ApiError(
                409,
                "no_fleet",
                "this control plane runs without a fleet (no --etcd-endpoints): there are "
                "no brokers' fleet features to list or finalize",
            )
        return self._client

    async def _read(self) -> tuple[dict[str, tuple[Member, int]], dict[str, FinalizedFeature]]:
        """Live members (with their keys' mod_revision) and finalized features."""
        client, keys = self._etcd(), self._keys
        try:
            _, member_kvs = await client.get_prefix(keys.members)
            _, feature_kvs = await client.get_prefix(keys.features)
        except EtcdUnavailableError as exc:
            raise ApiError(
                503, "unavailable", f"the fleet's etcd cannot be reached: {exc}"
            ) from None
        members: dict[str, tuple[Member, int]] = {}
        for kv in member_kvs:
            try:
                member = decode_member(kv.value)
            except RecordError as exc:
                _log.warning("ignoring %s: %s", kv.key, exc)
                continue
            members[member.node_id] = (member, kv.mod_revision)
        finalized: dict[str, FinalizedFeature] = {}
        for kv in feature_kvs:
            try:
                record = decode_finalized_feature(kv.value)
            except RecordError as exc:
                _log.warning("ignoring %s: %s", kv.key, exc)
                continue
            finalized[record.name] = record
        return members, finalized

    @staticmethod
    def _overview(
        members: dict[str, tuple[Member, int]], finalized: dict[str, FinalizedFeature]
    ) -> dict[str, Any]:
        nodes = sorted(members)
        names = sorted({f for m, _ in members.values() for f in m.features} | set(finalized))
        features = []
        for name in names:
            having = [n for n in nodes if name in members[n][0].features]
            entry: dict[str, Any] = {
                "name": name,
                "implemented_by": having,
                "lacking": [n for n in nodes if n not in having],
                "finalized": name in finalized,
            }
            if name in finalized:
                entry["finalized_at_ms"] = finalized[name].finalized_at_ms
            features.append(entry)
        supported = [f["name"] for f in features if nodes and not f["lacking"]]
        return {
            "supported": supported,
            "enabled": sorted(finalized),
            "serving_nodes": nodes,
            "features": features,
        }

    async def _list(self, request: Request, g: dict[str, str]) -> Response:
        members, finalized = await self._read()
        return Response(200, self._overview(members, finalized))

    async def _members(self, request: Request, g: dict[str, str]) -> Response:
        members, _ = await self._read()
        items = []
        for node_id in sorted(members):
            member = members[node_id][0]
            item: dict[str, Any] = {
                "node_id": node_id,
                "client_addr": member.client_addr,
                "peer_addr": member.peer_addr,
                "features": sorted(member.features),
                "incarnation": member.incarnation,
            }
            if member.ops_addr:
                item["ops_addr"] = member.ops_addr
            items.append(item)
        return Response(200, {"items": items})

    # -- finalize -------------------------------------------------------------------------

    async def _finalize(self, request: Request, g: dict[str, str]) -> Response:
        name = g["0"]
        dry_run_text = request.query.get("dry_run", "false")
        if dry_run_text not in ("true", "false"):
            raise ApiError(400, "bad_request", "dry_run: expected true or false")
        dry_run = dry_run_text == "true"
        client, keys = self._etcd(), self._keys
        for _ in range(_FINALIZE_ATTEMPTS):
            members, finalized = await self._read()
            nodes = sorted(members)
            lacking = [n for n in nodes if name not in members[n][0].features]
            answer: dict[str, Any] = {"feature": name, "serving_nodes": nodes, "lacking": lacking}
            if name in finalized:
                return Response(
                    200, answer | {"enabled": True, "already": True, "dry_run": dry_run}
                )
            if not nodes:
                return Response(
                    409,
                    answer
                    | {
                        "error": "no_live_brokers",
                        "message": f"no live broker to check {name} against",
                    },
                )
            if dry_run:
                return Response(
                    200, answer | {"dry_run": True, "enabled": False, "would_enable": not lacking}
                )
            if lacking:
                return Response(
                    409,
                    answer
                    | {
                        "error": "not_supported",
                        "message": f"{name} is not implemented by {', '.join(lacking)}",
                    },
                )
            record = FinalizedFeature(
                name=name,
                finalized_at_ms=int(time.time() * 1000),
                by=self._holder,
                members=nodes,
            )
            compares = [Compare(keys.feature(name), "create_revision", "==", 0)]
            compares += [
                Compare(keys.member(n), "mod_revision", "==", members[n][1]) for n in nodes
            ]
            try:
                ok, _ = await client.txn(compares, [Put(keys.feature(name), encode_record(record))])
            except EtcdUnavailableError as exc:
                raise ApiError(
                    503, "unavailable", f"the fleet's etcd cannot be reached: {exc}"
                ) from None
            if ok:
                _log.info("fleet feature %s finalized (members %s)", name, ", ".join(nodes))
                return Response(200, answer | {"enabled": True, "already": False, "dry_run": False})
            # A member changed, or another instance finalized it: look again.
        return error(409, "conflict", f"the fleet's members kept changing while finalizing {name}")
