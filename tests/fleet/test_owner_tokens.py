"""The owner verifies every forwarded token against the tenant's keys, and reuses a
verification for a bounded time (never past the token's expiry), so a busy stream's
batches are not each verified again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from felix_broker.cli import full_rights
from felix_broker.fleet import owner as owner_module
from felix_broker.fleet.owner import OwnerService
from felix_common.tokens import DevIssuer, Principal, TokenError, TokenVerifier


def _owner(verify: Any) -> OwnerService:
    return OwnerService(
        view=None,  # type: ignore[arg-type]
        catalog=None,  # type: ignore[arg-type]
        engine=None,  # type: ignore[arg-type]
        table=None,  # type: ignore[arg-type]
        verify=verify,
        server_flags=0,
        features=lambda: 0,
        max_frame_bytes=65536,
        metrics=None,  # type: ignore[arg-type]
    )


def test_a_verification_is_reused_within_its_bounds(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    issuer = DevIssuer.load_or_create(tmp_path)
    verifier = TokenVerifier(issuer.jwks())
    calls: list[str] = []

    def verify(token: str, tenant: str) -> Principal:
        calls.append(token)
        return verifier.verify(token, tenant)

    owner = _owner(verify)
    good = issuer.mint("t1", subject="a", perms=full_rights("t1"))
    for _ in range(50):
        assert owner._verified_principal(good, "t1").subject == "a"
    assert len(calls) == 1
    # Past the reuse bound it is verified again.
    monkeypatch.setattr(owner_module, "VERIFIED_TTL", 0.0)
    owner._verified_principal(good, "t1")
    assert len(calls) == 2
    # A refused token is never remembered: refused every time.
    forged = good[:-4] + "AAAA"
    for _ in range(2):
        with pytest.raises(TokenError):
            owner._verified_principal(forged, "t1")
    assert calls.count(forged) == 2
    # Another tenant's name is a different verification.
    with pytest.raises(TokenError):
        owner._verified_principal(good, "t2")


def test_an_expired_token_is_not_served_from_the_cache(tmp_path: Path) -> None:
    issuer = DevIssuer.load_or_create(tmp_path)
    verifier = TokenVerifier(issuer.jwks())
    owner = _owner(verifier.verify)
    token = issuer.mint("t1", subject="a", perms=full_rights("t1"))
    principal = owner._verified_principal(token, "t1")
    # The cached principal says it expired: the cache must not hand it out.
    key = (token, "t1")
    owner._verified[key] = (
        Principal(
            principal.subject, principal.tenant_id, principal.permissions, int(time.time()) - 1
        ),
        time.time(),
    )
    assert owner._verified_principal(token, "t1").expires_at > time.time()
