"""Development certificates that both QUIC stacks and the official client accept.

qh3's client refuses a CA=True certificate used as the server's own, and the
official client (rustls) verifies a chain against its ``ca_file``; so a server
needs a small CA plus a CA=False leaf with the SANs the client checks
(``localhost`` and ``127.0.0.1`` by default).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertKeyPair", "KeyType", "generate_ca", "generate_leaf"]

KeyType = Literal["p256", "ed25519"]
_PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey

# Backdate validity a little so a peer whose clock is slightly behind still
# accepts a certificate generated a moment ago.
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class CertKeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes


def _new_key(key_type: KeyType) -> _PrivateKey:
    if key_type == "p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(f"unsupported key type {key_type!r}")


def _sign_hash(key: _PrivateKey) -> hashes.SHA256 | None:
    # Ed25519 signs the message itself; X.509 signing must pass no digest.
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _key_pem(key: _PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def generate_ca(
    common_name: str = "Felix development CA",
    *,
    key_type: KeyType = "p256",
    valid_days: int = 3650,
) -> CertKeyPair:
    """Create a self-signed CA (CA=True, path length 0) that can sign leaves."""
    key = _new_key(key_type)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, _sign_hash(key))
    )
    return CertKeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def generate_leaf(
    ca: CertKeyPair,
    *,
    dns_names: Sequence[str] = ("localhost",),
    ip_addresses: Sequence[str] = ("127.0.0.1",),
    key_type: KeyType = "p256",
    valid_days: int = 825,
    client_auth: bool = False,
) -> CertKeyPair:
    """Create a server leaf signed by ``ca``: CA=False, SAN DNS + IP, serverAuth EKU
    (and clientAuth with ``client_auth``: a fleet peer certificate serves both ways).

    ``cert_pem`` holds the leaf only; a server loads ``leaf + ca`` as its chain
    (see :meth:`felix_transport.config.TransportConfig.server`).
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a leaf needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise TypeError("the CA key must be ECDSA or Ed25519")
    key = _new_key(key_type)
    public_key = key.public_key()
    san: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    san += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    subject_cn = dns_names[0] if dns_names else ip_addresses[0]
    now = datetime.datetime.now(datetime.UTC)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH]
                + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, _sign_hash(ca_key))
    )
    return CertKeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))
