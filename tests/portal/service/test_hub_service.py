"""``gpuportal serve`` managed by a real JupyterHub: the hub starts it with its service
environment, its proxy routes ``/services/gpuportal/`` to it, tokens are the hub's, and the
hub's shutdown stops it cleanly.

The hub runs as a subprocess in its own process group, stopped at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from portal.api.auth import SCOPE_HELP, Scope
from portal.demo import find_proxy
from tests.portal.service.conftest import SEED
from tests.support.postgres import free_port

pytestmark = [pytest.mark.hub, pytest.mark.slow]

JUPYTERHUB = Path(sys.executable).parent / "jupyterhub"
PROVISIONER_TOKEN = "p" * 32
PROMETHEUS_TOKEN = "m" * 32
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Hub:
    public: str
    api: str
    service_log: Path
    service_pid_file: Path


def hub_config(tmp: Path, ports: tuple[int, int, int, int]) -> str:
    public, hub, proxy_api, service = ports
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
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": public,
        "JupyterHub.hub_ip": "127.0.0.1",
        "JupyterHub.hub_port": hub,
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{proxy_api}",
        "ConfigurableHTTPProxy.command": [str(find_proxy())],
        "ConfigurableHTTPProxy.pid_file": str(tmp / "proxy.pid"),
        "JupyterHub.db_url": f"sqlite:///{tmp / 'hub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(tmp / "cookie_secret"),
        "JupyterHub.pid_file": str(tmp / "hub.pid"),
        "Authenticator.allowed_users": {"alice"},
        "JupyterHub.load_groups": {"team-a": {"users": ["alice"]}},
        "JupyterHub.custom_scopes": {s.value: {"description": SCOPE_HELP[s]} for s in Scope},
        "JupyterHub.services": [
            {
                "name": "gpuportal",
                "url": f"http://127.0.0.1:{service}",
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
def hub(tmp_path: Path) -> Iterator[Hub]:
    ports = (free_port(), free_port(), free_port(), free_port())
    (tmp_path / "jupyterhub_config.py").write_text(hub_config(tmp_path, ports))
    log_path = tmp_path / "hub.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(JUPYTERHUB), "-f", str(tmp_path / "jupyterhub_config.py")],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    h = Hub(
        public=f"http://127.0.0.1:{ports[0]}",
        api=f"http://127.0.0.1:{ports[1]}/hub/api",
        service_log=tmp_path / "service.log",
        service_pid_file=tmp_path / "service.pid",
    )
    try:
        url = f"{h.public}/services/gpuportal/ready"
        wait_until(lambda: httpx.get(url, timeout=2).status_code == 200, url, h.service_log)
        yield h
    finally:
        stop(proc)
        stop_proxy(tmp_path / "proxy.pid", ports[2])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_proxy(pid_file: Path, api_port: int) -> None:
    """The hub stops its proxy when it exits cleanly; a proxy left behind (its own process
    group) is stopped here, if the pid is still that proxy."""
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if f"--api-port\x00{api_port}".encode() in cmdline:
        os.kill(pid, signal.SIGTERM)


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


def test_stopping_the_hub_stops_the_service_cleanly(tmp_path: Path, hub: Hub) -> None:
    pid = int(hub.service_pid_file.read_text())
    hub_pid = int((tmp_path / "hub.pid").read_text())
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
