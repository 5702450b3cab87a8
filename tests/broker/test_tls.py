"""TLS bootstrap: a development CA and localhost leaf, created once and reused."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from felix_broker.tls import TLS_DIR, prepare_tls
from felix_transport.certs import generate_ca, generate_leaf

pytestmark = pytest.mark.timeout(20)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_first_start_creates_ca_and_leaf(tmp_path: Path) -> None:
    material = prepare_tls(data_dir=tmp_path)
    assert material.generated
    assert material.ca_path is not None
    assert material.cert_path.parent == tmp_path / TLS_DIR
    for key_file in (material.key_path, tmp_path / TLS_DIR / "ca.key"):
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    leaf, ca = _cert(material.cert_path), _cert(material.ca_path)
    leaf.verify_directly_issued_by(ca)  # raises if the leaf is not signed by the CA
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    key = serialization.load_pem_private_key(material.key_pem(), None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    assert key.public_key().public_bytes(der, spki) == leaf.public_key().public_bytes(der, spki)

    chain = x509.load_pem_x509_certificates(material.chain_pem())
    assert [c.subject for c in chain] == [leaf.subject, ca.subject]


def test_later_starts_reuse_the_files(tmp_path: Path) -> None:
    first = prepare_tls(data_dir=tmp_path)
    folder = tmp_path / TLS_DIR
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    second = prepare_tls(data_dir=tmp_path)
    assert second == first
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_cert_export_writes_the_ca(tmp_path: Path) -> None:
    export = tmp_path / "out" / "felix-ca.pem"
    material = prepare_tls(data_dir=tmp_path / "data", cert_export=export)
    assert material.ca_path is not None
    assert export.read_bytes() == material.ca_path.read_bytes()
    assert _cert(export).extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_leaf_reissued_when_key_does_not_match(tmp_path: Path) -> None:
    material = prepare_tls(data_dir=tmp_path)
    ca_before = material.ca_path.read_bytes() if material.ca_path else b""
    # A different key beside the certificate, as an interrupted write could leave.
    other = generate_leaf(generate_ca())
    material.key_path.write_bytes(other.key_pem)
    again = prepare_tls(data_dir=tmp_path)
    leaf = _cert(again.cert_path)
    key = serialization.load_pem_private_key(again.key_pem(), None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    assert key.public_key().public_bytes(der, spki) == leaf.public_key().public_bytes(der, spki)
    assert again.ca_path is not None and again.ca_path.read_bytes() == ca_before


def test_leaf_reissued_when_ca_replaced(tmp_path: Path) -> None:
    prepare_tls(data_dir=tmp_path)
    folder = tmp_path / TLS_DIR
    (folder / "ca.pem").unlink()  # the CA is gone; a new one is made
    material = prepare_tls(data_dir=tmp_path)
    assert material.ca_path is not None
    _cert(material.cert_path).verify_directly_issued_by(_cert(material.ca_path))


def test_expiring_leaf_is_reissued(tmp_path: Path) -> None:
    material = prepare_tls(data_dir=tmp_path)
    folder = tmp_path / TLS_DIR
    ca = generate_ca()
    # Install a CA plus a leaf that expires in well under a day.
    (folder / "ca.pem").write_bytes(ca.cert_pem)
    (folder / "ca.key").write_bytes(ca.key_pem)
    short = generate_leaf(ca, valid_days=0)
    material.cert_path.write_bytes(short.cert_pem)
    material.key_path.write_bytes(short.key_pem)
    again = prepare_tls(data_dir=tmp_path)
    leaf = _cert(again.cert_path)
    assert leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(
        days=30
    )
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))


def test_configured_certificate_is_used_as_is(tmp_path: Path) -> None:
    ca = generate_ca()
    leaf = generate_leaf(ca)
    cert, key, ca_file = tmp_path / "c.pem", tmp_path / "c.key", tmp_path / "ca.pem"
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    ca_file.write_bytes(ca.cert_pem)
    export = tmp_path / "export.pem"
    material = prepare_tls(data_dir=tmp_path / "data", cert=cert, key=key, ca=ca_file,
                           cert_export=export)  # fmt: skip
    assert (material.cert_path, material.key_path, material.ca_path) == (cert, key, ca_file)
    assert not material.generated
    assert export.read_bytes() == ca.cert_pem
    assert not (tmp_path / "data" / TLS_DIR).exists()

    # Without a CA, the certificate itself is what clients must trust.
    no_ca = prepare_tls(data_dir=tmp_path / "data", cert=cert, key=key, cert_export=export)
    assert no_ca.ca_path is None
    assert export.read_bytes() == leaf.cert_pem


def test_configured_files_must_exist(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        prepare_tls(data_dir=tmp_path, cert=tmp_path / "x.pem", key=tmp_path / "x.key")
    with pytest.raises(ValueError):
        prepare_tls(data_dir=tmp_path, cert=tmp_path / "x.pem")
