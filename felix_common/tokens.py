"""Felix tokens: Ed25519-signed JWTs (``alg`` EdDSA, with ``kid``), issued and verified.

Claims of a Felix token::

    iss  "felix-auth"          aud  "felix-broker"
    sub  principal name        tid  tenant id the token is scoped to
    perms ["<action>:<object>", ...]  (see felix_common.permissions)
    iat, nbf, exp              seconds since the epoch

:class:`TokenVerifier` checks, in this order: the header's ``alg`` is EdDSA
(anything else is refused before any key is touched, so an HS256 token signed
with the public key as a secret cannot pass), the ``kid`` is in the JWKS, the
signature, ``iss``, ``aud``, ``exp``/``nbf`` with 60 s of leeway, ``tid``
equals the tenant the client named in ``auth``, and every ``perms`` entry is
understood. Each failure raises its own :class:`TokenError` subclass naming
the check; the protocol answers all of them with ``unauthenticated``, retry
class ``fatal`` (§8, §9 V1).

:class:`DevIssuer` is a development issuer: an Ed25519 key kept in the data
folder (created on first use, mode 0600) that mints tokens and publishes its
JWKS, so a standalone broker and its tests need no control plane.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from felix_common.files import create_file_once, warn_if_readable_by_others
from felix_common.permissions import InvalidPermissionError, PermissionSet

__all__ = [
    "ALGORITHM",
    "AUDIENCE",
    "DEV_KEY_FILE",
    "ISSUER",
    "LEEWAY_SECONDS",
    "AlgorithmRefusedError",
    "AudienceError",
    "DevIssuer",
    "InvalidJwksError",
    "IssuerError",
    "MalformedTokenError",
    "MissingClaimError",
    "PermissionsRefusedError",
    "Principal",
    "SignatureError",
    "TenantMismatchError",
    "TokenError",
    "TokenExpiredError",
    "TokenNotYetValidError",
    "TokenVerifier",
    "UnknownKeyIdError",
    "public_jwk",
]

_log = logging.getLogger(__name__)

ALGORITHM = "EdDSA"
ISSUER = "felix-auth"
AUDIENCE = "felix-broker"
LEEWAY_SECONDS = 60
DEV_KEY_FILE = "dev-issuer-ed25519.pem"


class TokenError(Exception):
    """A token was refused; ``check`` names the check that failed."""

    check: ClassVar[str] = "token"
    # How the protocol answers every token failure (§8: unauthenticated, fatal).
    wire_code: ClassVar[str] = "unauthenticated"
    retry_class: ClassVar[str] = "fatal"


class MalformedTokenError(TokenError):
    """Not a decodable JWT, or a claim of the wrong type."""

    check = "format"


class AlgorithmRefusedError(TokenError):
    """The header's ``alg`` is not EdDSA."""

    check = "alg"


class UnknownKeyIdError(TokenError):
    """The header has no ``kid`` or one the JWKS does not hold."""

    check = "kid"


class SignatureError(TokenError):
    """The signature does not verify with the key named by ``kid``."""

    check = "signature"


class IssuerError(TokenError):
    """``iss`` is not felix-auth."""

    check = "iss"


class AudienceError(TokenError):
    """``aud`` is not felix-broker."""

    check = "aud"


class TokenExpiredError(TokenError):
    """``exp`` passed more than the leeway ago."""

    check = "exp"


class TokenNotYetValidError(TokenError):
    """``nbf`` (or ``iat``) lies more than the leeway in the future."""

    check = "nbf"


class MissingClaimError(TokenError):
    """A required claim is absent."""

    check = "claims"


class TenantMismatchError(TokenError):
    """``tid`` differs from the tenant named in ``auth``."""

    check = "tid"


class PermissionsRefusedError(TokenError):
    """A ``perms`` entry is malformed or names an unknown action."""

    check = "perms"


