"""``gpuportal serve`` as a real subprocess: start, call over HTTP, signal, check the exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.ports import free_port

ROOT = "root-token-for-tests-0001"
PROMETHEUS = "prometheus-token-for-tests-01"
ALICE = "alice-token-for-tests-00001"
BOB = "bob-token-for-tests-0000001"

TOKENS = {
    "tokens": {
        ROOT: {"name": "ops", "kind": "service", "scopes": ["custom:gpuportal:admin"]},
        PROMETHEUS: {
            "name": "prometheus",
            "kind": "service",
            "scopes": ["custom:gpuportal:metrics:read"],
        },
        ALICE: {
            "name": "alice",
            "kind": "user",
            "scopes": [
                "custom:gpuportal:workloads:write",
                "custom:gpuportal:workloads:read",
                "custom:gpuportal:services:call!group=team-a",
            ],
            "groups": ["team-a"],
        },
        BOB: {
            "name": "bob",
            "kind": "user",
            "scopes": [
                "custom:gpuportal:workloads:write",
                "custom:gpuportal:workloads:read!group=team-b",
                "custom:gpuportal:services:call!group=team-b",
            ],
            "groups": ["team-b"],
        },
    }
}

SEED = {
    "tenants": {
        "team-a": {"quotas": {"H100-80GB": {"guaranteed": 4, "limit": 8}}},
        "team-b": {"quotas": {"H100-80GB": {"guaranteed": 4, "limit": 8}}},
    }
}

STARTUP_S = 60.0


def gpu(tenant: str, n: int, name: str, **devices: object) -> dict[str, object]:
    return {"tenant": tenant, "name": name, "devices": {"kind": "gpu", "count": n, **devices}}


def database_url(db: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The serve's database for a ``db`` parameter: a SQLite file here, or the test
    PostgreSQL (its fixture is only requested when used)."""
    if db == "sqlite":
        return f"sqlite:///{tmp_path / 'portal.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Service:
    """One ``gpuportal serve`` process; ``start`` waits until /ready answers 200."""

    workdir: Path
    database_url: str
    inventory: str = "preset:hgx-h100-8=2"
    prefix: str = "/"
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix.rstrip('/')}"

    @property
    def log(self) -> Path:
        return self.workdir / "service.log"

    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUPORTAL_", "JUPYTERHUB_"))
        }
        env.update(
            GPUPORTAL_STATE_DIR=str(self.workdir / "state"),
            GPUPORTAL_DATABASE_URL=self.database_url,
            GPUPORTAL_INVENTORY=self.inventory,
            GPUPORTAL_TOKENS_FILE=str(self.workdir / "tokens.yaml"),
        )
        if "JUPYTERHUB_SERVICE_URL" not in self.extra_env:
            env["GPUPORTAL_SERVICE_PORT"] = str(self.port)
        env.update(self.extra_env)
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "portal.cli", "serve", *args]

    def start(
        self, *args: str, seed: Mapping[str, object] | None = SEED, wait_for: str = "/ready"
    ) -> None:
        """Start and wait until ``wait_for`` answers 200 (``/health`` for a standby)."""
        (self.workdir / "tokens.yaml").write_text(yaml.safe_dump(TOKENS))
        argv = list(args)
        if seed is not None:
            (self.workdir / "seed.yaml").write_text(yaml.safe_dump(dict(seed)))
            argv += ["--seed", str(self.workdir / "seed.yaml")]
        if self.prefix != "/" and "JUPYTERHUB_SERVICE_PREFIX" not in self.extra_env:
            argv += ["--prefix", self.prefix]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(*argv), env=self.env(), stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"serve exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}{wait_for}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        pytest.fail(f"serve did not become ready in {STARTUP_S} s:\n{self.tail()}")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        finally:
            self.kill()

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(15)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def client(self, token: str = ROOT) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(token), timeout=30)


ServiceFactory = Callable[..., Service]


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Builds services in ``tmp_path``; every one started is killed at teardown at the latest."""
    started: list[Service] = []

    def make(**kw: Any) -> Service:
        kw.setdefault("workdir", tmp_path)
        kw.setdefault("database_url", f"sqlite:///{tmp_path / 'portal.sqlite'}")
        svc = Service(**kw)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.kill()
