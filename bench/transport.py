"""Transport benchmark: qh3 vs aioquic, our datagram loop vs the stacks' stock glue.

Run: ``.venv/bin/python bench/transport.py [--quick] [--runs N]``. Loopback
only (127.0.0.1). Figures per backend, side by side with the qh3/aioquic
ratio:

- bulk MB/s: one connection, one stream, client -> server;
- ingest records/s: batches of 64 x 100 B records on one stream;
- fanout N=1 and N=10: the same 64 x 100 B batch written to N connections
  (server-opened uni streams), records delivered per second over all clients;
- round trip p50/p99 in microseconds: 100 B request -> 100 B answer.

"stock" repeats bulk, ingest and round trip through each library's own
``serve()``/``connect()`` asyncio glue (used here only, as the baseline).

``--offload-ab`` instead runs our loop with UDP GSO and GRO off and on, alternating
within each run, and prints per metric the medians, min-max and the per-run
ratio on/off (same run, same machine state).

Client and server share one process and one event loop (one core between
them), so absolute figures are lower than with separate processes; the
ratios are the point. A full run (3 runs, medians) takes about 1.5 minutes on
a 2-core machine, ``--quick`` (1 run, smaller workloads) about 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from felix_transport import (
    Connection,
    ConnectionClosedError,
    StreamClosedError,
    TransportConfig,
    build_quic_configuration,
    connect,
    generate_ca,
    generate_leaf,
    serve,
)

HOST = "127.0.0.1"
RECORD = b"r" * 100
BATCH = RECORD * 64
IMPLS = ("qh3", "aioquic")

Result = dict[str, float]


class Setup:
    def __init__(self, quick: bool) -> None:
        ca = generate_ca()
        leaf = generate_leaf(ca)
        self.chain = leaf.cert_pem + ca.cert_pem
        self.key = leaf.key_pem
        self.ca = ca.cert_pem
        self.bulk_bytes = (8 if quick else 16) * 1024 * 1024
        self.ingest_batches = 1500 if quick else 4000
        self.fanout_batches = 500 if quick else 1000
        self.round_trips = 500 if quick else 1500
        self.offload = True

    def server(self, impl: str) -> TransportConfig:
        return TransportConfig.server(
            self.chain, self.key, impl=impl, udp_gso=self.offload, udp_gro=self.offload
        )

    def client(self, impl: str) -> TransportConfig:
        return TransportConfig.client(
            self.ca, impl=impl, udp_gso=self.offload, udp_gro=self.offload
        )


# -- our loop -------------------------------------------------------------------


async def _sink(conn: Connection) -> None:
    """Server: per stream, count bytes to FIN, answer with the count; or echo RTT."""

    async def one(stream: Any) -> None:
        with contextlib.suppress(StreamClosedError):
            await _serve_stream(stream)

    with contextlib.suppress(ConnectionClosedError):
        while True:
            stream = await conn.accept_stream()
            asyncio.get_running_loop().create_task(one(stream))


async def _serve_stream(stream: Any) -> None:
    first = await stream.read(1)
    if first == b"P":  # ping-pong stream: 100 B in, 100 B out, until FIN
        pending = 99
        while True:
            while pending:
                chunk = await stream.read(pending)
                if not chunk:
                    return
                pending -= len(chunk)
            await stream.write(RECORD)
            pending = 100
    total = len(first)
    while chunk := await stream.read():
        total += len(chunk)
    await stream.write(str(total).encode(), end_stream=True)


async def ours_transfer(s: Setup, impl: str, payload: bytes, count: int) -> float:
    server = await serve(s.server(impl), HOST, 0, _sink)
    conn = await connect(s.client(impl), HOST, server.address[1])
    stream = await conn.open_bidi_stream()
    start = time.perf_counter()
    for _ in range(count):
        await stream.write(payload)
    await stream.finish()
    answer = b""
    while chunk := await stream.read():
        answer += chunk
    elapsed = time.perf_counter() - start
    assert int(answer) == len(payload) * count
    conn.close()
    server.close()
    await server.wait_closed()
    return elapsed


async def ours_rtt(s: Setup, impl: str) -> list[float]:
    server = await serve(s.server(impl), HOST, 0, _sink)
    conn = await connect(s.client(impl), HOST, server.address[1])
    stream = await conn.open_bidi_stream()
    samples = []
    request = b"P" + RECORD[1:]
    for i in range(s.round_trips + 50):
        start = time.perf_counter()
        await stream.write(request if i == 0 else RECORD)
        await stream.readexactly(100)
        if i >= 50:  # warm-up
            samples.append(time.perf_counter() - start)
    conn.close()
    server.close()
    await server.wait_closed()
    return samples


async def ours_fanout(s: Setup, impl: str, n: int) -> float:
    ready: asyncio.Queue[Connection] = asyncio.Queue()

    async def hold(conn: Connection) -> None:
        await ready.put(conn)
        await conn.wait_closed()

    server = await serve(s.server(impl), HOST, 0, hold)
    clients = [await connect(s.client(impl), HOST, server.address[1]) for _ in range(n)]
    server_conns = [await ready.get() for _ in range(n)]
    streams = [await c.open_uni_stream() for c in server_conns]
    expected = len(BATCH) * s.fanout_batches

    async def drain(conn: Connection) -> None:
        stream = await conn.accept_stream()
        got = 0
        while got < expected:
            chunk = await stream.read()
            if not chunk:
                break
            got += len(chunk)

    readers = [asyncio.create_task(drain(c)) for c in clients]
    start = time.perf_counter()
    for _ in range(s.fanout_batches):
        for stream in streams:
            await stream.write(BATCH)
    await asyncio.gather(*readers)
    elapsed = time.perf_counter() - start
    for c in clients:
        c.close()
    server.close()
    await server.wait_closed()
    return 64 * s.fanout_batches * n / elapsed


# -- the stacks' stock asyncio glue (baseline only) ---------------------------


def _stock_modules(impl: str) -> tuple[Any, Any]:
    if impl == "qh3":
        from qh3.asyncio import client as qc
        from qh3.asyncio import server as qs
    else:
        from aioquic.asyncio import client as qc  # type: ignore[no-redef]
        from aioquic.asyncio import server as qs  # type: ignore[no-redef]
    return qs, qc


async def _stock_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    first = await reader.read(1)
    if first == b"P":
        await reader.readexactly(99)
        while True:
            writer.write(RECORD)
            try:
                await reader.readexactly(100)
            except asyncio.IncompleteReadError:
                return
    total = len(first)
    while chunk := await reader.read(65536):
        total += len(chunk)
    writer.write(str(total).encode())
    writer.write_eof()


async def _stock_session(s: Setup, impl: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
    qs, qc = _stock_modules(impl)
    server_cfg = build_quic_configuration(s.server(impl), is_client=False)
    client_cfg = build_quic_configuration(s.client(impl), is_client=True)
    server = await qs.serve(
        HOST,
        0,
        configuration=server_cfg,
        stream_handler=lambda r, w: asyncio.ensure_future(_stock_handler(r, w)),
    )
    port = server._transport.get_extra_info("sockname")[1]
    try:
        async with qc.connect(HOST, port, configuration=client_cfg) as proto:
            return await body(proto)
    finally:
        server.close()


async def stock_transfer(s: Setup, impl: str, payload: bytes, count: int) -> float:
    async def body(proto: Any) -> float:
        reader, writer = await proto.create_stream()
        start = time.perf_counter()
        for _ in range(count):
            writer.write(payload)
            await asyncio.sleep(0)  # the stock writer has no drain(): just yield
        writer.write_eof()
        answer = await reader.read()
        elapsed = time.perf_counter() - start
        assert int(answer) == len(payload) * count
        return elapsed

    result: float = await _stock_session(s, impl, body)
    return result


async def stock_rtt(s: Setup, impl: str) -> list[float]:
    async def body(proto: Any) -> list[float]:
        reader, writer = await proto.create_stream()
        writer.write(b"P" + RECORD[1:])
        await reader.readexactly(100)
        samples = []
        for i in range(s.round_trips + 50):
            start = time.perf_counter()
            writer.write(RECORD)
            await reader.readexactly(100)
            if i >= 50:
                samples.append(time.perf_counter() - start)
        return samples

    result: list[float] = await _stock_session(s, impl, body)
    return result


# -- driver ---------------------------------------------------------------------


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


async def measure(s: Setup, impl: str, stock: bool) -> Result:
    chunk = 256 * 1024
    count = s.bulk_bytes // chunk
    payload = b"b" * chunk
    transfer = stock_transfer if stock else ours_transfer
    rtt = stock_rtt if stock else ours_rtt
    out: Result = {}
    # CPU of this process (client and server together) per record: it moves far
    # less with the machine's load than the rates do.
    cpu = time.process_time()
    elapsed = await transfer(s, impl, payload, count)
    out["bulk MB/s"] = s.bulk_bytes / elapsed / 1e6
    out["bulk cpu us/MB"] = (time.process_time() - cpu) * 1e6 / (s.bulk_bytes / 1e6)
    cpu = time.process_time()
    elapsed = await transfer(s, impl, BATCH, s.ingest_batches)
    out["ingest rec/s"] = 64 * s.ingest_batches / elapsed
    out["ingest cpu us/rec"] = (time.process_time() - cpu) * 1e6 / (64 * s.ingest_batches)
    if not stock:
        for n in (1, 10):
            cpu = time.process_time()
            out[f"fanout{n} rec/s"] = await ours_fanout(s, impl, n)
            records = 64 * s.fanout_batches * n
            out[f"fanout{n} cpu us/rec"] = (time.process_time() - cpu) * 1e6 / records
    samples = await rtt(s, impl)
    out["rtt p50 us"] = _percentile(samples, 0.5)
    out["rtt p99 us"] = _percentile(samples, 0.99)
    return out


def _median(results: list[Result]) -> Result:
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def _table(title: str, per_impl: dict[str, Result]) -> None:
    print(f"\n{title}")
    print(f"{'metric':<16}{'qh3':>14}{'aioquic':>14}{'qh3/aioquic':>14}")
    for key in per_impl["qh3"]:
        a, b = per_impl["qh3"][key], per_impl["aioquic"][key]
        lower_better = key.startswith("rtt") or " cpu " in key
        ratio = (b / a) if lower_better else (a / b)  # >1 means qh3 is better
        print(f"{key:<16}{a:>14,.1f}{b:>14,.1f}{ratio:>13.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per figure, median reported (default 3)"
    )
    parser.add_argument(
        "--offload-ab", action="store_true", help="our loop with UDP GSO/GRO off vs on"
    )
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    s = Setup(args.quick)
    if args.offload_ab:
        await offload_ab(s, runs)
        return
    ours: dict[str, list[Result]] = {i: [] for i in IMPLS}
    stock: dict[str, list[Result]] = {i: [] for i in IMPLS}
    started = time.perf_counter()
    for _ in range(runs):
        for impl in IMPLS:
            ours[impl].append(await measure(s, impl, stock=False))
            stock[impl].append(await measure(s, impl, stock=True))
    ours_m = {i: _median(ours[i]) for i in IMPLS}
    stock_m = {i: _median(stock[i]) for i in IMPLS}
    print(f"median of {runs} run(s), mds 1350, loopback")
    _table("our datagram loop", ours_m)
    _table("stock library glue (serve/connect)", stock_m)
    print("\nour loop vs stock glue (ratio, >1 = ours better)")
    for impl in IMPLS:
        parts = []
        for key, value in stock_m[impl].items():
            mine = ours_m[impl][key]
            lower_better = key.startswith("rtt") or " cpu " in key
            ratio = (value / mine) if lower_better else (mine / value)
            parts.append(f"{key} {ratio:.2f}x")
        print(f"  {impl:<8} " + ", ".join(parts))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


async def offload_ab(s: Setup, runs: int) -> None:
    results: dict[tuple[str, bool], list[Result]] = {}
    started = time.perf_counter()
    for index in range(runs):
        for impl in IMPLS:
            order = (False, True) if index % 2 == 0 else (True, False)
            for offload in order:
                s.offload = offload
                results.setdefault((impl, offload), []).append(await measure(s, impl, False))
    print(f"UDP GSO/GRO off vs on, our loop, {runs} run(s), medians (min-max), loopback")
    for impl in IMPLS:
        off, on = results[(impl, False)], results[(impl, True)]
        print(f"\n{impl}")
        print(f"{'metric':<16}{'off':>24}{'on':>24}{'on/off per run':>26}")
        for key in off[0]:
            lower_better = key.startswith("rtt") or " cpu " in key
            ratios = [
                (a[key] / b[key]) if lower_better else (b[key] / a[key])
                for a, b in zip(off, on, strict=True)
            ]
            cells = []
            for side in (off, on):
                values = [r[key] for r in side]
                digits = 2 if " cpu " in key else 0
                cells.append(
                    f"{statistics.median(values):,.{digits}f}"
                    f" ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
                )
            spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            print(f"{key:<16}{cells[0]:>24}{cells[1]:>24}{spread:>26}")
    print("(ratios above 1: on is better; for rtt and cpu, off/on)")
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
