"""`felix-broker fixture --control-plane` runs a control plane and a broker together."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest

from ..conftest import start_fixture_broker

felix = pytest.importorskip("felix", reason="the official client is a test dependency")

pytestmark = pytest.mark.timeout(60)


def test_one_command_runs_the_control_plane_and_the_broker(tmp_path: Path) -> None:
    process, fx = start_fixture_broker(tmp_path, args=("--control-plane",))
    try:
        url = fx["controlplane_url"]
        with urllib.request.urlopen(f"{url}/v1/tenants/t1/.well-known/jwks.json", timeout=5) as r:
            kids = {key["kid"] for key in json.loads(r.read())["keys"]}
        assert kids  # the tenant's signing key, which signed the fixture's tokens
        client = felix.Client(fx["addrs"], tenant_id="t1", token=fx["token"], ca_file=fx["ca_file"])
        # The catalog came from the control plane's API (4 shards, as created there).
        assert client.stream_shards("t1", fx["namespace"], fx["durable_stream"]) == 4
        sub = client.subscribe("t1", fx["namespace"], fx["memory_stream"])
        client.publish("t1", fx["namespace"], fx["memory_stream"], b"hello")
        assert sub.next_event(timeout=10).payload == b"hello"
        limited = felix.Client(
            fx["addrs"], tenant_id="t1", token=fx["unauthorized_token"], ca_file=fx["ca_file"]
        )
        with pytest.raises(felix.AuthError):
            limited.publish("t1", fx["namespace"], fx["memory_stream"], b"x")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert process.stderr is not None
        assert b"Traceback" not in process.stderr.read()
