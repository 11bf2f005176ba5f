"""``gpuportal serve`` managed by a real JupyterHub: the hub starts it with its service
environment, its proxy routes ``/services/gpuportal/`` to it, tokens are the hub's, and the
hub's shutdown stops it cleanly.

The hub is ``tests.support.hub``'s, stopped with everything below it at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from portal.api.auth import SCOPE_HELP, Scope
from tests.portal.service.conftest import SEED
from tests.support.hub import HubFactory, RunningHub
from tests.support.ports import free_port

pytestmark = [pytest.mark.hub, pytest.mark.slow]

PROVISIONER_TOKEN = "p" * 32
PROMETHEUS_TOKEN = "m" * 32
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Hub:
    running: RunningHub
    public: str
    api: str
    service_log: Path
    service_pid_file: Path


def hub_config(tmp: Path, service_port: int) -> str:
    (tmp / "seed.yaml").write_text(yaml.safe_dump(SEED))
    # The service writes its pid so the test can check it is gone after the hub stops.
    command = [
        "/bin/sh",
        "-c",
        f'echo $$ > {tmp / "service.pid"}; exec "$0" "$@" 2>>{tmp / "service.log"}',
        sys.executable,
        "-m",
        "portal.cli",
        "serve",
        "--seed",
        str(tmp / "seed.yaml"),
    ]
    config = {
        "Authenticator.allowed_users": {"alice"},
        "JupyterHub.load_groups": {"team-a": {"users": ["alice"]}},
        "JupyterHub.custom_scopes": {s.value: {"description": SCOPE_HELP[s]} for s in Scope},
        "JupyterHub.services": [
            {
                "name": "gpuportal",
                "url": f"http://127.0.0.1:{service_port}",
                "command": command,
                "cwd": str(REPO),
                "environment": {
                    "GPUPORTAL_DATABASE_URL": f"sqlite:///{tmp / 'portal.sqlite'}",
                    "GPUPORTAL_INVENTORY": "preset:hgx-h100-8=1",
                },
            },
            {"name": "provisioner", "api_token": PROVISIONER_TOKEN},
            {"name": "prometheus", "api_token": PROMETHEUS_TOKEN},
        ],
        "JupyterHub.load_roles": [
            {"name": "provisioner", "services": ["provisioner"], "scopes": ["tokens"]},
            {
                "name": "gpu-user",
                "users": ["alice"],
                "scopes": [Scope.WORKLOADS_WRITE.value, f"{Scope.WORKLOADS_READ}!group=team-a"],
            },
            {
                "name": "portal-metrics",
                "services": ["prometheus"],
                "scopes": [Scope.METRICS_READ.value],
            },
        ],
    }
    return "".join(f"c.{k} = {v!r}\n" for k, v in config.items())


def wait_until(check: object, what: str, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if callable(check) and check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"{what} not reached in {timeout_s} s:\n{tail}")


@pytest.fixture
def hub(tmp_path: Path, hub_factory: HubFactory) -> Hub:
    running = hub_factory(hub_config(tmp_path, free_port()))
    h = Hub(
        running=running,
        public=running.url,
        api=running.api_url,
        service_log=tmp_path / "service.log",
        service_pid_file=tmp_path / "service.pid",
    )
    url = f"{h.public}/services/gpuportal/ready"
    wait_until(lambda: httpx.get(url, timeout=2).status_code == 200, url, h.service_log)
    # The service and everything below the hub now are stopped in teardown if still running.
    running.remember_descendants()
    return h


def test_the_hub_runs_the_portal_as_a_service_behind_its_proxy(hub: Hub) -> None:
    made = httpx.post(
        f"{hub.api}/users/alice/tokens",
        headers={"Authorization": f"token {PROVISIONER_TOKEN}"},
        json={"note": "test"},
    )
    assert made.status_code == 201, made.text
    alice = {"Authorization": f"Bearer {made.json()['token']}"}
    base = f"{hub.public}/services/gpuportal"

    body = {"tenant": "team-a", "name": "nb", "devices": {"kind": "gpu", "count": 1}}
    r = httpx.post(f"{base}/api/v1/workloads", json=body, headers=alice)
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == "alice"
    assert httpx.get(f"{base}/api/v1/workloads", headers=alice).json()["total"] == 1
    assert (
        httpx.get(f"{base}/api/v1/workloads", headers={"Authorization": "token x"}).status_code
        == 401
    )
    # alice's role has no metrics scope; the prometheus service's has.
    assert httpx.get(f"{base}/metrics", headers=alice).status_code == 403
    metrics = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {PROMETHEUS_TOKEN}"})
    assert metrics.status_code == 200
    assert 'gpuportal_allocator_decisions_total{outcome="allocated"} 1.0' in metrics.text
    assert 'gpuportal_loop_errors_total{loop="allocator-tick"} 0.0' in metrics.text
    assert httpx.get(f"{base}/api/v1/openapi.json").json()["servers"] == [
        {"url": "/services/gpuportal"}
    ]
    # The URL the hub checks every minute answers (it was a 404 logged each time).
    index = httpx.get(f"{base}/")
    assert index.status_code == 200 and index.json()["service"] == "gpuportal"
    assert httpx.get(f"{base}/{index.json()['docs']}").status_code == 200


def test_stopping_the_hub_stops_the_service_cleanly(hub: Hub) -> None:
    pid = int(hub.service_pid_file.read_text())
    # The hub alone, not its process group: the hub itself must stop the service.
    hub_pid = int((hub.running.directory / "jupyterhub.pid").read_text())
    os.kill(hub_pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the service outlived the hub")
    log = hub.service_log.read_text()
    assert '"message": "stopped"' in log
    assert "Traceback" not in log
