"""Token exchange: an upstream OIDC JWT in, a Felix token out.

1. The upstream token's unverified ``iss`` picks one of the tenant's
   configured identity providers; an issuer nobody configured is refused (401)
   before any network call, so an attacker cannot make us fetch a JWKS URL.
2. The header ``alg`` must be one of that provider's allowed asymmetric
   algorithms (``none`` and HMAC can never be configured).
3. The signature is checked with the provider's JWKS (cached; refetched on an
   unknown ``kid`` at most once per ``min_refetch_seconds``), then ``iss``,
   ``aud``, ``exp``/``nbf`` (60 s leeway) and ``sub``.
4. The Felix subject is ``<issuer>#<sub>``; groups from the provider's groups
   claim become ``<issuer>#<group>``. RBAC maps them to grants, the request may
   narrow them; nothing left is a 403.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
import jwt

from felix_common import safejson
from felix_common.http import read_bounded
from felix_controlplane.model import ApiError, bad_request, check_name

__all__ = [
    "ALLOWED_UPSTREAM_ALGORITHMS",
    "UpstreamIdentity",
    "UpstreamVerifier",
    "validate_identity_provider",
]

_log = logging.getLogger(__name__)

# Asymmetric only: with an HMAC algorithm anyone holding the (public) JWKS
# could mint tokens, and "none" signs nothing.
ALLOWED_UPSTREAM_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
LEEWAY_SECONDS = 60
_MAX_JWKS_BYTES = 1 << 20


def validate_identity_provider(name: str, body: object) -> dict[str, Any]:
    allowed = frozenset({"name", "issuer", "audience", "jwks_url", "algorithms", "groups_claim"})
    if not isinstance(body, Mapping):
        raise bad_request("identity provider: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"identity provider: unknown field {unknown[0]!r}")
    if body.get("name", name) != name:
        raise bad_request("identity_provider.name: differs from the name in the path")
    check_name(name, "identity_provider.name")
    out: dict[str, Any] = {"name": name}
    for key in ("issuer", "audience", "jwks_url"):
        value = body.get(key)
        if not isinstance(value, str) or not value:
            raise bad_request(f"identity_provider.{key}: expected a non-empty string")
        out[key] = value
    if "#" in out["issuer"]:
        raise bad_request("identity_provider.issuer: must not contain '#'")
    if urlparse(out["jwks_url"]).scheme not in ("https", "http"):
        raise bad_request("identity_provider.jwks_url: expected an https:// (or http://) URL")
    algorithms = body.get("algorithms", ["RS256", "ES256"])
    if (
        not isinstance(algorithms, list)
        or not algorithms
        or not all(a in ALLOWED_UPSTREAM_ALGORITHMS for a in algorithms)
    ):
        raise bad_request(
            "identity_provider.algorithms: a non-empty list of "
            + ", ".join(sorted(ALLOWED_UPSTREAM_ALGORITHMS))
        )
    out["algorithms"] = list(algorithms)
    groups_claim = body.get("groups_claim", "groups")
    if not isinstance(groups_claim, str) or not groups_claim:
        raise bad_request("identity_provider.groups_claim: expected a non-empty string")
    out["groups_claim"] = groups_claim
    return out


@dataclass(frozen=True, slots=True)
class UpstreamIdentity:
    issuer: str
    subject: str  # the Felix subject, <issuer>#<sub>
    groups: list[str]


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthenticated", message)


@dataclass(slots=True)
class _CachedJwks:
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    fetched_at: float = 0.0


class UpstreamVerifier:
    """Verifies upstream OIDC tokens, fetching providers' JWKS with aiohttp (one
    session, created on first use on the running loop; :meth:`close` ends it)."""

    def __init__(
        self,
        *,
        cache_seconds: float = 300.0,
        min_refetch_seconds: float = 10.0,
        timeout: float = 5.0,
    ) -> None:
        self._cache: dict[str, _CachedJwks] = {}
        self._cache_seconds = cache_seconds
        self._min_refetch = min_refetch_seconds
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _fetch(self, url: str) -> dict[str, jwt.PyJWK]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"Accept": "application/json"})
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with self._session.get(url, timeout=timeout) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            raw = await read_bounded(response.content, _MAX_JWKS_BYTES)
        document = safejson.loads(raw)
        keys: dict[str, jwt.PyJWK] = {}
        for entry in document.get("keys", []) if isinstance(document, dict) else []:
            try:
                key = jwt.PyJWK.from_dict(entry)
            except jwt.PyJWTError:
                continue  # a key type we cannot use cannot verify anything either
            keys[str(entry.get("kid", ""))] = key
        return keys

    async def _key(self, url: str, kid: str) -> jwt.PyJWK | None:
        now = time.monotonic()
        cached = self._cache.get(url)
        stale = cached is None or now - cached.fetched_at > self._cache_seconds
        # Unknown kid: the provider may have rotated; refetch, but not more often
        # than min_refetch, so made-up kids cannot turn us into a load generator.
        unknown = cached is not None and kid not in cached.keys
        may_refetch = cached is not None and now - cached.fetched_at >= self._min_refetch
        if stale or (unknown and may_refetch):
            try:
                cached = _CachedJwks(await self._fetch(url), now)
                self._cache[url] = cached
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                _log.warning("cannot fetch upstream JWKS %s: %s", url, exc or type(exc).__name__)
                if cached is None:
                    raise ApiError(
                        503, "upstream_unavailable", "identity provider JWKS unreachable"
                    ) from None
        assert cached is not None
        if not kid and len(cached.keys) == 1:
            return next(iter(cached.keys.values()))
        return cached.keys.get(kid)

    async def verify(self, token: str, providers: list[dict[str, Any]]) -> UpstreamIdentity:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise _unauthorized("upstream token is not a JWT") from None
        issuer = unverified.get("iss")
        provider = next((p for p in providers if p["issuer"] == issuer), None)
        if provider is None:
            raise _unauthorized(f"upstream issuer {issuer!r} is not configured for this tenant")
        alg = header.get("alg")
        if alg not in provider["algorithms"]:
            raise _unauthorized(f"upstream algorithm {alg!r} is not allowed for this issuer")
        kid = header.get("kid")
        key = await self._key(provider["jwks_url"], kid if isinstance(kid, str) else "")
        if key is None:
            raise _unauthorized(f"upstream key id {kid!r} is not in the issuer's JWKS")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[str(alg)],
                audience=provider["audience"],
                issuer=provider["issuer"],
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise _unauthorized(f"upstream token refused: {exc}") from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise _unauthorized("upstream token has no usable 'sub'")
        raw_groups = claims.get(provider["groups_claim"], [])
        if not isinstance(raw_groups, list):
            raw_groups = []
        groups = [g for g in raw_groups if isinstance(g, str)]
        return UpstreamIdentity(
            issuer=provider["issuer"],
            subject=f"{provider['issuer']}#{subject}",
            groups=[f"{provider['issuer']}#{g}" for g in groups],
        )
