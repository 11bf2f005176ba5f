"""`gpuportal demo`: the hub configuration it builds, and the real hub it runs.

The ``hub``-marked tests start the installed ``gpuportal demo`` as a subprocess in its own
process group, log in over HTTP like a browser (xsrf cookie + form field), and check that
stopping it leaves no process behind: the hub starts the proxy and each JupyterLab in sessions
of their own, so the tests track every descendant, not only the process group.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from traitlets.config import Config

from portal.demo import (
    DEMO_ADMINS,
    DEMO_TENANTS,
    SEED_FILE,
    HubPorts,
    choose_inventory,
    demo_seed,
    demo_users,
    hub_config,
    inventory_summary,
    render_config,
)
from portal.service import seed as seed_module
from portal.settings import Settings
from tests.support import fake_nvml

GPUPORTAL = Path(sys.executable).parent / "gpuportal"
PASSWORD = "demo-test-password"
# The issue asks for a start "well under 2 minutes"; this bounds the wait, the measured time
# is reported (JUnit suite property demo_start_s), not asserted.
START_TIMEOUT_S = 120.0
LAB_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


# --- the configuration, without a hub ---------------------------------------------------


def _config(tmp_path: Path, *, run_as_root: bool) -> dict[str, dict[str, object]]:
    return hub_config(
        Settings(state_dir=tmp_path, demo_port=8123, demo_ip="127.0.0.1"),
        password="pw",
        proxy_command=Path("/opt/chp/bin/configurable-http-proxy"),
        ports=HubPorts(public=8123, hub_api=18081, proxy_api=18001, portal=18002, dashboards=18003),
        python="/venv/bin/python",
        run_as_root=run_as_root,
        spawner_token="tok",
    )


def services(config: dict[str, dict[str, object]]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], config["JupyterHub"]["services"])


def test_rendered_config_loads_into_traitlets_exactly(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    loaded = Config()
    exec(render_config(config), {"get_config": lambda: loaded})
    assert {section: dict(traits) for section, traits in loaded.items()} == config


def test_tenants_are_hub_groups_and_admins_are_hub_admins(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    assert config["JupyterHub"]["load_groups"] == {
        "team-a": {"users": ["alice"]},
        "team-b": {"users": ["bob"]},
        "gpuportal-admins": {"users": ["carol"]},
        "gpuportal-leadership": {"users": ["carol"]},
    }
    assert config["Authenticator"]["admin_users"] == ["carol"]
    assert config["Authenticator"]["allowed_users"] == ["alice", "bob", "carol"]
    assert demo_users() == {"alice": "team-a", "bob": "team-b", "carol": "admin"}


def test_everything_the_hub_writes_goes_to_the_state_dir(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    assert config["JupyterHub"]["db_url"] == f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    assert config["JupyterHub"]["cookie_secret_file"] == str(tmp_path / "jupyterhub_cookie_secret")
    assert config["ConfigurableHTTPProxy"]["pid_file"] == str(tmp_path / "proxy.pid")
    home = config["GPUSimpleLocalSpawner"]["home_dir_template"]
    assert home == str(tmp_path / "home" / "{username}")
    env = services(config)[0]["environment"]
    assert env["GPUPORTAL_DATABASE_URL"] == f"sqlite:///{tmp_path / 'portal' / 'portal.sqlite'}"
    assert env["GPUPORTAL_STATE_DIR"] == str(tmp_path / "portal")


def test_internal_ports_stay_on_loopback(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    assert config["JupyterHub"]["bind_url"] == "http://127.0.0.1:8123/"
    assert config["JupyterHub"]["hub_ip"] == "127.0.0.1"
    assert config["JupyterHub"]["hub_port"] == 18081
    assert config["ConfigurableHTTPProxy"]["api_url"] == "http://127.0.0.1:18001"
    assert services(config)[0]["url"] == "http://127.0.0.1:18002"


def test_the_portal_runs_as_a_hub_service_and_the_spawner_has_its_own_token(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, run_as_root=False)
    hub = config["JupyterHub"]
    assert hub["spawner_class"] == "spawner.local.GPUSimpleLocalSpawner"
    portal, spawner_svc, _dashboards = services(config)
    assert portal["name"] == "gpuportal"
    assert portal["command"] == [
        "/venv/bin/python", "-m", "portal.cli", "serve", "--seed", str(tmp_path / SEED_FILE)
    ]  # fmt: skip
    assert portal["environment"]["GPUPORTAL_INVENTORY"] == "demo"
    assert spawner_svc == {"name": "gpuportal-spawner", "api_token": "tok", "display": False}
    roles = {r["name"]: r for r in cast(list[dict[str, Any]], hub["load_roles"])}
    assert roles["gpuportal-spawner"]["scopes"] == [
        "custom:gpuportal:workloads:write",
        "custom:gpuportal:workloads:read",
        "custom:gpuportal:queue:read",
    ]
    assert "custom:gpuportal:workloads:write" in hub["custom_scopes"]  # type: ignore[operator]


def test_the_dashboards_run_as_a_hub_service_behind_oauth_for_every_portal_role(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, run_as_root=False)
    dashboards = services(config)[2]
    assert dashboards["name"] == "dashboards"
    assert dashboards["url"] == "http://127.0.0.1:18003"
    assert dashboards["command"] == [
        "/venv/bin/python", "-m", "portal.cli", "dashboards",
        "--portal-url", "http://127.0.0.1:18002/services/gpuportal/",
    ]  # fmt: skip
    assert dashboards["display"] is True  # listed on the hub's home page
    assert "--dev-identities" not in dashboards["command"]
    # The OAuth token may carry the portal's read and write scopes, never admin.
    allowed = dashboards["oauth_client_allowed_scopes"]
    assert "custom:gpuportal:quotas:write" in allowed
    assert "custom:gpuportal:admin" not in allowed
    roles = cast(list[dict[str, Any]], config["JupyterHub"]["load_roles"])
    with_access = {r["name"] for r in roles if "access:services!service=dashboards" in r["scopes"]}
    assert with_access == {
        "gpuportal-member-team-a", "gpuportal-tenant-admin-team-a",
        "gpuportal-member-team-b", "gpuportal-tenant-admin-team-b",
        "gpuportal-leadership", "gpuportal-platform-admin",
    }  # fmt: skip


def test_demo_seed_gives_team_a_every_flavor_and_team_b_one_whole_gpu_per_model() -> None:
    from portal.inventory import simulated

    nodes = simulated.load_demo()
    seed = demo_seed(nodes)
    quotas = {t: v["quotas"] for t, v in seed["tenants"].items()}  # type: ignore[attr-defined]
    assert quotas["team-a"]["H100-80GB"] == {"guaranteed": 8, "limit": 16}  # 2 HGX x 8
    assert quotas["team-b"]["H100-80GB"] == {"guaranteed": 0, "limit": 1}
    assert quotas["team-b"]["T4/share"] == {"guaranteed": 2000, "limit": 4000}  # 4 T4s
    assert set(quotas["team-a"]) == set(quotas["team-b"])
    loaded = seed_module.parse(seed, "demo seed")
    assert [t.name for t in loaded] == ["team-a", "team-b"]


def test_jupyterlab_gets_allow_root_only_when_run_as_root(tmp_path: Path) -> None:
    assert _config(tmp_path, run_as_root=True)["Spawner"]["args"] == ["--allow-root"]
    assert _config(tmp_path, run_as_root=False)["Spawner"]["args"] == []


def test_inventory_summary_counts_gpus_of_the_demo_inventory_by_model() -> None:
    from portal.inventory import simulated

    nodes = simulated.load_demo()
    total = sum(len(node.gpus) for node in nodes)
    summary = inventory_summary()
    assert summary.startswith(f"inventory (simulated): {len(nodes)} nodes, {total} GPUs: ")
    counts = summary.split(": ", 2)[2].split(", ")
    assert sum(int(item.split("x ", 1)[0]) for item in counts) == total


# --- a real hub -------------------------------------------------------------------------


@dataclass
class Demo:
    """One `gpuportal demo` subprocess and what the tests learned about it."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path
    start_s: float = 0.0
    seen: set[tuple[int, int]] = field(default_factory=set)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def remember_descendants(self) -> None:
        """Record every process below the demo now, as (pid, start time) to survive pid reuse."""
        self.seen |= _descendants(self.process.pid)

    def stop(self) -> None:
        """SIGTERM the hub, as a service manager or Ctrl-C would, and wait for it to exit."""
        self.remember_descendants()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT_S)

    def alive(self) -> list[int]:
        """Processes of this demo still running: its process group and every descendant seen."""
        left = [pid for pid, started in self.seen if _running(pid, started)]
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            pass
        else:
            if self.process.poll() is None or _group_members(self.process.pid):
                left.append(-self.process.pid)
        return sorted(left)

    def kill_leftovers(self) -> None:
        for pid, started in self.seen:
            if _running(pid, started):
                os.kill(pid, signal.SIGKILL)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may itself contain spaces and parentheses.
    return raw[raw.rindex(")") + 2 :].split()


