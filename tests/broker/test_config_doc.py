"""docs/configuration.md is what felix_broker.config_doc renders from the code, and
every knob the broker ignores is said to be ignored there and warned about."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from felix_broker.config import BrokerConfig, load_config, warn_ignored_knobs
from felix_broker.config_doc import DOC_PATH, render

IGNORED = {
    "cache_send_window",
    "pub_workers_per_conn",
    "subscriber_writer_lanes",
    "subscriber_lane_queue_depth",
    "max_subscriber_writer_lanes",
    "subscriber_lane_shard",
    "fanout_batch_size",
}


def test_configuration_reference_is_up_to_date() -> None:
    assert DOC_PATH.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run python -m felix_broker.config_doc"
    )


def test_every_knob_is_documented_with_its_variables() -> None:
    text = render()
    for f in dataclasses.fields(BrokerConfig):
        knob = f.metadata.get("knob")
        if knob is None:
            continue
        line = next(row for row in text.splitlines() if row.startswith(f"| `{f.name}` |"))
        assert knob.doc and all(f"`{env}`" in line for env in knob.env), line
        assert ("**ignored**" in line) == (f.name in IGNORED), line


def test_ignored_knobs_warn_once_at_start_when_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    quiet = load_config(environ={}, cwd=tmp_path)
    assert quiet.ignored_knobs() == {}
    config = load_config(
        environ={"FELIX_SUB_WRITER_LANES": "8", "FELIX_FANOUT_BATCH": "128"}, cwd=tmp_path
    )
    with caplog.at_level(logging.WARNING, logger="felix_broker.config"):
        warn_ignored_knobs(config)
    warned = sorted(r.getMessage().split(" ")[0] for r in caplog.records)
    assert warned == ["fanout_batch_size", "subscriber_writer_lanes"]
