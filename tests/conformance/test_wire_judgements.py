"""The kit's judgements of bytes and handshakes that no transcript matcher makes:
the compact-JSON check (G2) and the handshake step (T2, T3)."""

from __future__ import annotations

import pytest

from felix_conformance.corpus import load_corpus, select
from felix_conformance.coverage import compute_coverage, format_coverage
from felix_conformance.frames import decode_received, encoding_problems
from felix_conformance.requirements import NOT_JUDGEABLE, REQUIREMENT_IDS
from felix_conformance.runner import run_cases
from felix_conformance.target import Advertised, Target
from felix_conformance.verdicts import Verdict
from felix_transport import (
    FELIX_ALPN,
    Connection,
    TransportConfig,
    generate_ca,
    generate_leaf,
    serve,
)
from felix_wire.flags import KNOWN_FLAGS


def _problems(payload: bytes) -> list[str]:
    return encoding_problems(decode_received(0, payload))


def test_compact_catalogue_order_passes() -> None:
    assert _problems(b'{"type":"auth_ok","server_flags":1,"server_features":2}') == []
    # Whitespace inside a string is the string's, not the encoding's.
    assert _problems(b'{"type":"error","message":"a b\\" c","code":"not_found"}') == []


def test_whitespace_outside_strings_is_caught() -> None:
    (problem,) = _problems(b'{"type": "auth_ok","server_flags":1}')
    assert "whitespace outside strings at byte 8" in problem


def test_type_not_first_is_caught() -> None:
    (problem,) = _problems(b'{"server_flags":1,"type":"auth_ok"}')
    assert "'type' is not the first key" in problem


def test_fields_out_of_catalogue_order_are_caught() -> None:
    (problem,) = _problems(b'{"type":"auth_ok","server_features":2,"server_flags":1}')
    assert "out of catalogue order" in problem


def test_binary_frames_have_no_json_encoding_to_judge() -> None:
    assert encoding_problems(decode_received(0x0010, b"\x00" * 12)) == []


def test_not_judgeable_requirements_are_counted_apart_with_reasons() -> None:
    assert set(NOT_JUDGEABLE) <= set(REQUIREMENT_IDS)
    coverage = compute_coverage(load_corpus())
    requirements = coverage.get("requirements")
    assert not set(requirements.missing) & set(NOT_JUDGEABLE)
    text = format_coverage(coverage)
    line = next(t for t in text.splitlines() if t.startswith("  not judgeable over the wire: "))
    for requirement_id, why in NOT_JUDGEABLE.items():
        assert f"{requirement_id} ({why})" in line


async def _transport_only(config: TransportConfig) -> dict[str, Verdict]:
    """The handshake cases against a bare QUIC server (no protocol behind it) with
    `config`'s ALPN settings; the verdict of each case."""

    async def hold(connection: Connection) -> None:
        await connection.wait_closed()

    server = await serve(config, "127.0.0.1", 0, hold)
    try:
        host, port = server.address
        target = Target(host, port, CA.cert_pem, "localhost", {"tenant_id": "t", "token": "x"})
        cases = select(load_corpus(), ["transport.alpn-absent", "transport.alpn-internal-only"])
        report = await run_cases(cases, target, Advertised(KNOWN_FLAGS, 0, False))
    finally:
        server.close()
    return {r.case.id: r.verdict for r in report.results}


CA = generate_ca("wire judgements CA")
LEAF = generate_leaf(CA)


@pytest.mark.timeout(120)
async def test_a_broker_requiring_alpn_fails_the_no_alpn_case() -> None:
    config = TransportConfig.server(LEAF.cert_pem + CA.cert_pem, LEAF.key_pem, require_alpn=True)
    verdicts = await _transport_only(config)
    assert verdicts == {
        "transport.alpn-absent": Verdict.FAIL,
        "transport.alpn-internal-only": Verdict.PASS,
    }


@pytest.mark.timeout(120)
async def test_a_listener_taking_the_internal_alpn_fails_the_refusal_case() -> None:
    config = TransportConfig.server(
        LEAF.cert_pem + CA.cert_pem, LEAF.key_pem, alpn_protocols=(FELIX_ALPN, "felix-internal/1")
    )
    verdicts = await _transport_only(config)
    # The no-ALPN case gets past its handshake and fails only for want of a broker.
    assert verdicts["transport.alpn-internal-only"] is Verdict.FAIL
