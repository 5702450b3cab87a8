"""The control plane's HTTP API (JSON), the broker sync feed, bootstrap and token exchange.

Public listener (all paths under ``/v1``):

=========================================================  ==========================
``GET    /tenants/{t}``, ``DELETE /tenants/{t}``           tenant admin
``GET|POST /tenants/{t}/namespaces``                       tenant admin / ns admin
``GET|DELETE /tenants/{t}/namespaces/{ns}``                namespace admin
``GET|POST /tenants/{t}/namespaces/{ns}/streams``          stream.manage on ns/* or it
``GET|DELETE /tenants/{t}/namespaces/{ns}/streams/{s}``    stream.manage on it
``.../caches`` and ``.../caches/{c}``                      cache.manage likewise
``GET /tenants/{t}/{policies|assignments|identity-providers}``         tenant admin
``PUT|GET|DELETE /tenants/{t}/{policies|assignments|identity-providers}/{name}``
``GET /tenants/{t}/keys``, ``POST /tenants/{t}/keys/rotate``,
``DELETE /tenants/{t}/keys/{kid}`` (revoke)                tenant admin
``GET /tenants/{t}/.well-known/jwks.json``                 public
``POST /tenants/{t}/token/exchange``                       upstream OIDC bearer
``POST /tenants/{t}/tokens``                               tenant admin (mint a token)
``GET /catalog/snapshot``, ``GET /catalog/changes?since=N&wait=S``     broker sync token
=========================================================  ==========================

Admin calls carry a Felix token with ``aud`` felix-controlplane, verified with
the same :class:`felix_common.tokens.TokenVerifier` brokers use, against the
tenant's JWKS.

Admin listener (loopback only, bootstrap secret as bearer):
``POST /v1/bootstrap`` creates a tenant with its first signing key, an
``admin`` policy and assignment (and optionally an identity provider) and
answers a 15-minute admin token; ``GET /v1/tenants`` lists tenants. The fleet's
routes (``/v1/fleet/features``, ``/v1/fleet/members``) are added there by the CLI
(felix_controlplane/fleet_features.py).

Lists are paged: ``?limit=`` (1-1000, default 100) and ``?after=<last name>``;
answers are ``{"items": [...], "next": <name or null>}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from felix_common import feed
from felix_common.permissions import Action, PermissionSet
from felix_common.tokens import AUDIENCE, ISSUER, TokenError, TokenVerifier
from felix_controlplane import model, rbac
from felix_controlplane.exchange import (
    UpstreamIdentity,
    UpstreamVerifier,
    validate_identity_provider,
)
from felix_controlplane.fleet_api import FleetApi
from felix_controlplane.http import BadJson, Request, Response, error
from felix_controlplane.keys import KeyRing

if TYPE_CHECKING:
    from felix_controlplane.placement import Placer
from felix_controlplane.model import ApiError
from felix_controlplane.store import (
    ConflictError,
    NotFoundError,
    ResourceKey,
    Store,
    StoreUnavailableError,
)

__all__ = ["CONTROLPLANE_AUDIENCE", "ControlPlane", "Settings"]

_log = logging.getLogger(__name__)

CONTROLPLANE_AUDIENCE = "felix-controlplane"
_AUDIENCES = (AUDIENCE, CONTROLPLANE_AUDIENCE)
_SETTING_KINDS = {
    "policies": "policy",
    "assignments": "assignment",
    "identity-providers": "idp",
}


@dataclass(frozen=True, slots=True)
class Settings:
    default_token_ttl: int = 900
    max_token_ttl: int = 3600
    sync_token: str | None = None
    bootstrap_secret: str | None = None
    long_poll_max_seconds: float = 30.0


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _secret_matches(given: str | None, expected: str | None) -> bool:
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def _page(request: Request) -> tuple[str, int]:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        raise ApiError(400, "bad_request", "limit: expected an integer") from None
    if not 1 <= limit <= 1000:
        raise ApiError(400, "bad_request", "limit: between 1 and 1000")
    return request.query.get("after", ""), limit


def _paged(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    return {"items": items, "next": items[-1]["name"] if len(items) == limit else None}


def _body(request: Request) -> Any:
    """The request's JSON body: call it only once the caller is authenticated."""
    try:
        return request.json()
    except BadJson as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


