"""Per-tenant Ed25519 signing keys: creation, rotation, revocation and the published JWKS.

Each tenant has at most one *active* key (signs new tokens). Rotation makes a
new active key and retires the old one: a retired key signs nothing, but stays
in the tenant's JWKS until every token it could have signed has expired
(``retired_at + max token lifetime + verifier leeway``), so rotation never cuts
off a token that was valid when it was issued. Revocation withdraws a key from
the JWKS at once: tokens it signed stop verifying as soon as brokers refetch.

The key id is the RFC 7638 thumbprint, computed by the shared
``felix_common.tokens.public_jwk`` so broker and control plane name keys identically.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from felix_common.tokens import ALGORITHM, LEEWAY_SECONDS, public_jwk
from felix_controlplane.store import NotFoundError, Store, StoredKey

__all__ = ["KeyRing"]

_log = logging.getLogger(__name__)


class KeyRing:
    """Signing keys of every tenant, on top of a :class:`Store`."""

    def __init__(self, store: Store, *, max_token_ttl: int) -> None:
        self._store = store
        # A retired key stays published this long after retirement.
        self._grace = max_token_ttl + LEEWAY_SECONDS

    @staticmethod
    def _new_key(now: int) -> StoredKey:
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        jwk = public_jwk(private.public_key())
        return StoredKey(kid=jwk["kid"], private_pem=pem, public_jwk=jwk, created_at=now)

    def create_first(self, tenant: str, now: int) -> StoredKey:
        """The tenant's first key (tenant creation)."""
        key = self._new_key(now)
        self._store.add_key(tenant, key, retire_others_at=None)
        _log.info("tenant %s: created signing key %s", tenant, key.kid)
        return key

    def rotate(self, tenant: str, now: int) -> StoredKey:
        """A new active key; the previous one retires (still published for the grace time)."""
        key = self._new_key(now)
        self._store.add_key(tenant, key, retire_others_at=now)
        _log.info("tenant %s: rotated to signing key %s", tenant, key.kid)
        return key

    def revoke(self, tenant: str, kid: str) -> bool:
        revoked = self._store.revoke_key(tenant, kid)
        if revoked:
            _log.warning("tenant %s: revoked signing key %s", tenant, kid)
        return revoked

    def _published(self, keys: Sequence[StoredKey], now: int) -> list[StoredKey]:
        return [
            k
            for k in keys
            if not k.revoked and (k.retired_at is None or k.retired_at + self._grace > now)
        ]

    def jwks(self, tenant: str, now: int) -> dict[str, list[dict[str, str]]]:
        """The tenant's JWKS: the active key and retired keys still in their grace time."""
        return {
            "keys": [dict(k.public_jwk) for k in self._published(self._store.keys(tenant), now)]
        }

    def describe(self, tenant: str, now: int) -> list[dict[str, Any]]:
        """Key metadata for the API (never the private part)."""
        published = {k.kid for k in self._published(self._store.keys(tenant), now)}
        return [
            {
                "kid": k.kid,
                "created_at": k.created_at,
                "retired_at": k.retired_at,
                "revoked": k.revoked,
                "active": k.retired_at is None and not k.revoked,
                "published": k.kid in published,
            }
            for k in self._store.keys(tenant)
        ]

    def sign(self, tenant: str, claims: dict[str, Any], now: int) -> str:
        """Sign ``claims`` with the tenant's active key (a new one if every key was revoked)."""
        active = [k for k in self._store.keys(tenant) if k.retired_at is None and not k.revoked]
        if active:
            key = active[-1]
        else:
            if not self._store.tenant_exists(tenant):
                raise NotFoundError(f"tenant {tenant!r} does not exist")
            key = self.rotate(tenant, now)
        private = serialization.load_pem_private_key(key.private_pem, password=None)
        assert isinstance(private, Ed25519PrivateKey)
        return jwt.encode(claims, private, algorithm=ALGORITHM, headers={"kid": key.kid})
