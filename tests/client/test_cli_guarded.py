"""`felix publish --idempotent`, `felix commit`, `felix state get` and `felix inspect`
as subprocesses against the reference broker."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from .support import felix, operator_token

pytestmark = pytest.mark.timeout(120)


def _lines(done: Any) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_publish_idempotent(felix_fixture: dict[str, Any]) -> None:
    doc, stream = felix_fixture, felix_fixture["durable_stream"]
    key = os.urandom(4).hex()
    out = _lines(
        felix(doc, "publish", stream, "a", "b", "c", "--key", key, "--idempotent", "--json")
    )
    offsets = [r["offset"] for r in out]
    assert [r["published"] for r in out] == [1, 1, 1] and offsets == sorted(offsets)
    assert offsets[1:] == [offsets[0] + 1, offsets[0] + 2]
    done = felix(doc, "publish", stream, "d", "e", "--key", key, "--idempotent", "--batch")
    assert done.returncode == 0 and done.stdout.strip() == (
        f"published 2 record(s) at offset {offsets[2] + 1}"
    )
    done = felix(doc, "publish", stream, "x", "--idempotent", "--ack", "none")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    done = felix(doc, "publish", doc["missing_stream"], "x", "--idempotent")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1


def test_commit_and_state_get(felix_fixture: dict[str, Any]) -> None:
    doc, stream = felix_fixture, felix_fixture["durable_stream"]
    entity = "cli-" + os.urandom(4).hex()
    done = felix(doc, "commit", stream, entity, "created", "--put", "status=new", "--put", "n=1")
    assert done.returncode == 0, done.stderr
    offset = int(done.stdout.split()[-1])
    assert done.stdout.strip() == f"committed at offset {offset}"
    got = felix(doc, "state", "get", stream, entity, "status")
    assert got.returncode == 0 and got.stdout.strip() == f"status: new (version {offset})"
    (record,) = _lines(felix(doc, "state", "get", stream, entity, "status", "--json"))
    assert record["payload"] == "new" and record["version"] == offset
    assert record["as_of"] >= offset

    # Conditional on the tail: a stale expectation is one line and status 1.
    stale = felix(doc, "commit", stream, entity, "paid", "--delete", "n", "--expected-offset", "0")
    assert stale.returncode == 1 and "OffsetMismatchError" in stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1
    (done_json,) = _lines(
        felix(
            doc,
            "commit",
            stream,
            entity,
            "paid",
            "--delete",
            "n",
            "--expected-offset",
            str(offset + 1),
            "--json",
        )
    )
    assert done_json == {"offset": offset + 1, "changes": 1}
    gone = felix(doc, "state", "get", stream, entity, "n")
    assert gone.returncode == 0 and gone.stdout.strip() == "n: (none)"

    bad = felix(doc, "commit", stream, entity, "x", "--put", "novalue")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "felix: --put takes KEY=VALUE, not 'novalue'"
    )


def test_inspect(felix_fixture: dict[str, Any]) -> None:
    doc, stream = felix_fixture, felix_fixture["durable_stream"]
    token = asyncio.run(operator_token(doc))
    done = felix(doc, "inspect", "shard", stream, "--shard", "2", FELIX_TOKEN=token)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"stream {stream} shard 2: leader active serving")
    assert line.endswith(", 4 shard(s)")
    (view,) = _lines(felix(doc, "inspect", "shard", stream, "--json", FELIX_TOKEN=token))
    assert view["role"] == "leader" and view["node_id"] == "" and view["shards"] == 4

    listed = felix(doc, "inspect", "subscriptions", "--json", "--page-size", "2", FELIX_TOKEN=token)
    assert listed.returncode == 0, listed.stderr
    for line in listed.stdout.splitlines():
        entry = json.loads(line)
        assert {"stream", "shard", "subscriber_id", "policy", "tail"} <= set(entry)

    # Without node.view:cluster:* the broker refuses: one line, status 1.
    refused = felix(doc, "inspect", "shard", stream)
    assert refused.returncode == 1 and "ForbiddenError" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    usage = felix(doc, "inspect", "shard", stream, "--kind", "queue")
    assert usage.returncode == 2
