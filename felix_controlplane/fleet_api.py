"""The operator's fleet commands on the control plane's admin listener.

Served only by an instance that runs the placer (``--etcd-endpoints``); an instance
that does not hold placement now answers 503 ``not_placer`` (ask the other one).
Loopback only and behind the bootstrap secret, like the rest of the admin listener.

- ``POST /v1/fleet/moves`` ``{"kind": "stream"|"cache", "tenant", "namespace",
  "name", "shard", "to"}``: move one shard to the broker ``to``. 202
  ``{"generation"}`` (the catch-up's: the old leader copies the shard while it still
  takes writes; the fence follows once ``to`` holds that copy, the cut-over once it
  holds the last delta). 409 ``already_moving``, or ``move_limit`` when ``max_moves``
  copies are in progress (``felix-controlplane --max-moves``).
- ``GET /v1/fleet/moves``: ``{"items", "queued", "max_moves"}``: the moves and fences
  in progress, as etcd has them (``phase`` ``catching_up``: copied while its leader
  still takes writes; ``fenced``: writes held for the last delta; ``fence``: a fence
  without a successor), and the shards a drain will move that wait for one of the
  ``max_moves`` slots (``felix-controlplane --max-moves``), each with its ``leader``.
- ``DELETE /v1/fleet/moves/{kind}/{tenant}/{namespace}/{name}/{shard}``: cancel a
  move before its cut-over (the old leader serves again, at a new generation):
  200 ``{"generation", "outcome"}``, ``cancel`` during the catch-up (nothing was
  held), ``retake`` after the fence (readers ended with shard_moved are sent back
  to the old leader by ``not_leader``); 409 when the shard is not moving (cut over
  already, or never moved).
- ``POST /v1/fleet/fences`` ``{"kind", "tenant", "namespace", "name", "shard"}``:
  fence a shard as a move does, with no successor (writes held then refused,
  readers ended) until cancelled with the DELETE above. 200 ``{"node_id",
  "generation"}`` of its leader.
- ``POST /v1/fleet/drains/{node_id}``: drain a broker (every shard it leads moves
  elsewhere, nothing new is placed on it). 202 ``{"node_id", "skipped"}``:
  ``skipped`` lists the replicated shards it leads that no live replica can take now
  (``kind``, ``tenant``, ``namespace``, ``name``, ``shard``, ``reason``); the drain
  leaves those where they are (logged) until enough of the replica set is live.
- A replicated (Quorum) shard moves only by promotion to a member of its replica
  set: ``POST /v1/fleet/moves`` to another broker is 409 ``replicated``.
- ``DELETE /v1/fleet/drains/{node_id}``: stop draining it (moves already fenced go
  on). 200, or 404 when it was not draining.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from felix_common.fleet import ShardId, ShardKind
from felix_controlplane.http import BadJson, Request, Response
from felix_controlplane.model import ApiError

if TYPE_CHECKING:
    from felix_controlplane.placement import Placer

__all__ = ["DEFAULT_MAX_MOVES", "FleetApi", "MoveError"]

# At most this many shard copies in progress at once (felix-controlplane --max-moves).
DEFAULT_MAX_MOVES = 2

_NAME = r"([A-Za-z0-9_.-]{1,128})"
SHARD_PATH = rf"(stream|cache)/{_NAME}/{_NAME}/{_NAME}/([0-9]{{1,9}})"


class MoveError(Exception):
    """A move, drain, fence or cancel that cannot be done: `status` is the HTTP
    status the control plane answers (404 no such shard or broker, 409 conflict,
    503 this instance does not hold placement)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _json(request: Request) -> Any:
    try:
        return request.json()
    except BadJson as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def _shard(body: Any) -> ShardId:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    try:
        kind = ShardKind(body["kind"])
        tenant, namespace, name = str(body["tenant"]), str(body["namespace"]), str(body["name"])
        index = body["shard"]
    except KeyError as exc:
        raise ApiError(400, "invalid_request", f"missing field {exc.args[0]!r}") from None
    except ValueError:
        raise ApiError(400, "invalid_request", "kind must be stream or cache") from None
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ApiError(400, "invalid_request", "shard must be a non-negative integer")
    return ShardId(kind, tenant, namespace, name, index)