def _running(pid: int, started: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def _all_processes() -> dict[int, list[str]]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = fields
    return table


def _descendants(root: int) -> set[tuple[int, int]]:
    table = _all_processes()
    found: set[tuple[int, int]] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, fields in table.items():
            if int(fields[1]) == parent and pid not in {p for p, _ in found}:
                found.add((pid, int(fields[19])))
                frontier.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _group_members(pgid: int) -> list[int]:
    return [
        pid
        for pid, fields in _all_processes().items()
        if int(fields[2]) == pgid and fields[0] != "Z"
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _launch(state_dir: Path) -> Demo:
    """Start `gpuportal demo` in a process group of its own, without waiting for it."""
    port = _free_port()
    log = state_dir.parent / f"{state_dir.name}.log"
    env = {
        **os.environ,
        "GPUPORTAL_STATE_DIR": str(state_dir),
        "GPUPORTAL_DEMO_PASSWORD": PASSWORD,
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(GPUPORTAL), "demo", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
        )
    return Demo(process=process, url=f"http://127.0.0.1:{port}", log=log)


def _start_demo(state_dir: Path) -> Demo:
    """Start `gpuportal demo` and wait until the hub API answers through the proxy."""
    demo = _launch(state_dir)
    process = demo.process
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            demo.kill_leftovers()
            pytest.fail(f"gpuportal demo exited with {process.returncode}:\n{demo.log_tail()}")
        try:
            if httpx.get(f"{demo.url}/hub/api/", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            demo.stop()
            demo.kill_leftovers()
            pytest.fail(f"hub API not up after {START_TIMEOUT_S:.0f} s:\n{demo.log_tail()}")
        time.sleep(0.2)
    demo.start_s = time.monotonic() - started
    return demo


@pytest.fixture
def demo_factory(tmp_path: Path) -> Iterator[list[Demo]]:
    """Demos started by a test; any the test did not stop are stopped and killed after it."""
    demos: list[Demo] = []
    yield demos
    for demo in demos:
        demo.stop()
        demo.kill_leftovers()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One demo shared by the read-only tests of this module."""
    running = _start_demo(tmp_path_factory.mktemp("demo") / "state")
    try:
        yield running
    finally:
        running.stop()
        running.kill_leftovers()


@contextmanager
def _login(base: str, user: str, password: str = PASSWORD) -> Iterator[httpx.Client]:
    """A client holding the hub's login cookies for ``user``; raises if the login is refused."""
    with httpx.Client(base_url=base, timeout=30) as client:
        form = client.get("/hub/login")
        assert form.status_code == 200, form.text
        response = client.post(
            "/hub/login",
            data={"username": user, "password": password, "_xsrf": client.cookies["_xsrf"]},
        )
        if response.status_code != 302:
            raise PermissionError(f"login of {user} answered {response.status_code}")
        yield client


@pytest.mark.hub
def test_demo_answers_on_the_hub_api_within_two_minutes(
    demo: Demo, record_testsuite_property: Callable[[str, object], None]
) -> None:
    record_testsuite_property("demo_start_s", f"{demo.start_s:.1f}")
    print(f"gpuportal demo answered on /hub/api/ after {demo.start_s:.1f} s")
    banner, inventory = demo.log.read_text(errors="replace").splitlines()[:2]
    assert banner.startswith(f"gpuportal demo: open {demo.url}/ and log in as alice (team-a)")
    assert banner.endswith(f"with password {PASSWORD}")
    assert inventory.startswith("inventory (simulated): ")


@pytest.mark.hub
@pytest.mark.parametrize("user", ["alice", "bob", "carol"])
def test_demo_user_logs_in_and_sees_their_home_page(demo: Demo, user: str) -> None:
    with _login(demo.url, user) as client:
        home = client.get("/hub/home")
    assert home.status_code == 200
    assert f'<span class="me-1">{user}</span>' in home.text
    assert re.search(r'id="start"[^>]*>\s*Start\s+My Server', home.text)


@pytest.mark.hub
def test_the_portal_runs_as_a_hub_service_with_the_demo_tenants(demo: Demo) -> None:
    with _login(demo.url, "alice") as client:
        ready = client.get("/services/gpuportal/ready")
        form = client.get("/hub/spawn/alice")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert form.status_code == 200
    assert 'name="tenant" value="team-a"' in form.text
    assert re.search(r"8 × H100-80GB NVLink <span[^>]*>available now", form.text)
    assert re.search(r"MIG 3g.40gb on A100-80GB <span[^>]*>available now", form.text)
    assert re.search(r"0.25 × T4 \(3 GiB\) <span[^>]*>available now", form.text)


@pytest.mark.hub
def test_the_demo_serves_the_dashboards_behind_the_hubs_oauth(demo: Demo) -> None:
    dashboards = f"{demo.url}/services/dashboards/"
    with _login(demo.url, "alice") as client:
        home = client.get("/hub/home")
        # Up once the hub's OAuth round trip ends on the dashboards' own page (the service may
        # still be starting right after the hub answered).
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            page = client.get("/services/dashboards/", follow_redirects=True)
            if page.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert 'href="/services/dashboards/"' in home.text  # under Services on the home page
    assert page.status_code == 200, page.text[:500]
    assert str(page.url) == dashboards
    # To the hub's authorize, to the service's callback, back to the page.
    assert [r.status_code for r in page.history] == [302, 302, 302]
    assert "bokeh" in page.text.lower()


@pytest.mark.hub
def test_wrong_password_and_unknown_user_are_refused(demo: Demo) -> None:
    with pytest.raises(PermissionError), _login(demo.url, "alice", "not-the-password"):
        pass
    with pytest.raises(PermissionError), _login(demo.url, "mallory"):
        pass


@pytest.mark.hub
def test_running_hub_has_the_tenants_as_groups(demo: Demo) -> None:
    with _login(demo.url, DEMO_ADMINS[0]) as client:
        response = client.get("/hub/api/groups", headers={"X-XSRFToken": client.cookies["_xsrf"]})
    assert response.status_code == 200, response.text
    groups = {group["name"]: sorted(group["users"]) for group in response.json()}
    tenants = {tenant: sorted(users) for tenant, users in DEMO_TENANTS.items()}
    assert {name: groups[name] for name in tenants} == tenants
    # The portal's roles bring their groups: the hub admin operates the portal and reads cost;
    # tenant admin groups start empty.
    others = {name: users for name, users in groups.items() if name not in tenants}
    assert others == {
        "gpuportal-admins": ["carol"],
        "gpuportal-leadership": ["carol"],
        "team-a-admins": [],
        "team-b-admins": [],
    }


@pytest.mark.hub
@pytest.mark.slow
def test_spawned_jupyterlab_loads_and_stopping_leaves_no_process(
    tmp_path: Path,
    demo_factory: list[Demo],
    record_testsuite_property: Callable[[str, object], None],
) -> None:
    demo = _start_demo(tmp_path / "state")
    demo_factory.append(demo)
    with _login(demo.url, "bob") as client:
        form = client.get("/hub/spawn/bob")
        assert form.status_code == 200
        # team-b may hold one whole H100: offered now; four are over its limit.
        assert re.search(r"1 × H100-80GB <span[^>]*>available now", form.text)
        assert re.search(r"4 × H100-80GB NVLink <span[^>]*>not allowed", form.text)
        started = time.monotonic()
        chosen = {"tenant": "team-b", "option-team-b": "gpu:H100-80GB:1"}
        posted = client.post("/hub/spawn/bob", data={**chosen, "_xsrf": client.cookies["_xsrf"]})
        assert posted.status_code == 302, posted.text
        while True:
            lab = client.get("/user/bob/lab", follow_redirects=True)
            if lab.status_code == 200 and lab.url.path == "/user/bob/lab":
                break
            assert time.monotonic() - started < LAB_TIMEOUT_S, demo.log_tail()
            time.sleep(0.5)
    record_testsuite_property("lab_spawn_s", f"{time.monotonic() - started:.1f}")
    assert "JupyterLab" in lab.text
    assert (tmp_path / "state" / "home" / "bob").is_dir()

    demo.remember_descendants()
    assert len(demo.seen) >= 3, "expected the proxy, the portal and bob's JupyterLab"
    (lab_pid,) = [pid for pid, _ in demo.seen if "jupyterhub.singleuser" in _cmdline(pid)]
    env = _environ(lab_pid)
    assert env["GPUPORTAL_TENANT"] == "team-b" and env["GPUPORTAL_FLAVOR"] == "H100-80GB"
    assert env["CUDA_VISIBLE_DEVICES"] == env["GPUPORTAL_GPU_UUIDS"]
    # Simulated GPUs carry stable UUIDs (GPU-sim-<node>-<index>), as real ones do.
    assert re.fullmatch(r"GPU-sim-[a-z0-9-]+-[0-7]", env["CUDA_VISIBLE_DEVICES"])
    assert env["CUDA_VISIBLE_DEVICES"].endswith(f"-{env['GPUPORTAL_GPUS']}")
    demo.stop()
    assert demo.process.returncode is not None, "the hub ignored SIGTERM"
    assert demo.alive() == [], f"left running after SIGTERM:\n{demo.log_tail()}"


@pytest.mark.hub
def test_stop_during_start_up_leaves_no_process(tmp_path: Path, demo_factory: list[Demo]) -> None:
    # JupyterHub handles SIGTERM only once it is up; before that the proxy it has already
    # started (in a session of its own) would be orphaned if nothing else stopped it.
    demo = _launch(tmp_path / "state")
    demo_factory.append(demo)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not any("configurable-http-proxy" in _cmdline(pid) for pid, _ in demo.seen):
        assert demo.process.poll() is None, demo.log_tail()
        assert time.monotonic() < deadline, f"no proxy started:\n{demo.log_tail()}"
        demo.remember_descendants()
        time.sleep(0.05)
    demo.stop()
    assert demo.process.returncode is not None, "gpuportal demo ignored SIGTERM"
    assert demo.alive() == [], f"left running after SIGTERM:\n{demo.log_tail()}"


@pytest.mark.hub
def test_hub_crash_leaves_no_process_and_fails_the_demo(
    tmp_path: Path, demo_factory: list[Demo]
) -> None:
    demo = _start_demo(tmp_path / "state")
    demo_factory.append(demo)
    demo.remember_descendants()
    hubs = [pid for pid, _ in demo.seen if "-m jupyterhub --config" in _cmdline(pid)]
    assert len(hubs) == 1, [_cmdline(pid) for pid, _ in demo.seen]
    os.kill(hubs[0], signal.SIGKILL)
    assert demo.process.wait(timeout=STOP_TIMEOUT_S) == 128 + signal.SIGKILL
    assert demo.alive() == [], f"left running after the hub died:\n{demo.log_tail()}"
    assert "process(es) the hub left behind" in demo.log_tail()


@pytest.mark.parametrize("driver", [fake_nvml.Driver.LOADED, fake_nvml.Driver.MISSING])
def test_the_demo_uses_the_gpus_nvml_finds_else_the_simulated_inventory(
    monkeypatch: pytest.MonkeyPatch, driver: fake_nvml.Driver
) -> None:
    machine = fake_nvml.hgx_h100()
    machine.driver = driver
    fake_nvml.install(monkeypatch, machine)
    choose_inventory.cache_clear()
    try:
        found = choose_inventory()
        summary = inventory_summary()
    finally:
        choose_inventory.cache_clear()
    if driver is fake_nvml.Driver.LOADED:
        assert found.spec == "nvml" and len(found.nodes) == 1
        assert [g.uuid for g in found.nodes[0].gpus] == [f"GPU-h100-{i}" for i in range(8)]
        assert summary == "inventory (NVML): 1 nodes, 8 GPUs: 8x H100-80GB"
        # The seed covers the real flavors.
        seed = cast(dict[str, Any], demo_seed(found.nodes))
        assert seed["tenants"]["team-a"]["quotas"]["H100-80GB"] == {"guaranteed": 4, "limit": 8}
    else:
        assert found.spec == "demo" and summary.startswith("inventory (simulated): ")
