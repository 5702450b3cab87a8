"""TLS material for the broker's QUIC listener.

With ``tls_cert``/``tls_key`` configured, those files are used as they are.
Otherwise the first start creates a development CA and a ``localhost`` leaf
(SAN ``localhost`` and ``127.0.0.1``) under ``<data_dir>/tls/`` and later
starts reuse them, so clients that trusted the CA once keep working. A leaf
that has expired (or will within a day), does not match its key or was not
issued by the current CA is reissued from the CA.

When a cert-export path is configured, the certificate clients should trust
is written there: the CA (the generated one, or ``tls_ca``); with a
configured certificate and no ``tls_ca``, the configured certificate itself.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from felix_common.files import replace_file, warn_if_readable_by_others
from felix_transport.certs import CertKeyPair, generate_ca, generate_leaf

__all__ = ["TLS_DIR", "TlsMaterial", "prepare_tls"]

_log = logging.getLogger(__name__)

TLS_DIR = "tls"
_CA_CERT = "ca.pem"
_CA_KEY = "ca.key"
_LEAF_CERT = "broker.pem"
_LEAF_KEY = "broker.key"
_RENEW_BEFORE = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The files the QUIC listener loads, and the trust anchor clients need."""

    cert_path: Path
    key_path: Path
    ca_path: Path | None
    generated: bool

    def chain_pem(self) -> bytes:
        """The server certificate chain: the leaf, then its CA when known."""
        chain = self.cert_path.read_bytes()
        if self.ca_path is not None and self.ca_path != self.cert_path:
            chain = chain.rstrip(b"\n") + b"\n" + self.ca_path.read_bytes()
        return chain

    def key_pem(self) -> bytes:
        """The server private key (PEM)."""
        return self.key_path.read_bytes()


def _same_public_key(cert: x509.Certificate, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return key.public_key().public_bytes(der, spki) == cert.public_key().public_bytes(der, spki)


def _ensure_ca(folder: Path) -> CertKeyPair:
    cert_path, key_path = folder / _CA_CERT, folder / _CA_KEY
    if cert_path.exists() and key_path.exists():
        ca = CertKeyPair(cert_path.read_bytes(), key_path.read_bytes())
        if _same_public_key(x509.load_pem_x509_certificate(ca.cert_pem), ca.key_pem):
            warn_if_readable_by_others(key_path)
            return ca
        _log.warning("development CA %s does not match its key; creating a new CA", cert_path)
    ca = generate_ca()
    # Key first, certificate last: a start interrupted in between leaves no
    # certificate, so the next start creates the pair again.
    replace_file(key_path, ca.key_pem, mode=0o600)
    replace_file(cert_path, ca.cert_pem, mode=0o644)
    _log.info("created development CA %s", cert_path)
    return ca


def _leaf_usable(cert_path: Path, key_path: Path, ca: CertKeyPair) -> bool:
    if not (cert_path.exists() and key_path.exists()):
        return False
    leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    try:
        leaf.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        # Issued by another CA (the CA was recreated): every client that
        # trusts the current CA would refuse it.
        _log.info("development certificate %s is not from the current CA; reissuing", cert_path)
        return False
    if not _same_public_key(leaf, key_path.read_bytes()):
        _log.info("development certificate %s does not match its key; reissuing", cert_path)
        return False
    if leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC) < _RENEW_BEFORE:
        _log.info("development certificate %s expires soon; reissuing", cert_path)
        return False
    return True


def _ensure_leaf(folder: Path, ca: CertKeyPair) -> None:
    cert_path, key_path = folder / _LEAF_CERT, folder / _LEAF_KEY
    if _leaf_usable(cert_path, key_path, ca):
        warn_if_readable_by_others(key_path)
        return
    leaf = generate_leaf(ca)
    replace_file(key_path, leaf.key_pem, mode=0o600)
    replace_file(cert_path, leaf.cert_pem, mode=0o644)
    _log.info("created development certificate %s for localhost", cert_path)


def prepare_tls(
    *,
    data_dir: Path,
    cert: Path | None = None,
    key: Path | None = None,
    ca: Path | None = None,
    cert_export: Path | None = None,
) -> TlsMaterial:
    """Resolve (and on first start create) the broker's TLS files; export the trust anchor."""
    if (cert is None) != (key is None):
        raise ValueError("a TLS certificate and its key must be configured together")
    if cert is not None and key is not None:
        for path in (cert, key, *((ca,) if ca is not None else ())):
            if not path.is_file():
                raise FileNotFoundError(f"TLS file {path} does not exist")
        material = TlsMaterial(cert_path=cert, key_path=key, ca_path=ca, generated=False)
        trust = ca if ca is not None else cert
    else:
        folder = data_dir / TLS_DIR
        _ensure_leaf(folder, _ensure_ca(folder))
        material = TlsMaterial(
            cert_path=folder / _LEAF_CERT,
            key_path=folder / _LEAF_KEY,
            ca_path=folder / _CA_CERT,
            generated=True,
        )
        trust = folder / _CA_CERT
    if cert_export is not None:
        replace_file(cert_export, trust.read_bytes(), mode=0o644)
        _log.info("exported the TLS trust anchor to %s", cert_export)
    return material