def _shard_json(shard: ShardId) -> dict[str, Any]:
    return {
        "kind": shard.kind.value,
        "tenant": shard.tenant,
        "namespace": shard.namespace,
        "name": shard.name,
        "shard": shard.shard,
    }


def _phase(state: object, leader: str | None, successor: str | None) -> str:
    if successor is not None and successor == leader:
        return "fence"
    return "catching_up" if str(state) == "active" else "fenced"


class FleetApi:
    """Route handlers over the placer this instance runs (None: no placer here)."""

    def __init__(self, placer: Callable[[], Placer | None]) -> None:
        self._placer = placer

    def routes(self) -> list[tuple[str, str, Any]]:
        return [
            ("POST", r"^/v1/fleet/moves$", self.move),
            ("GET", r"^/v1/fleet/moves$", self.moves),
            ("DELETE", rf"^/v1/fleet/moves/{SHARD_PATH}$", self.cancel),
            ("POST", r"^/v1/fleet/fences$", self.fence),
            ("POST", rf"^/v1/fleet/drains/{_NAME}$", self.drain),
            ("DELETE", rf"^/v1/fleet/drains/{_NAME}$", self.undrain),
        ]

    def _holder(self) -> Placer:
        placer = self._placer()
        if placer is None:
            raise ApiError(409, "no_placement", "this control plane runs no placer (no etcd)")
        return placer

    async def _call(self, action: Any) -> Any:
        try:
            return await action
        except MoveError as exc:
            raise ApiError(exc.status, exc.code, str(exc)) from None

    async def move(self, request: Request, g: dict[str, str]) -> Response:
        body = _json(request)
        shard = _shard(body)
        to = body.get("to")
        if not isinstance(to, str) or not to:
            raise ApiError(400, "invalid_request", "to must name a broker (its node id)")
        generation = await self._call(self._holder().move(shard, to))
        return Response(202, {"generation": generation})

    async def moves(self, request: Request, g: dict[str, str]) -> Response:
        placer = self._holder()
        moving = await self._call(placer.moves())
        queued = await self._call(placer.queued())
        items = [
            {
                **_shard_json(shard),
                "state": str(held.record.state),
                "phase": _phase(held.record.state, held.record.leader, held.record.successor),
                "leader": held.record.leader,
                "successor": held.record.successor,
                "generation": held.mod_revision,
            }
            for shard, held in sorted(moving.items())
        ]
        waiting = [{**_shard_json(shard), "leader": leader} for shard, leader in queued]
        return Response(200, {"items": items, "queued": waiting, "max_moves": placer.max_moves})

    async def cancel(self, request: Request, g: dict[str, str]) -> Response:
        shard = ShardId(ShardKind(g["0"]), g["1"], g["2"], g["3"], int(g["4"]))
        cancelled = await self._call(self._holder().cancel(shard))
        return Response(200, {"generation": cancelled.generation, "outcome": cancelled.outcome})

    async def fence(self, request: Request, g: dict[str, str]) -> Response:
        shard = _shard(_json(request))
        leader, generation = await self._call(self._holder().fence(shard))
        return Response(200, {"node_id": leader, "generation": generation})

    async def drain(self, request: Request, g: dict[str, str]) -> Response:
        kept = await self._call(self._holder().drain(g["0"], "operator"))
        skipped = [{**_shard_json(shard), "reason": why} for shard, why in kept]
        return Response(202, {"node_id": g["0"], "skipped": skipped})

    async def undrain(self, request: Request, g: dict[str, str]) -> Response:
        if not await self._call(self._holder().undrain(g["0"])):
            raise ApiError(404, "not_found", f"{g['0']} is not draining")
        return Response(200, {"node_id": g["0"]})