Route = Callable[[Request, dict[str, str]], Awaitable[Response]]


class ControlPlane:
    """The API's logic over a :class:`Store`; :meth:`handle` and :meth:`handle_admin`
    are the request handlers of the public and admin listeners."""

    def __init__(self, store: Store, settings: Settings | None = None) -> None:
        self.store = store
        self.settings = settings or Settings()
        self.keys = KeyRing(store, max_token_ttl=self.settings.max_token_ttl)
        self.upstream = UpstreamVerifier()
        self._changed = asyncio.Event()
        n = r"([A-Za-z0-9_.-]{1,128})"
        t = rf"^/v1/tenants/{n}"
        ns = rf"{t}/namespaces/{n}"
        kinds = "|".join(re.escape(k) for k in _SETTING_KINDS)
        self._routes: list[tuple[str, re.Pattern[str], Route]] = [
            ("GET", re.compile(rf"{t}$"), self._get_tenant),
            ("DELETE", re.compile(rf"{t}$"), self._delete_tenant),
            ("GET", re.compile(rf"{t}/namespaces$"), self._list_namespaces),
            ("POST", re.compile(rf"{t}/namespaces$"), self._create_namespace),
            ("GET", re.compile(rf"{ns}$"), self._get_namespace),
            ("DELETE", re.compile(rf"{ns}$"), self._delete_namespace),
            ("GET", re.compile(rf"{ns}/(streams|caches)$"), self._list_items),
            ("POST", re.compile(rf"{ns}/(streams|caches)$"), self._create_item),
            ("GET", re.compile(rf"{ns}/(streams|caches)/{n}$"), self._get_item),
            ("DELETE", re.compile(rf"{ns}/(streams|caches)/{n}$"), self._delete_item),
            ("GET", re.compile(rf"{t}/({kinds})$"), self._list_settings),
            ("PUT", re.compile(rf"{t}/({kinds})/{n}$"), self._put_setting),
            ("GET", re.compile(rf"{t}/({kinds})/{n}$"), self._get_setting),
            ("DELETE", re.compile(rf"{t}/({kinds})/{n}$"), self._delete_setting),
            ("GET", re.compile(rf"{t}/keys$"), self._list_keys),
            ("POST", re.compile(rf"{t}/keys/rotate$"), self._rotate_key),
            ("DELETE", re.compile(rf"{t}/keys/([A-Za-z0-9_-]{{1,128}})$"), self._revoke_key),
            ("GET", re.compile(rf"{t}/\.well-known/jwks\.json$"), self._jwks),
            ("POST", re.compile(rf"{t}/token/exchange$"), self._exchange),
            ("POST", re.compile(rf"{t}/tokens$"), self._mint),
            ("GET", re.compile(r"^/v1/catalog/snapshot$"), self._snapshot),
            ("GET", re.compile(r"^/v1/catalog/changes$"), self._changes),
        ]
        # The placer this instance runs (felix-controlplane --etcd-endpoints sets it):
        # the operator's fleet commands (fleet_api.py) act through it.
        self.placer: Placer | None = None
        fleet = FleetApi(lambda: self.placer)
        self._admin_routes: list[tuple[str, re.Pattern[str], Route]] = [
            ("POST", re.compile(r"^/v1/bootstrap$"), self._bootstrap),
            ("GET", re.compile(r"^/v1/tenants$"), self._list_tenants),
            *((method, re.compile(path), route) for method, path, route in fleet.routes()),
        ]

    # -- s2-backup: the fleet's routes (felix_controlplane/fleet_features.py) ------------

    def add_admin_routes(self, routes: list[tuple[str, re.Pattern[str], Route]]) -> None:
        """More routes on the admin listener (behind its loopback and secret checks)."""
        self._admin_routes.extend(routes)

    def changed_elsewhere(self) -> None:
        """The store says its change log advanced through another instance (a shared
        etcd store): wake this instance's long polls. Call on the event loop."""
        self._notify()

    async def close(self) -> None:
        """End the outbound HTTP session (identity providers' JWKS); the store is the caller's."""
        await self.upstream.close()

    # -- dispatch -------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        return await self._dispatch(self._routes, request)

    async def handle_admin(self, request: Request) -> Response:
        # Defence in depth: the CLI binds this listener to loopback only, and the
        # peer is checked again so a misconfigured bind still refuses outsiders.
        try:
            loopback = ipaddress.ip_address(request.peer).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            return error(403, "forbidden", "the admin listener only serves loopback clients")
        if not _secret_matches(_bearer(request), self.settings.bootstrap_secret):
            return error(401, "unauthenticated", "bootstrap secret required")
        return await self._dispatch(self._admin_routes, request)

    async def _dispatch(
        self, routes: list[tuple[str, re.Pattern[str], Route]], request: Request
    ) -> Response:
        path_known = False
        for method, pattern, route in routes:
            match = pattern.match(request.path)
            if match is None:
                continue
            path_known = True
            if method != request.method:
                continue
            groups = {str(i): g for i, g in enumerate(match.groups())}
            try:
                return await route(request, groups)
            except ApiError as exc:
                return error(exc.status, exc.code, exc.message)
            except feed.InvalidDefinition as exc:
                return error(400, "invalid_definition", str(exc))
            except ConflictError as exc:
                return error(409, "conflict", str(exc))
            except NotFoundError as exc:
                return error(404, "not_found", str(exc))
        if path_known:
            return error(405, "method_not_allowed", f"{request.method} not allowed here")
        return error(404, "not_found", f"no such path {request.path}")

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Every store call is one short transaction; off the loop all the same.
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreUnavailableError as exc:
            raise ApiError(503, "unavailable", f"the store cannot be reached: {exc}") from None

    def _notify(self) -> None:
        # Wake every long-polling broker; the next waiters get a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    # -- authentication -------------------------------------------------------------

    def _verify_admin(self, token: str, tenant: str) -> PermissionSet:
        verifier = TokenVerifier(
            self.keys.jwks(tenant, int(time.time())), audience=CONTROLPLANE_AUDIENCE
        )
        return verifier.verify(token, tenant).permissions

    async def _admin(self, request: Request, tenant: str) -> PermissionSet:
        token = _bearer(request)
        if token is None:
            raise ApiError(401, "unauthenticated", "a control-plane token is required")
        try:
            perms: PermissionSet = await self._run(self._verify_admin, token, tenant)
        except TokenError as exc:
            raise ApiError(401, "unauthenticated", f"token refused ({exc.check}): {exc}") from None
        return perms

    def _require_sync(self, request: Request) -> None:
        if not _secret_matches(_bearer(request), self.settings.sync_token):
            raise ApiError(401, "unauthenticated", "the broker sync token is required")

    # -- tenants --------------------------------------------------------------------

    async def _get_tenant(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        return Response(200, {"name": g["0"]})

    async def _delete_tenant(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        if not await self._run(self.store.delete_tenant, g["0"]):
            raise ApiError(404, "not_found", f"tenant {g['0']!r} does not exist")
        _log.warning("tenant %s deleted", g["0"])
        self._notify()
        return Response(204)

    async def _list_tenants(self, request: Request, g: dict[str, str]) -> Response:
        after, limit = _page(request)
        names = await self._run(self.store.list_tenants, after, limit)
        return Response(200, _paged([{"name": n} for n in names], limit))

    # -- namespaces -----------------------------------------------------------------

    async def _list_namespaces(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        after, limit = _page(request)
        items = await self._run(self.store.list_resources, g["0"], "namespace", "", after, limit)
        return Response(200, _paged(items, limit))

    async def _create_namespace(self, request: Request, g: dict[str, str]) -> Response:
        tenant = g["0"]
        perms = await self._admin(request, tenant)
        body = _body(request)
        if not isinstance(body, dict) or set(body) != {"name"}:
            raise model.bad_request('namespace: expected {"name": ...}')
        name = model.check_name(body["name"], "namespace.name")
        rbac.require_namespace_admin(perms, tenant, name)
        await self._run(
            self.store.create, ResourceKey(tenant, "namespace", "", name), {"name": name}
        )
        self._notify()
        return Response(201, {"name": name})

    async def _get_namespace(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_namespace_admin(await self._admin(request, g["0"]), g["0"], g["1"])
        body = await self._run(self.store.get, ResourceKey(g["0"], "namespace", "", g["1"]))
        if body is None:
            raise ApiError(404, "not_found", f"namespace {g['1']!r} does not exist")
        return Response(200, body)

    async def _delete_namespace(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_namespace_admin(await self._admin(request, g["0"]), g["0"], g["1"])
        if not await self._run(self.store.delete, ResourceKey(g["0"], "namespace", "", g["1"])):
            raise ApiError(404, "not_found", f"namespace {g['1']!r} does not exist")
        self._notify()
        return Response(204)

    # -- streams and caches ---------------------------------------------------------

    @staticmethod
    def _item_kind(plural: str) -> tuple[str, Action]:
        if plural == "streams":
            return "stream", Action.STREAM_MANAGE
        return "cache", Action.CACHE_MANAGE

    async def _list_items(self, request: Request, g: dict[str, str]) -> Response:
        tenant, ns = g["0"], g["1"]
        kind, action = self._item_kind(g["2"])
        rbac.require(await self._admin(request, tenant), action, f"{kind}:{tenant}/{ns}/*")
        after, limit = _page(request)
        items = await self._run(self.store.list_resources, tenant, kind, ns, after, limit)
        return Response(200, _paged(items, limit))

    async def _create_item(self, request: Request, g: dict[str, str]) -> Response:
        tenant, ns = g["0"], g["1"]
        kind, action = self._item_kind(g["2"])
        perms = await self._admin(request, tenant)
        raw = _body(request)
        body: dict[str, Any]
        if kind == "stream":
            body = feed.stream_body(feed.validate_stream(tenant, ns, raw))
        else:
            body = feed.cache_body(feed.validate_cache(tenant, ns, raw))
        rbac.require(perms, action, f"{kind}:{tenant}/{ns}/{body['name']}")
        await self._run(self.store.create, ResourceKey(tenant, kind, ns, body["name"]), body)
        _log.info("created %s %s/%s/%s", kind, tenant, ns, body["name"])
        self._notify()
        return Response(201, body)

    async def _get_item(self, request: Request, g: dict[str, str]) -> Response:
        tenant, ns, name = g["0"], g["1"], g["3"]
        kind, action = self._item_kind(g["2"])
        rbac.require(await self._admin(request, tenant), action, f"{kind}:{tenant}/{ns}/{name}")
        body = await self._run(self.store.get, ResourceKey(tenant, kind, ns, name))
        if body is None:
            raise ApiError(404, "not_found", f"{kind} {tenant}/{ns}/{name} does not exist")
        return Response(200, body)

    async def _delete_item(self, request: Request, g: dict[str, str]) -> Response:
        tenant, ns, name = g["0"], g["1"], g["3"]
        kind, action = self._item_kind(g["2"])
        rbac.require(await self._admin(request, tenant), action, f"{kind}:{tenant}/{ns}/{name}")
        if not await self._run(self.store.delete, ResourceKey(tenant, kind, ns, name)):
            raise ApiError(404, "not_found", f"{kind} {tenant}/{ns}/{name} does not exist")
        _log.info("deleted %s %s/%s/%s", kind, tenant, ns, name)
        self._notify()
        return Response(204)

    # -- tenant settings: policies, assignments, identity providers --------------------

    async def _list_settings(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        after, limit = _page(request)
        kind = _SETTING_KINDS[g["1"]]
        items = await self._run(self.store.list_resources, g["0"], kind, "", after, limit)
        return Response(200, _paged(items, limit))

    async def _put_setting(self, request: Request, g: dict[str, str]) -> Response:
        tenant, plural, name = g["0"], g["1"], g["2"]
        rbac.require_tenant_admin(await self._admin(request, tenant), tenant)
        raw = _body(request)
        kind = _SETTING_KINDS[plural]
        if kind == "policy":
            body = rbac.validate_policy(tenant, name, raw)
        elif kind == "assignment":
            body = rbac.validate_assignment(name, raw)
        else:
            body = validate_identity_provider(name, raw)
        created = await self._run(self.store.replace, ResourceKey(tenant, kind, "", name), body)
        _log.info("tenant %s: %s %s %s", tenant, "created" if created else "replaced", kind, name)
        return Response(201 if created else 200, body)

    async def _get_setting(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        kind = _SETTING_KINDS[g["1"]]
        body = await self._run(self.store.get, ResourceKey(g["0"], kind, "", g["2"]))
        if body is None:
            raise ApiError(404, "not_found", f"{kind} {g['2']!r} does not exist")
        return Response(200, body)

    async def _delete_setting(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        kind = _SETTING_KINDS[g["1"]]
        if not await self._run(self.store.delete, ResourceKey(g["0"], kind, "", g["2"])):
            raise ApiError(404, "not_found", f"{kind} {g['2']!r} does not exist")
        return Response(204)

    # -- keys -------------------------------------------------------------------------

    async def _list_keys(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        keys = await self._run(self.keys.describe, g["0"], int(time.time()))
        return Response(200, {"items": keys})

    async def _rotate_key(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        key = await self._run(self.keys.rotate, g["0"], int(time.time()))
        self._notify()
        return Response(201, {"kid": key.kid})

    async def _revoke_key(self, request: Request, g: dict[str, str]) -> Response:
        rbac.require_tenant_admin(await self._admin(request, g["0"]), g["0"])
        if not await self._run(self.keys.revoke, g["0"], g["1"]):
            raise ApiError(404, "not_found", f"key {g['1']!r} does not exist")
        self._notify()
        return Response(204)

    async def _jwks(self, request: Request, g: dict[str, str]) -> Response:
        if not await self._run(self.store.tenant_exists, g["0"]):
            raise ApiError(404, "not_found", f"tenant {g['0']!r} does not exist")
        jwks = await self._run(self.keys.jwks, g["0"], int(time.time()))
        # Short cache lifetime: a revoked key must leave caches quickly.
        return Response(200, jwks, {"Cache-Control": "max-age=60"})

    # -- token exchange ---------------------------------------------------------------

    def _providers(self, tenant: str) -> list[dict[str, Any]]:
        if not self.store.tenant_exists(tenant):
            raise ApiError(404, "not_found", f"tenant {tenant!r} does not exist")
        providers: list[dict[str, Any]] = self.store.list_resources(tenant, "idp", "", "", 1000)
        return providers

    def _exchange_sync(
        self, tenant: str, identity: UpstreamIdentity, body: dict[str, Any]
    ) -> dict[str, Any]:
        store = self.store
        policies = {p["name"]: p for p in store.list_resources(tenant, "policy", "", "", 10000)}
        assignments = store.list_resources(tenant, "assignment", "", "", 10000)
        grants = rbac.effective_grants(policies, assignments, identity.subject, identity.groups)
        grants = rbac.narrow(grants, body.get("actions"), body.get("resources"))
        if not grants:
            _log.info("exchange for %s in %s: no permission remains", identity.subject, tenant)
            raise ApiError(403, "forbidden", "no permission remains for this principal")
        audience = body.get("audience", AUDIENCE)
        ttl = body.get("ttl_seconds", self.settings.default_token_ttl)
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": audience,
            "sub": identity.subject,
            "tid": tenant,
            "perms": grants,
            "iat": now,
            "nbf": now,
            "exp": now + ttl,
            "jti": secrets.token_urlsafe(16),
        }
        token = self.keys.sign(tenant, claims, now)
        _log.info(
            "issued %s token for %s in %s (%d grants)",
            audience,
            identity.subject,
            tenant,
            len(grants),
        )
        return {
            "token": token,
            "token_type": "Bearer",
            "audience": audience,
            "subject": identity.subject,
            "tenant_id": tenant,
            "perms": grants,
            "expires_in": ttl,
            "expires_at": now + ttl,
        }

    async def _exchange(self, request: Request, g: dict[str, str]) -> Response:
        upstream = _bearer(request)
        if upstream is None:
            raise ApiError(401, "unauthenticated", "an upstream OIDC token is required")
        # Who is asking comes first: a stranger's body is never parsed.
        identity = await self.upstream.verify(upstream, await self._run(self._providers, g["0"]))
        raw = _body(request)
        body = {} if raw is None else raw
        if not isinstance(body, dict) or set(body) - {
            "audience",
            "actions",
            "resources",
            "ttl_seconds",
        }:
            raise model.bad_request(
                "exchange: expected an object with audience, actions, resources, ttl_seconds"
            )
        if body.get("audience", AUDIENCE) not in _AUDIENCES:
            raise model.bad_request(f"audience: one of {', '.join(_AUDIENCES)}")
        for key in ("actions", "resources"):
            value = body.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            ):
                raise model.bad_request(f"{key}: expected a list of strings")
        ttl = body.get("ttl_seconds", self.settings.default_token_ttl)
        if (
            isinstance(ttl, bool)
            or not isinstance(ttl, int)
            or not (1 <= ttl <= self.settings.max_token_ttl)
        ):
            raise model.bad_request(f"ttl_seconds: between 1 and {self.settings.max_token_ttl}")
        answer = await self._run(self._exchange_sync, g["0"], identity, body)
        return Response(200, answer)

    # -- tokens minted by a tenant administrator ----------------------------------------

    async def _mint(self, request: Request, g: dict[str, str]) -> Response:
        """``{"subject", "perms": [...], "ttl_seconds"?, "audience"?}`` -> a signed token.

        A tenant administrator can already grant anything within the tenant (through
        policies and assignments), so minting any grant of the tenant widens nothing;
        grants naming other tenants are refused like a policy's. This is the way to a
        working token without an upstream identity provider (development, automation).
        """
        tenant = g["0"]
        rbac.require_tenant_admin(await self._admin(request, tenant), tenant)
        body = _body(request)
        allowed = {"subject", "perms", "ttl_seconds", "audience"}
        if not isinstance(body, dict) or "subject" not in body or set(body) - allowed:
            raise model.bad_request(
                "tokens: expected an object with subject, perms, ttl_seconds?, audience?"
            )
        subject = body["subject"]
        if not isinstance(subject, str) or not 1 <= len(subject) <= 256:
            raise model.bad_request("subject: 1-256 characters")
        grants = rbac.validate_grants(tenant, body.get("perms", []), "perms")
        audience = body.get("audience", AUDIENCE)
        if audience not in _AUDIENCES:
            raise model.bad_request(f"audience: one of {', '.join(_AUDIENCES)}")
        ttl = body.get("ttl_seconds", self.settings.default_token_ttl)
        if (
            isinstance(ttl, bool)
            or not isinstance(ttl, int)
            or not (1 <= ttl <= self.settings.max_token_ttl)
        ):
            raise model.bad_request(f"ttl_seconds: between 1 and {self.settings.max_token_ttl}")
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": audience,
            "sub": subject,
            "tid": tenant,
            "perms": grants,
            "iat": now,
            "nbf": now,
            "exp": now + ttl,
            "jti": secrets.token_urlsafe(16),
        }
        token = await self._run(self.keys.sign, tenant, claims, now)
        _log.info(
            "tenant %s: minted a %s token for %s (%d grants)",
            tenant,
            audience,
            subject,
            len(grants),
        )
        return Response(
            201,
            {
                "token": token,
                "token_type": "Bearer",
                "audience": audience,
                "subject": subject,
                "tenant_id": tenant,
                "perms": grants,
                "expires_in": ttl,
                "expires_at": now + ttl,
            },
        )

    # -- bootstrap --------------------------------------------------------------------

    def _bootstrap_sync(self, body: dict[str, Any]) -> dict[str, Any]:
        tenant = model.check_name(body.get("tenant"), "tenant")
        admin = rbac.validate_assignment("admin", {"policy": "admin", **body.get("admin", {})})
        idp = body.get("identity_provider")
        idp_body = None
        if idp is not None:
            idp_body = validate_identity_provider(
                idp.get("name", "default") if isinstance(idp, dict) else "default", idp
            )
        policy = rbac.validate_policy(
            tenant, "admin", {"permissions": rbac.tenant_admin_grants(tenant)}
        )
        now = int(time.time())
        self.store.create_tenant(tenant, now)
        self.keys.create_first(tenant, now)
        self.store.replace(ResourceKey(tenant, "policy", "", "admin"), policy)
        self.store.replace(ResourceKey(tenant, "assignment", "", "admin"), admin)
        if idp_body is not None:
            self.store.replace(ResourceKey(tenant, "idp", "", idp_body["name"]), idp_body)
        ttl = self.settings.default_token_ttl
        claims = {
            "iss": ISSUER,
            "aud": CONTROLPLANE_AUDIENCE,
            "sub": "bootstrap",
            "tid": tenant,
            "perms": policy["permissions"],
            "iat": now,
            "nbf": now,
            "exp": now + ttl,
            "jti": secrets.token_urlsafe(16),
        }
        _log.warning("bootstrap: created tenant %s with its admin grant", tenant)
        return {
            "tenant": tenant,
            "admin_token": self.keys.sign(tenant, claims, now),
            "expires_in": ttl,
            "policy": policy,
            "assignment": admin,
            "identity_provider": idp_body,
        }

    async def _bootstrap(self, request: Request, g: dict[str, str]) -> Response:
        body = _body(request)
        if not isinstance(body, dict) or set(body) - {"tenant", "admin", "identity_provider"}:
            raise model.bad_request("bootstrap: expected {tenant, admin, identity_provider?}")
        if not isinstance(body.get("admin", {}), dict):
            raise model.bad_request("admin: expected {subjects, groups}")
        answer = await self._run(self._bootstrap_sync, body)
        self._notify()
        return Response(201, answer)

    # -- broker sync --------------------------------------------------------------------

    async def _snapshot(self, request: Request, g: dict[str, str]) -> Response:
        self._require_sync(request)
        snap = await self._run(self.store.snapshot)
        document = feed.Snapshot(
            seq=snap.seq,
            tenants=snap.tenants,
            resources=[
                feed.Resource(k.kind, k.tenant, k.namespace, k.name, body)
                for k, body in snap.resources
            ],
        )
        return Response(200, msgspec.to_builtins(document))

    async def _changes(self, request: Request, g: dict[str, str]) -> Response:
        self._require_sync(request)
        try:
            since = int(request.query.get("since", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            raise ApiError(400, "bad_request", "since: integer, wait: seconds") from None
        wait = max(0.0, min(wait, self.settings.long_poll_max_seconds))
        deadline = time.monotonic() + wait
        while True:
            # Take the event before reading, so a change landing in between wakes us.
            changed = self._changed
            page = await self._run(self.store.changes_since, since, 1000)
            remaining = deadline - time.monotonic()
            if page.changes or page.reset or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()
        document = feed.ChangePage(
            seq=page.seq,
            reset=page.reset,
            changes=[
                feed.Change(
                    c.seq,
                    "put" if c.op == "put" else "delete",
                    c.kind,
                    c.tenant,
                    c.namespace,
                    c.name,
                    c.body,
                )
                for c in page.changes
            ],
        )
        return Response(200, msgspec.to_builtins(document))
