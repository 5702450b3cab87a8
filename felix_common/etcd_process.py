"""A real etcd server as a child process: for tests and for `felix-broker fixture`.

`EtcdProcess.start()` runs the `etcd` binary on 127.0.0.1 with two free ports
(client and peer) and a data folder of its own, waits until it answers its
health endpoint, and returns. `stop()` ends it by its PID (SIGTERM, then
SIGKILL after a bound). `restart()` stops it and starts it again on the same
ports and data, which is how tests take etcd away under a running broker.

The timings are tuned for one machine: a short raft heartbeat and election
timeout, so that a single-member cluster elects itself at once and short lease
TTLs (etcd's minimum TTL is 1.5 election timeouts) are allowed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["ETCD_INSTALL_HINT", "EtcdNotFoundError", "EtcdProcess", "find_etcd"]

ETCD_INSTALL_HINT = "etcd not found: install it with `apt-get install -y etcd-server`"

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 5.0
_PORT_ATTEMPTS = 5


class _PortTakenError(Exception):
    pass


class EtcdNotFoundError(RuntimeError):
    """No `etcd` binary on PATH (or at FELIX_ETCD_BINARY)."""


def find_etcd() -> str:
    """The etcd binary to run: FELIX_ETCD_BINARY, else `etcd` on PATH."""
    explicit = os.environ.get("FELIX_ETCD_BINARY")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise EtcdNotFoundError(f"FELIX_ETCD_BINARY={explicit} is not executable")
        return explicit
    found = shutil.which("etcd")
    if found is None:
        raise EtcdNotFoundError(ETCD_INSTALL_HINT)
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdProcess:
    """One single-member etcd cluster on loopback."""

    def __init__(self, data_dir: Path | None = None, *, name: str = "felix-etcd") -> None:
        self.binary = find_etcd()
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="felix-etcd-")) if data_dir is None else data_dir
        )
        self.name = name
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._started = False  # once started, the ports are the cluster's: never changed
        self._log_path = self.data_dir / "etcd.log"

    @property
    def endpoint(self) -> str:
        """`host:port` of the client listener (what FELIX_ETCD_ENDPOINTS takes)."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start (or start again on the same ports). At the first start a port taken
        meanwhile by another program is replaced by a fresh one (bounded attempts)."""
        if self.running:
            return
        for _ in range(_PORT_ATTEMPTS):
            try:
                self._start_once()
                self._started = True
                return
            except _PortTakenError:
                if self._started:
                    raise RuntimeError(
                        f"etcd's port was taken meanwhile: {self.log_tail()}"
                    ) from None
                self.client_port, self.peer_port = _free_port(), _free_port()
        raise RuntimeError(f"etcd found no free port in {_PORT_ATTEMPTS} attempts")

    def _start_once(self) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir / "data"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            "--max-txn-ops",
            "1024",
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self._log_path.open("ab")
        try:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        url = f"http://127.0.0.1:{self.client_port}/health"
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                self._process = None
                tail = self.log_tail()
                if "address already in use" in tail[-400:]:
                    raise _PortTakenError(tail)
                raise RuntimeError(f"etcd exited at start: {tail}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError, ValueError),
                urllib.request.urlopen(url, timeout=1) as answer,
            ):
                if b'"true"' in answer.read():
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd not healthy after {_START_TIMEOUT_S}s: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> None:
        """End the server by its PID: SIGTERM, then SIGKILL past the bound."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(_STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Stop and start again on the same ports and data (keys and revisions survive)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the data folder this object created."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
