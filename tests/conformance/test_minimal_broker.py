"""The kit against a deliberately minimal broker: it must finish with a verdict
for every case it selected, within bounded time, with no crash and no hang."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from felix_conformance.cli import EXIT_FAILED, EXIT_OK, main
from felix_conformance.corpus import load_corpus, select
from felix_conformance.verdicts import Verdict

from .minimal_broker import MinimalBroker

VERDICTS = {v.value for v in Verdict}


async def _run_kit(broker: MinimalBroker, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    host, port = await broker.start()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(broker.ca_pem)
    report = tmp_path / "report.json"
    argv = [
        "--target", f"{host}:{port}", "--ca-file", str(ca), "--tenant", "t1",
        "--token", "any", "--json", str(report), "--html", str(tmp_path / "r.html"),
        # It has no streams or caches at all, but is told it has: the cases must run and fail.
        "--set", "memory_stream=events", "--set", "durable_stream=log", "--set", "cache=kv",
        "--set", "single_shard_cache=kv1", "--set", "unauthorized_token=nobody", *extra,
    ]  # fmt: skip
    try:
        # The CLI runs its own event loop: give it a thread, keep ours serving.
        code = await asyncio.to_thread(main, argv)
    finally:
        await broker.close()
    return code, json.loads(report.read_text())


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["error", "close"])
async def test_the_whole_corpus_finishes_against_a_minimal_broker(
    mode: str, tmp_path: Path
) -> None:
    code, report = await _run_kit(MinimalBroker(mode), tmp_path, "--strict")
    assert code in (EXIT_OK, EXIT_FAILED)
    assert len(report["cases"]) == len(select(load_corpus(), strict=True))
    assert {c["verdict"] for c in report["cases"]} <= VERDICTS
    verdicts = {c["id"]: c["verdict"] for c in report["cases"]}
    # It advertises nothing: every gated case is unsupported, never a fail.
    assert verdicts["gated.counters"] == "unsupported"
    assert verdicts["discovery.stream-shards"] == "unsupported"
    # It does answer auth as the protocol says.
    assert verdicts["auth.auth-ok-with-client-flags"] == "pass"
    assert code == EXIT_FAILED  # and it fails what it does not serve
    assert "<html" in (tmp_path / "r.html").read_text()


@pytest.mark.timeout(120)
async def test_a_silent_broker_fails_by_timeout_not_by_hanging(tmp_path: Path) -> None:
    cases = ["publish.json-publish-acked", "subscribe.*hello*", "auth.auth-ok-*"]
    started = time.monotonic()
    code, report = await _run_kit(
        MinimalBroker("silent"), tmp_path, *[a for c in cases for a in ("-t", c)]
    )
    assert time.monotonic() - started < 90
    assert code == EXIT_FAILED
    verdicts = {c["id"]: (c["verdict"], c["detail"]) for c in report["cases"]}
    assert verdicts["auth.auth-ok-with-client-flags"][0] == "pass"
    failed = [d for v, d in verdicts.values() if v == "fail"]
    assert failed and all("timeout" in d or "nothing within" in d for d in failed), verdicts
