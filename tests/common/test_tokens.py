"""Felix tokens with real Ed25519 keys: issuing, JWKS, and every verification check."""

from __future__ import annotations

import base64
import json
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from felix_common.permissions import stream_object
from felix_common.tokens import (
    DEV_KEY_FILE,
    AlgorithmRefusedError,
    AudienceError,
    DevIssuer,
    InvalidJwksError,
    IssuerError,
    MalformedTokenError,
    MissingClaimError,
    PermissionsRefusedError,
    SignatureError,
    TenantMismatchError,
    TokenError,
    TokenExpiredError,
    TokenNotYetValidError,
    TokenVerifier,
    UnknownKeyIdError,
)

pytestmark = pytest.mark.timeout(10)

PERMS = ["stream.publish:stream:t1/ns/orders", "stream.subscribe:stream:t1/ns/*"]


@pytest.fixture
def issuer(tmp_path: Path) -> DevIssuer:
    return DevIssuer.load_or_create(tmp_path)


@pytest.fixture
def verifier(issuer: DevIssuer) -> TokenVerifier:
    return TokenVerifier(issuer.jwks())


def _sign(issuer_key: Ed25519PrivateKey, kid: str, **overrides: Any) -> str:
    """A token built by hand, for claims the issuer would never mint."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": "felix-auth",
        "aud": "felix-broker",
        "sub": "alice",
        "tid": "t1",
        "perms": PERMS,
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, issuer_key, algorithm="EdDSA", headers={"kid": kid})


def _issuer_key(tmp_path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key((tmp_path / DEV_KEY_FILE).read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def test_valid_token(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    token = issuer.mint("t1", subject="alice", perms=PERMS)
    principal = verifier.verify(token, "t1")
    assert principal.subject == "alice"
    assert principal.tenant_id == "t1"
    assert principal.permissions.allows("stream.publish", stream_object("t1", "ns", "orders"))
    assert not principal.permissions.allows("stream.publish", stream_object("t1", "ns", "x"))
    assert principal.expires_at > time.time() + 800
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "EdDSA" and header["kid"] == issuer.kid


def test_key_file_created_once_with_mode_0600(tmp_path: Path) -> None:
    first = DevIssuer.load_or_create(tmp_path)
    path = tmp_path / DEV_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    content = path.read_bytes()
    second = DevIssuer.load_or_create(tmp_path)
    assert path.read_bytes() == content
    assert second.kid == first.kid
    # A token from the first instance verifies with the second one's JWKS.
    token = first.mint("t1", subject="a", perms=[])
    assert TokenVerifier(second.jwks()).verify(token, "t1").subject == "a"


def test_jwks_shape(issuer: DevIssuer) -> None:
    jwks = issuer.jwks()
    assert list(jwks) == ["keys"] and len(jwks["keys"]) == 1
    key = jwks["keys"][0]
    assert {k: key[k] for k in ("kty", "crv", "alg", "use")} == {
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "use": "sig",
    }
    assert key["kid"] == issuer.kid
    assert len(base64.urlsafe_b64decode(key["x"] + "=")) == 32
    json.dumps(jwks)  # serializable as it is


def test_hs256_token_refused(verifier: TokenVerifier, issuer: DevIssuer) -> None:
    # The classic confusion attack: HMAC "signed" with the public key as secret.
    secret = issuer.jwks()["keys"][0]["x"].encode() * 2
    token = jwt.encode(
        {"iss": "felix-auth", "aud": "felix-broker", "sub": "a", "tid": "t1",
         "exp": int(time.time()) + 60},
        secret,
        algorithm="HS256",
        headers={"kid": issuer.kid},
    )  # fmt: skip
    with pytest.raises(AlgorithmRefusedError) as info:
        verifier.verify(token, "t1")
    assert info.value.check == "alg"


def test_es256_token_refused(verifier: TokenVerifier, issuer: DevIssuer) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode({"sub": "a"}, key, algorithm="ES256", headers={"kid": issuer.kid})
    with pytest.raises(AlgorithmRefusedError):
        verifier.verify(token, "t1")


def test_alg_none_refused(verifier: TokenVerifier, issuer: DevIssuer) -> None:
    header = base64.urlsafe_b64encode(
        json.dumps({"alg": "none", "kid": issuer.kid}).encode()
    ).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps({"tid": "t1"}).encode()).rstrip(b"=")
    with pytest.raises(AlgorithmRefusedError):
        verifier.verify((header + b"." + body + b".").decode(), "t1")


def test_unknown_kid(tmp_path: Path, verifier: TokenVerifier) -> None:
    DevIssuer.load_or_create(tmp_path)
    with pytest.raises(UnknownKeyIdError) as info:
        verifier.verify(_sign(_issuer_key(tmp_path), "someone-else"), "t1")
    assert info.value.check == "kid"


def test_missing_kid(tmp_path: Path, verifier: TokenVerifier) -> None:
    token = jwt.encode({"sub": "a"}, _issuer_key(tmp_path), algorithm="EdDSA")
    with pytest.raises(UnknownKeyIdError):
        verifier.verify(token, "t1")


def test_forged_token_signed_by_another_key(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    forger = Ed25519PrivateKey.generate()
    with pytest.raises(SignatureError) as info:
        verifier.verify(_sign(forger, issuer.kid), "t1")
    assert info.value.check == "signature"


def test_wrong_issuer(tmp_path: Path, issuer: DevIssuer, verifier: TokenVerifier) -> None:
    with pytest.raises(IssuerError):
        verifier.verify(_sign(_issuer_key(tmp_path), issuer.kid, iss="evil-auth"), "t1")


def test_wrong_audience(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    token = issuer.mint("t1", subject="a", perms=[], audience="felix-controlplane")
    with pytest.raises(AudienceError) as info:
        verifier.verify(token, "t1")
    assert info.value.check == "aud"


def test_expired_beyond_leeway(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    # Expired 100 s ago: past the 60 s leeway.
    token = issuer.mint("t1", subject="a", perms=[], ttl_seconds=900,
                        issued_at=int(time.time()) - 1000)  # fmt: skip
    with pytest.raises(TokenExpiredError) as info:
        verifier.verify(token, "t1")
    assert info.value.check == "exp"


def test_expired_within_leeway_is_accepted(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    # Expired 30 s ago: inside the 60 s leeway.
    token = issuer.mint("t1", subject="a", perms=[], ttl_seconds=900,
                        issued_at=int(time.time()) - 930)  # fmt: skip
    assert verifier.verify(token, "t1").subject == "a"


def test_nbf_in_the_future(tmp_path: Path, issuer: DevIssuer, verifier: TokenVerifier) -> None:
    now = int(time.time())
    token = _sign(_issuer_key(tmp_path), issuer.kid, nbf=now + 300, iat=now)
    with pytest.raises(TokenNotYetValidError) as info:
        verifier.verify(token, "t1")
    assert info.value.check == "nbf"


def test_nbf_within_leeway_is_accepted(tmp_path: Path, issuer: DevIssuer,
                                       verifier: TokenVerifier) -> None:  # fmt: skip
    now = int(time.time())
    token = _sign(_issuer_key(tmp_path), issuer.kid, nbf=now + 30, iat=now)
    assert verifier.verify(token, "t1").tenant_id == "t1"


def test_tenant_mismatch(issuer: DevIssuer, verifier: TokenVerifier) -> None:
    token = issuer.mint("t1", subject="a", perms=[])
    with pytest.raises(TenantMismatchError) as info:
        verifier.verify(token, "t2")
    assert info.value.check == "tid"


def test_unknown_action_in_perms(tmp_path: Path, issuer: DevIssuer,
                                 verifier: TokenVerifier) -> None:  # fmt: skip
    token = _sign(_issuer_key(tmp_path), issuer.kid, perms=[*PERMS, "stream.delete:stream:*"])
    with pytest.raises(PermissionsRefusedError) as info:
        verifier.verify(token, "t1")
    assert info.value.check == "perms"


def test_mint_refuses_unknown_action(issuer: DevIssuer) -> None:
    with pytest.raises(ValueError, match="unknown action"):
        issuer.mint("t1", subject="a", perms=["stream.delete:stream:*"])


@pytest.mark.parametrize(
    ("claims", "error"),
    [
        ({"tid": None}, MissingClaimError),
        ({"sub": None}, MissingClaimError),
        ({"exp": None}, MissingClaimError),
        ({"perms": "stream.publish:*"}, MalformedTokenError),
        ({"perms": [1, 2]}, MalformedTokenError),
    ],
)
def test_missing_and_malformed_claims(
    tmp_path: Path,
    issuer: DevIssuer,
    verifier: TokenVerifier,
    claims: dict[str, Any],
    error: type[TokenError],
) -> None:
    with pytest.raises(error):
        verifier.verify(_sign(_issuer_key(tmp_path), issuer.kid, **claims), "t1")


def test_missing_perms_means_no_permissions(tmp_path: Path, issuer: DevIssuer,
                                            verifier: TokenVerifier) -> None:  # fmt: skip
    principal = verifier.verify(_sign(_issuer_key(tmp_path), issuer.kid, perms=None), "t1")
    assert principal.permissions.grants == ()


def test_garbage_is_malformed(verifier: TokenVerifier) -> None:
    with pytest.raises(MalformedTokenError):
        verifier.verify("not-a-jwt", "t1")


def test_every_failure_is_unauthenticated_and_fatal() -> None:
    for error in (AlgorithmRefusedError, UnknownKeyIdError, TokenExpiredError):
        assert error.wire_code == "unauthenticated" and error.retry_class == "fatal"


def test_jwks_with_other_key_types(tmp_path: Path, issuer: DevIssuer) -> None:
    jwks = {"keys": [{"kty": "RSA", "kid": "rsa-1", "n": "x", "e": "AQAB"},
                     *issuer.jwks()["keys"]]}  # fmt: skip
    verifier = TokenVerifier(jwks)
    assert verifier.verify(issuer.mint("t1", subject="a", perms=[]), "t1").subject == "a"
    with pytest.raises(UnknownKeyIdError):
        verifier.verify(_sign(_issuer_key(tmp_path), "rsa-1"), "t1")


@pytest.mark.parametrize(
    "jwks",
    [
        {},
        {"keys": "nope"},
        {"keys": [1]},
        {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k", "x": "AAAA"}]},
    ],
)
def test_bad_jwks(jwks: dict[str, Any]) -> None:
    with pytest.raises(InvalidJwksError):
        TokenVerifier(jwks)


def test_verifier_from_file(tmp_path: Path, issuer: DevIssuer) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(issuer.jwks()), encoding="utf-8")
    verifier = TokenVerifier.from_file(path)
    assert verifier.verify(issuer.mint("t1", subject="b", perms=[]), "t1").subject == "b"
    with pytest.raises(InvalidJwksError):
        TokenVerifier.from_file(tmp_path / "missing.json")
