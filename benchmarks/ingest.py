"""Telemetry ingest cost: N GPUs reporting every 10 s through the real ingest path.

``python -m benchmarks.ingest [--gpus 10000] [--interval 10] [--minutes 3] [--db-url URL |
--postgres | --both]``
builds N H100 GPUs as 8-GPU nodes, allocates about half of them to workloads (so attribution
does real work), then replays ``--minutes`` of simulated time: every ``--interval`` seconds each
node sends one batch of its 8 samples as JSON bytes, and the portal parses and validates it
(``SampleBatch.model_validate_json``), attributes and stores it (``Telemetry.ingest``), and
rolls up the closed minutes once a simulated minute (``Telemetry.maintain``). At the end it
times one alert evaluation over the last minute (``AlertService.evaluate``, every rule).

The figure is CPU seconds of this process (every thread, the SQLite checkpointer included) per
simulated wall second: the fraction of one core the portal spends keeping up. Building the JSON
(the agents' work) is done before the clock starts. ``--postgres`` starts a throwaway local
PostgreSQL server (durable: fsync on) and also reports the CPU its processes spent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.requests import DeviceRequest, WorkloadRequest
from policies.topology import LinkClass, Topology
from portal.alerting.service import AlertService
from portal.allocator import Allocator
from portal.store.writer import Store
from portal.telemetry.attribution import AllocatorIndexSource
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import SampleBatch

GPUS_PER_NODE = 8
START = 1_800_000_000.0


class SimClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(url: str, gpus: int) -> tuple[Store, Allocator, list[Node]]:
    nodes = [
        Node(
            f"n{i}",
            tuple(GPU(g, "H100-80GB", 81920, uuid=f"GPU-n{i}-{g}") for g in range(GPUS_PER_NODE)),
            cpu_milli=128_000,
            memory_mib=1_048_576,
            topology=Topology.uniform(GPUS_PER_NODE, LinkClass.NVSWITCH),
        )
        for i in range(gpus // GPUS_PER_NODE)
    ]
    store = Store(url)
    alloc = Allocator(store)
    alloc.start(nodes)
    alloc.set_tenant("bench")
    alloc.set_quota("bench", "H100-80GB", guaranteed=gpus, limit=gpus)
    req = DeviceRequest(FlavorKind.GPU, count=4, models=frozenset({"H100-80GB"}))
    for w in range(gpus // 8):  # half the GPUs, four per workload
        alloc.request(WorkloadRequest("bench", f"user{w % 50}", f"nb{w}", req))
    return store, alloc, nodes


def payloads(nodes: Sequence[Node], at: float) -> list[bytes]:
    """One JSON batch per node, as an agent would send it at ``at``."""
    out = []
    for n, node in enumerate(nodes):
        samples = [
            {
                "gpu_uuid": g.uuid,
                "at": at,
                "utilization_pct": float((n * 7 + g.index * 13 + int(at)) % 101),
                "activity_pct": float((n + g.index + int(at)) % 100),
                "memory_used_mib": 20000.0 + g.index,
                "memory_total_mib": 81920.0,
                "power_w": 350.0,
                "temperature_c": 61.0,
                "throttle_reasons": 0,
                "xid_count": 0,
                "ecc_uncorrectable": 0,
                "pcie_tx_bytes_s": 1.5e9,
                "pcie_rx_bytes_s": 1.2e9,
                "processes": [{"pid": 1000 + g.index, "user": "user1", "server": "nb1"}],
            }
            for g in node.gpus
        ]
        out.append(json.dumps({"node": node.name, "source": "nvml", "samples": samples}).encode())
    return out


def server_cpu_s(data_dir: Path | None) -> float:
    """CPU seconds of a PostgreSQL server's postmaster and its children (Linux /proc)."""
    if data_dir is None:
        return 0.0
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if postmaster in (pid, ppid):
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def run(
    url: str, gpus: int, interval_s: float, minutes: int, pg_data: Path | None = None
) -> dict[str, float]:
    store, alloc, nodes = build(url, gpus)
    clock = SimClock(START)
    telemetry = Telemetry(alloc, clock=clock)
    # Attribution's snapshot is rebuilt every 2 s of the portal's time, as in production; on
    # the default monotonic clock it would be rebuilt every 2 s of the replay, which runs
    # faster than real time and would hide most of that cost.
    telemetry.index = AllocatorIndexSource(alloc, ttl_s=2.0, clock=clock)
    rounds = int(minutes * 60 / interval_s)
    accepted = 0
    cpu = wall = db_cpu = 0.0
    try:
        for r in range(rounds):
            at = START + r * interval_s
            raw = payloads(nodes, at)  # the agents' work, not timed
            clock.now = at + 1.0
            c0, w0, d0 = time.process_time(), time.perf_counter(), server_cpu_s(pg_data)
            for i, body in enumerate(raw):
                clock.now = at + 1.0 + (interval_s - 1.0) * i / len(raw)  # spread over the round
                accepted += telemetry.ingest(SampleBatch.model_validate_json(body)).accepted
            if int(at) % 60 + interval_s >= 60:  # once a simulated minute
                telemetry.maintain()
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            db_cpu += server_cpu_s(pg_data) - d0
        # One alert evaluation over the last minute of samples, every device allocated or not.
        service = AlertService(alloc, interval_s=60.0, clock=clock)
        c0 = time.process_time()
        service.evaluate(START + rounds * interval_s)
        alert_cpu = time.process_time() - c0
    finally:
        store.close()
    simulated = rounds * interval_s
    extra = {"db_server_cpu_s": db_cpu, "db_server_core_fraction": db_cpu / simulated}
    return {
        "gpus": gpus,
        "samples": accepted,
        "simulated_s": simulated,
        "cpu_s": cpu,
        "wall_s": wall,
        "core_fraction": cpu / simulated,
        "cpu_us_per_sample": cpu / accepted * 1e6,
        "alert_evaluation_cpu_s": alert_cpu,
        **(extra if pg_data is not None else {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__)
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--minutes", type=int, default=3, help="simulated minutes")
    parser.add_argument("--db-url", default="", help="default: SQLite in a temporary directory")
    parser.add_argument("--postgres", action="store_true", help="a throwaway local PostgreSQL")
    parser.add_argument(
        "--both",
        action="store_true",
        help="SQLite, then a throwaway local PostgreSQL (fsync on), side by side in one run",
    )
    args = parser.parse_args(argv)
    if args.both:
        return _both(args)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db_url or f"sqlite:///{Path(tmp) / 'portal.db'}"
        if args.postgres:
            from tests.support.postgres import start_server, stop_server

            server = start_server(durable=True)
            try:
                url = server.url(server.create_database("ingest"))
                result = run(url, args.gpus, args.interval, args.minutes, server.root / "data")
            finally:
                stop_server(server)
        else:
            result = run(url, args.gpus, args.interval, args.minutes)
    engine = url.split(":", 1)[0]
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, database {engine}"
    )
    for key, value in result.items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    print(
        f"=> {result['core_fraction'] * 100:.2f} % of one core for {args.gpus} GPUs "
        f"every {args.interval:g} s"
    )
    return 0


def _both(args: argparse.Namespace) -> int:
    from tests.support.postgres import start_server, stop_server

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'portal.db'}"
        results["SQLite"] = run(url, args.gpus, args.interval, args.minutes)
    server = start_server(durable=True)
    try:
        url = server.url(server.create_database("ingest"))
        pg = run(url, args.gpus, args.interval, args.minutes, server.root / "data")
        results["PostgreSQL (fsync on)"] = pg
    finally:
        stop_server(server)
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}; {args.gpus} GPUs every {args.interval:g} s"
    )
    print(
        f"{'database':<24} {'samples':>8} {'portal CPU s':>12} {'µs/sample':>10} "
        f"{'% core':>7} {'server % core':>13}"
    )
    for name, r in results.items():
        server_share = r.get("db_server_core_fraction")
        shown = f"{server_share * 100:.1f}" if server_share is not None else "in process"
        print(
            f"{name:<24} {int(r['samples']):>8} {r['cpu_s']:>12.2f} "
            f"{r['cpu_us_per_sample']:>10.0f} {r['core_fraction'] * 100:>7.2f} {shown:>13}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
