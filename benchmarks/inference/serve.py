"""A real ``gpuportal serve`` for the benchmark: its own state folder and SQLite database, a
simulated inventory of 8-GPU nodes, one tenant per cell seeded with its quota, an admin token
and one user token per tenant (members may call their tenant's services, no other).

Engine processes outlive the portal by design; ``stop`` deletes every service through the API
and then kills whatever replica process is left, by the process group its record names.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import yaml

ADMIN = "inference-bench-admin-token-01"
FLAVOR = "H100-80GB"
STARTUP_S = 120.0


def user_token(tenant: str) -> str:
    return f"inference-bench-user-{tenant}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Portal:
    """One ``gpuportal serve`` process with ``quotas`` (tenant -> GPUs, guaranteed = limit)."""

    def __init__(
        self, work: Path, quotas: Mapping[str, int], port: int, source: Path | None = None
    ) -> None:
        self.work = work
        self.source = source  # another tree's portal (an export of main, to compare with)
        self.quotas = dict(quotas)
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.work / "serve.log"

    def _files(self) -> None:
        tokens: dict[str, object] = {
            ADMIN: {"name": "ops", "kind": "service", "scopes": ["custom:gpuportal:admin"]}
        }
        for tenant in self.quotas:
            tokens[user_token(tenant)] = {
                "name": f"user-{tenant}",
                "kind": "user",
                "scopes": [
                    f"custom:gpuportal:workloads:write!group={tenant}",
                    f"custom:gpuportal:workloads:read!group={tenant}",
                    f"custom:gpuportal:services:call!group={tenant}",
                ],
                "groups": [tenant],
            }
        (self.work / "tokens.yaml").write_text(yaml.safe_dump({"tokens": tokens}))
        seed = {
            "tenants": {
                t: {"quotas": {FLAVOR: {"guaranteed": n, "limit": n}}}
                for t, n in self.quotas.items()
            }
        }
        (self.work / "seed.yaml").write_text(yaml.safe_dump(seed))

    def start(self) -> None:
        self._files()
        nodes = max(1, -(-sum(self.quotas.values()) // 8))
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUPORTAL_", "JUPYTERHUB_"))
        }
        env.update(
            GPUPORTAL_STATE_DIR=str(self.work / "state"),
            GPUPORTAL_DATABASE_URL=f"sqlite:///{self.work / 'portal.sqlite'}",
            GPUPORTAL_INVENTORY=f"preset:hgx-h100-8={nodes}",
            GPUPORTAL_TOKENS_FILE=str(self.work / "tokens.yaml"),
            GPUPORTAL_SERVICE_PORT=str(self.port),
        )
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        argv = [sys.executable, "-m", "portal.cli", "serve", "--seed", str(self.work / "seed.yaml")]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.source
            )
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited with {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"serve did not become ready in {STARTUP_S:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Delete every service, stop the portal, kill any engine process left."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(httpx.HTTPError), self.admin() as c:
                for svc in c.get("/api/v1/services", params={"limit": 500}).json()["items"]:
                    c.delete(f"/api/v1/services/{svc['id']}")
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self.process = None
        for member in (self.work / "state" / "services").glob("*/attempt-*/rank-0/member.json"):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, KeyError):
                os.killpg(int(json.loads(member.read_text())["pid"]), signal.SIGKILL)

    def cpu_s(self) -> float:
        """CPU seconds the portal's process has used (user and system), from ``/proc``."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(ADMIN), timeout=30)