class InvalidJwksError(ValueError):
    """A JWKS document is not shaped like one."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a verified token speaks for, and what it may do."""

    subject: str
    tenant_id: str
    permissions: PermissionSet
    expires_at: int


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def public_jwk(public_key: Ed25519PublicKey) -> dict[str, str]:
    """The JWK a verifier needs for ``public_key``; its ``kid`` is the RFC 7638 thumbprint."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = _b64url(raw)
    # RFC 7638 thumbprint: the required members, sorted, no whitespace. A kid
    # derived from the key itself never drifts from the key it names.
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    kid = _b64url(hashlib.sha256(canonical.encode("ascii")).digest())
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": ALGORITHM, "use": "sig"}


class DevIssuer:
    """A development token issuer backed by one Ed25519 key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self._jwk = public_jwk(private_key.public_key())

    @classmethod
    def load_or_create(cls, data_dir: Path) -> DevIssuer:
        """Use ``data_dir/dev-issuer-ed25519.pem``, creating it (mode 0600) if absent."""
        path = data_dir / DEV_KEY_FILE
        if not path.exists():
            pem = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            if create_file_once(path, pem, mode=0o600):
                _log.info("created development token issuer key %s", path)
        warn_if_readable_by_others(path)
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return cls(key)

    @property
    def kid(self) -> str:
        """The key id tokens carry in their header."""
        return self._jwk["kid"]

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWKS a verifier needs: ``{"keys": [{kty, crv, x, kid, alg, use}]}``."""
        return {"keys": [dict(self._jwk)]}

    def mint(
        self,
        tenant_id: str,
        *,
        subject: str,
        perms: Iterable[str],
        ttl_seconds: int = 900,
        audience: str = AUDIENCE,
        issued_at: int | None = None,
    ) -> str:
        """A signed token for ``subject`` in ``tenant_id``.

        ``issued_at`` (default now) sets ``iat`` and ``nbf``; ``exp`` is
        ``issued_at + ttl_seconds``. Unknown actions in ``perms`` are refused
        here already, since no verifier would accept the token.
        """
        perm_list = list(perms)
        try:
            PermissionSet.parse(perm_list)
        except InvalidPermissionError as exc:
            raise ValueError(str(exc)) from exc
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        now = int(time.time()) if issued_at is None else issued_at
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": audience,
            "sub": subject,
            "tid": tenant_id,
            "perms": perm_list,
            "iat": now,
            "nbf": now,
            "exp": now + ttl_seconds,
        }
        return jwt.encode(claims, self._key, algorithm=ALGORITHM, headers={"kid": self.kid})


def _load_jwks(jwks: Mapping[str, Any]) -> dict[str, Ed25519PublicKey]:
    keys = jwks.get("keys") if isinstance(jwks, Mapping) else None
    if not isinstance(keys, list):
        raise InvalidJwksError("a JWKS is an object with a 'keys' list")
    loaded: dict[str, Ed25519PublicKey] = {}
    for entry in keys:
        if not isinstance(entry, Mapping):
            raise InvalidJwksError("every JWKS key must be an object")
        kid = entry.get("kid")
        usable = (
            isinstance(kid, str)
            and entry.get("kty") == "OKP"
            and entry.get("crv") == "Ed25519"
            and entry.get("alg", ALGORITHM) == ALGORITHM
            and entry.get("use", "sig") == "sig"
            and isinstance(entry.get("x"), str)
        )
        if not usable:
            # Another key type can never verify an EdDSA token; leaving it out
            # makes a token naming it fail the kid check.
            _log.debug("ignoring JWKS key %r: not an Ed25519 signing key", kid)
            continue
        assert isinstance(kid, str)
        try:
            raw = _b64url_decode(entry["x"])
            loaded[kid] = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            raise InvalidJwksError(f"key {kid!r}: bad 'x': {exc}") from exc
    return loaded


class TokenVerifier:
    """Verifies Felix tokens against a JWKS; build once, call :meth:`verify` per ``auth``."""

    def __init__(
        self,
        jwks: Mapping[str, Any],
        *,
        issuer: str = ISSUER,
        audience: str = AUDIENCE,
        leeway_seconds: int = LEEWAY_SECONDS,
    ) -> None:
        self._keys = _load_jwks(jwks)
        self._issuer = issuer
        self._audience = audience
        self._leeway = leeway_seconds

    @classmethod
    def from_file(cls, path: Path) -> TokenVerifier:
        """A verifier for the JWKS JSON document at ``path``."""
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidJwksError(f"cannot read JWKS {path}: {exc}") from exc
        return cls(document)

    def verify(self, token: str, tenant_id: str) -> Principal:
        """Check ``token`` for a client that named ``tenant_id``; raise a :class:`TokenError`."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise MalformedTokenError(f"not a JWT: {exc}") from None
        alg = header.get("alg")
        if alg != ALGORITHM:
            raise AlgorithmRefusedError(f"algorithm {alg!r} refused; only EdDSA is accepted")
        kid = header.get("kid")
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise UnknownKeyIdError(f"key id {kid!r} is not in the JWKS")
        claims = self._decode(token, key)

        tid = claims.get("tid")
        if not isinstance(tid, str):
            raise MissingClaimError("token has no 'tid' claim")
        if tid != tenant_id:
            raise TenantMismatchError(
                f"token is for tenant {tid!r}, the client named {tenant_id!r}"
            )
        subject = claims.get("sub")
        if not isinstance(subject, str):
            raise MissingClaimError("token has no 'sub' claim")
        perms = claims.get("perms", [])
        if not isinstance(perms, list) or not all(isinstance(p, str) for p in perms):
            raise MalformedTokenError("'perms' must be a list of strings")
        try:
            permissions = PermissionSet.parse(perms)
        except InvalidPermissionError as exc:
            raise PermissionsRefusedError(str(exc)) from None
        return Principal(
            subject=subject,
            tenant_id=tid,
            permissions=permissions,
            expires_at=int(claims["exp"]),
        )

    def _decode(self, token: str, key: Ed25519PublicKey) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[ALGORITHM],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.InvalidSignatureError:
            raise SignatureError("signature does not verify") from None
        except jwt.ExpiredSignatureError:
            raise TokenExpiredError("token expired (exp beyond leeway)") from None
        except jwt.ImmatureSignatureError:
            raise TokenNotYetValidError("token not yet valid (nbf/iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise AudienceError(f"audience is not {self._audience!r}") from None
        except jwt.InvalidIssuerError:
            raise IssuerError(f"issuer is not {self._issuer!r}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise MissingClaimError(f"token has no {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise MalformedTokenError(f"token refused: {exc}") from None
        return claims
