"""Failover of active/standby ``gpuportal serve`` replicas (Kubernetes Lease election).

Starts a durable PostgreSQL and the test control plane (etcd, kube-apiserver), then per round
two ``gpuportal serve`` processes with ``GPUPORTAL_LEADER_ELECTION=lease`` on one database: the
leader with some workloads, a standby. Kills the leader (SIGKILL) and times until the standby
answers ``/ready`` 200 with the leader's workloads — and, separately, a clean stop (SIGTERM,
the Lease given up). Prints a Markdown table; ``--json`` writes the samples.

    python -m benchmarks.failover --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import yaml

TOKEN = "failover-bench-token-0001"
TOKENS = {
    "tokens": {TOKEN: {"name": "ops", "kind": "service", "scopes": ["custom:gpuportal:admin"]}}
}
SEED = {"tenants": {"team-a": {"quotas": {"H100-80GB": {"guaranteed": 8, "limit": 16}}}}}


def _free_port() -> int:
    from tests.support.ports import free_port

    return free_port()


class Replica:
    def __init__(self, work: Path, who: str, env: dict[str, str]) -> None:
        self.dir = work / who
        self.dir.mkdir(parents=True)
        (self.dir / "tokens.yaml").write_text(yaml.safe_dump(TOKENS))
        (self.dir / "seed.yaml").write_text(yaml.safe_dump(SEED))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")}
        self.env = {
            **base,
            **env,
            "POD_NAME": who,
            "GPUPORTAL_STATE_DIR": str(self.dir / "state"),
            "GPUPORTAL_TOKENS_FILE": str(self.dir / "tokens.yaml"),
            "GPUPORTAL_SERVICE_PORT": str(self.port),
        }
        self.log = self.dir / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, path: str) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "portal.cli",
                    "serve",
                    "--seed",
                    str(self.dir / "seed.yaml"),
                ],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if _until(lambda: self.status(path) == 200, 120) is None:
            raise RuntimeError(
                f"{self.dir.name} did not answer {path}:\n{self.log.read_text()[-3000:]}"
            )

    def status(self, path: str) -> int:
        try:
            return httpx.get(f"{self.url}{path}", timeout=2).status_code
        except httpx.HTTPError:
            return 0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(15)


def _until(probe: object, timeout_s: float) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if probe():  # type: ignore[operator]
            return time.monotonic() - began
        time.sleep(0.05)
    return None


def one_round(work: Path, env: dict[str, str], how: signal.Signals) -> float:
    env = {**env, "GPUPORTAL_LEASE_NAME": f"bench-{uuid.uuid4().hex[:8]}"}
    leader, standby = (
        Replica(work, f"a-{uuid.uuid4().hex[:6]}", env),
        Replica(work, f"b-{uuid.uuid4().hex[:6]}", env),
    )
    try:
        leader.start("/ready")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        body = {"tenant": "team-a", "name": "w", "devices": {"kind": "gpu", "count": 1}}
        for _ in range(4):
            httpx.post(f"{leader.url}/api/v1/workloads", json=body, headers=headers, timeout=10)
        standby.start("/health")
        assert standby.status("/ready") == 503
        assert leader.process is not None
        leader.process.send_signal(how)
        took = _until(lambda: standby.status("/ready") == 200, 120)
        if took is None:
            raise RuntimeError(f"no takeover:\n{standby.log.read_text()[-3000:]}")
        items = httpx.get(f"{standby.url}/api/v1/workloads", headers=headers, timeout=10).json()[
            "items"
        ]
        assert len(items) == 4, items
        return took
    finally:
        leader.stop()
        standby.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--lease", type=float, default=None, help="lease duration, s (default: the setting's)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from portal.settings import Settings
    from tests.support.k8s import running_cluster
    from tests.support.postgres import start_server, stop_server

    lease = args.lease if args.lease is not None else Settings().lease_duration_s
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
        work = Path(tmp)
        server = start_server(durable=True)
        try:
            with running_cluster(work / "k8s") as cluster:
                env = {
                    "KUBECONFIG": str(cluster.kubeconfig_for("admin")),
                    "GPUPORTAL_LEADER_ELECTION": "lease",
                    "GPUPORTAL_LEASE_NAMESPACE": "default",
                    "GPUPORTAL_LEASE_DURATION_S": str(lease),
                    "GPUPORTAL_INVENTORY": "preset:hgx-h100-8=2",
                    "GPUPORTAL_LOG_FORMAT": "text",
                }
                samples: dict[str, list[float]] = {"SIGKILL": [], "SIGTERM": []}
                for _ in range(args.rounds):
                    for how in (signal.SIGKILL, signal.SIGTERM):
                        db = server.create_database("failover")
                        took = one_round(
                            work, {**env, "GPUPORTAL_DATABASE_URL": server.url(db)}, how
                        )
                        samples[how.name].append(took)
        finally:
            stop_server(server)
    print(f"lease duration {lease:g} s, renew every {lease * 0.2:g} s, {args.rounds} rounds\n")
    print("| leader | median (s) | max (s) | samples (s) |")
    print("|---|---|---|---|")
    for name, values in samples.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {statistics.median(values):.1f} | {max(values):.1f} | {shown} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"lease_s": lease, "samples": samples}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
