"""`gpuportal demo`: the hub configuration it builds, and the real hub it runs.

The ``hub``-marked tests start the installed ``gpuportal demo`` as a subprocess in its own
process group, log in over HTTP like a browser (xsrf cookie + form field), and check that
stopping it leaves no process behind: the hub starts the proxy and each JupyterLab in sessions
of their own, so the tests track every descendant, not only the process group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from traitlets.config import Config

from policies.errors import PortalError
from portal.client import Portal
from portal.demo import (
    DEMO_ADMINS,
    SEED_FILE,
    HubPorts,
    choose_inventory,
    demo_seed,
    demo_users,
    hub_config,
    inventory_summary,
    render_config,
)
from portal.demo_settings import demo_pricing_file, service_settings
from portal.service import seed as seed_module
from portal.settings import Settings
from portal.store.records import AllocationRecord
from portal.store.writer import Store
from tests.support import fake_nvml
from tests.support.ports import free_port

GPUPORTAL = Path(sys.executable).parent / "gpuportal"
PASSWORD = "demo-test-password"
# The issue asks for a start "well under 2 minutes"; this bounds the wait, the measured time
# is reported (JUnit suite property demo_start_s), not asserted.
START_TIMEOUT_S = 120.0
LAB_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


# --- the configuration, without a hub ---------------------------------------------------


def _config(tmp_path: Path, *, run_as_root: bool, **more: Any) -> dict[str, dict[str, object]]:
    return hub_config(
        Settings(state_dir=tmp_path, demo_port=8123, demo_ip="127.0.0.1"),
        password="pw",
        proxy_command=Path("/opt/chp/bin/configurable-http-proxy"),
        ports=HubPorts(public=8123, hub_api=18081, proxy_api=18001, portal=18002, dashboards=18003),
        python="/venv/bin/python",
        run_as_root=run_as_root,
        spawner_token="tok",
        **more,
    )


def services(config: dict[str, dict[str, object]]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], config["JupyterHub"]["services"])


def test_rendered_config_loads_into_traitlets_exactly(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    loaded = Config()
    exec(render_config(config), {"get_config": lambda: loaded})
    assert {section: dict(traits) for section, traits in loaded.items()} == config


def test_tenants_are_hub_groups_and_every_role_has_a_demo_user(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    # Tenant admins are in their tenant too, so they can use its GPUs.
    assert config["JupyterHub"]["load_groups"] == {
        "team-a": {"users": ["alice", "dave"]},
        "team-b": {"users": ["bob", "erin"]},
        "team-a-admins": {"users": ["dave"]},
        "team-b-admins": {"users": ["erin"]},
        "gpuportal-leadership": {"users": ["frank"]},
        "gpuportal-admins": {"users": ["carol"]},
    }
    assert config["Authenticator"]["admin_users"] == ["carol"]
    assert config["Authenticator"]["allowed_users"] == [
        "alice", "bob", "carol", "dave", "erin", "frank"
    ]  # fmt: skip
    assert list(demo_users()) == ["carol", "dave", "erin", "alice", "bob", "frank"]
    assert demo_users()["dave"].startswith("tenant admin of team-a")


def test_spawned_servers_find_the_portal_the_cli_and_get_portal_scopes(tmp_path: Path) -> None:
    config = _config(tmp_path, run_as_root=False)
    spawner = config["Spawner"]
    env = cast(dict[str, str], spawner["environment"])
    # The portal itself: the hub's API port (18081) does not route /services/.
    assert env["GPUPORTAL_URL"] == "http://127.0.0.1:18002/services/gpuportal/"
    assert env["PATH"].split(":")[0] == "/venv/bin"  # the gpuportal next to the server's Python
    scopes = cast(list[str], spawner["server_token_scopes"])
    assert scopes[:2] == ["users:activity!user", "access:servers!server"]
    assert "custom:gpuportal:queue:read" in scopes and "custom:gpuportal:quotas:write" in scopes
    # The hub hands each token the part its user holds; admin is never asked for.
    assert "custom:gpuportal:admin" not in scopes
    assert all("!group=" not in scope for scope in scopes)


def test_the_services_get_the_gpuportal_settings_set_for_the_demo(tmp_path: Path) -> None:
    environ = {
        "GPUPORTAL_SIMULATED_SAMPLES": "false",
        "GPUPORTAL_ALERTS_INTERVAL_S": "15",
        "GPUPORTAL_CULL_IDLE_GPU_SERVERS": "true",
        "GPUPORTAL_ALERTS_WEBHOOK_URL": "http://127.0.0.1:9/hook",
        "GPUPORTAL_PRICING_FILE": "/srv/prices.yaml",
        "GPUPORTAL_DASHBOARDS_COOKIE_SECRET": "c0ffee",
        # The demo's own: its database and inventory stay the demo's.
        "GPUPORTAL_DATABASE_URL": "sqlite:////elsewhere.sqlite",
        "GPUPORTAL_INVENTORY": "nvml",
        "GPUPORTAL_DEMO_PORT": "9000",
        "GPUPORTAL_NOT_A_SETTING": "x",
        "PATH": "/bin",
    }
    passed = service_settings(environ)
    assert passed == {
        "GPUPORTAL_ALERTS_INTERVAL_S": "15",
        "GPUPORTAL_ALERTS_WEBHOOK_URL": "http://127.0.0.1:9/hook",
        "GPUPORTAL_CULL_IDLE_GPU_SERVERS": "true",
        "GPUPORTAL_DASHBOARDS_COOKIE_SECRET": "c0ffee",
        "GPUPORTAL_PRICING_FILE": "/srv/prices.yaml",
        "GPUPORTAL_SIMULATED_SAMPLES": "false",
    }
    config = _config(tmp_path, run_as_root=False, passed=passed)
    portal, _spawner, dashboards = services(config)
    env = portal["environment"]
    assert env["GPUPORTAL_SIMULATED_SAMPLES"] == "false"  # over the demo's default
    assert env["GPUPORTAL_ALERTS_INTERVAL_S"] == "15"
    assert env["GPUPORTAL_CULL_IDLE_GPU_SERVERS"] == "true"
    assert env["GPUPORTAL_PRICING_FILE"] == "/srv/prices.yaml"
    assert env["GPUPORTAL_DATABASE_URL"] == f"sqlite:///{tmp_path / 'portal' / 'portal.sqlite'}"
    assert env["GPUPORTAL_INVENTORY"] == "demo"
    assert "GPUPORTAL_DASHBOARDS_COOKIE_SECRET" not in env
    assert dashboards["environment"] == {"GPUPORTAL_DASHBOARDS_COOKIE_SECRET": "c0ffee"}


def test_the_demo_prices_gpus_unless_told_otherwise(tmp_path: Path) -> None:
    from portal.accounting.prices import load_price_config

    prices = demo_pricing_file()
    config = _config(tmp_path, run_as_root=False, pricing_file=prices)
    assert services(config)[0]["environment"]["GPUPORTAL_PRICING_FILE"] == str(prices)
    book = load_price_config(prices).book
    # Every model of the simulated inventory has a price.
    models = {gpu.model for node in choose_inventory().nodes for gpu in node.gpus}
    assert models <= set(book.schedules), models - set(book.schedules)
    assert (
        "GPUPORTAL_PRICING_FILE"
        not in services(_config(tmp_path, run_as_root=False))[0]["environment"]
    )


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
    # 2 HGX x 8; its admins may raise the limit to the whole flavor, never the guarantee.
    assert quotas["team-a"]["H100-80GB"] == {
        "guaranteed": 8,
        "limit": 16,
        "ceiling_guaranteed": 8,
        "ceiling_limit": 16,
    }
    assert quotas["team-b"]["H100-80GB"] == {
        "guaranteed": 0,
        "limit": 1,
        "ceiling_guaranteed": 0,
        "ceiling_limit": 16,
    }
    assert quotas["team-b"]["T4/share"] == {  # 4 T4s
        "guaranteed": 2000,
        "limit": 4000,
        "ceiling_guaranteed": 2000,
        "ceiling_limit": 4000,
    }
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

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM the demo, as a service manager would (or SIGINT, as Ctrl-C does), and wait
        for it to exit."""
        self.remember_descendants()
        if self.process.poll() is None:
            self.process.send_signal(signum)
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


def _launch(state_dir: Path, env_more: Mapping[str, str] | None = None) -> Demo:
    """Start `gpuportal demo` in a process group of its own, without waiting for it."""
    port = free_port()
    log = state_dir.parent / f"{state_dir.name}.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUPORTAL_")},
        **(env_more or {}),
        "GPUPORTAL_STATE_DIR": str(state_dir),
        "GPUPORTAL_DEMO_PASSWORD": PASSWORD,
    }
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(GPUPORTAL), "demo", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            process_group=0,
        )
    return Demo(process=process, url=f"http://127.0.0.1:{port}", log=log)


def _start_demo(state_dir: Path, env_more: Mapping[str, str] | None = None) -> Demo:
    """Start `gpuportal demo` and wait until the hub API answers through the proxy."""
    demo = _launch(state_dir, env_more)
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


# The alerts issue's example: settings on `scripts/demo` must reach the portal service.
SHARED_DEMO_SETTINGS = {
    "GPUPORTAL_SIMULATED_SAMPLES": "false",
    "GPUPORTAL_ALERTS_INTERVAL_S": "15",
    "GPUPORTAL_CULL_IDLE_GPU_SERVERS": "true",
    # The server-gone reconcile judges a workload after 2 s, not 30, and runs every 2 s: the
    # test of it waits seconds, not most of a minute. No other shared test runs a notebook.
    "GPUPORTAL_HUB_RECONCILE_INTERVAL_S": "2",
    "GPUPORTAL_HUB_RECONCILE_MIN_AGE_S": "2",
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One demo shared by the tests of this module that change little (each says what)."""
    running = _start_demo(tmp_path_factory.mktemp("demo") / "state", SHARED_DEMO_SETTINGS)
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
    lines = demo.log.read_text(errors="replace").splitlines()
    assert lines[0] == f"gpuportal demo: open {demo.url}/ and log in with password {PASSWORD} as"
    # One user per role, each with what it may do.
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:7]}
    assert listed == demo_users()
    assert listed["carol"].startswith("platform admin")
    assert listed["frank"].startswith("leadership")
    assert lines[7] == (
        "settings passed to the services: GPUPORTAL_ALERTS_INTERVAL_S=15, "
        "GPUPORTAL_CULL_IDLE_GPU_SERVERS=true, GPUPORTAL_HUB_RECONCILE_INTERVAL_S=2, "
        "GPUPORTAL_HUB_RECONCILE_MIN_AGE_S=2, GPUPORTAL_SIMULATED_SAMPLES=false"
    )
    assert lines[8] == "prices: example prices (demo)"
    assert lines[9].startswith("inventory (simulated): ")


def _service_settings(demo: Demo, after: int = 0) -> list[dict[str, str]]:
    """The portal service's own report of its settings, from each start since log line
    ``after``."""
    found = []
    for line in demo.log.read_text(errors="replace").splitlines()[after:]:
        if line.startswith("{") and '"settings given: ' in line:
            found.append(json.loads(line)["settings"])
    return found


@pytest.mark.hub
def test_settings_set_on_the_demo_reach_the_portal_service(demo: Demo) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (reports := _service_settings(demo)):
        assert time.monotonic() < deadline, demo.log_tail()
        time.sleep(0.5)
    given = reports[0]
    assert {k: given[k] for k in SHARED_DEMO_SETTINGS} == SHARED_DEMO_SETTINGS
    assert given["GPUPORTAL_PRICING_FILE"] == str(demo_pricing_file())
    # What the service does with them: the culler is its one alert action, and no synthetic
    # samples are fed (no in-process agent loop among its loops).
    assert '"alerts every 15 s with 1 action(s), budgets on"' in demo.log.read_text(
        errors="replace"
    )
    metrics = httpx.get(
        f"{demo.url}/services/gpuportal/metrics",
        headers={"Authorization": f"token {_user_token(demo, 'carol')}"},
    )
    assert metrics.status_code == 200, metrics.text[:300]
    loops = set(re.findall(r'gpuportal_loop_runs_total\{loop="([^"]+)"\}', metrics.text))
    assert {"alerts", "hub-servers"} <= loops and "agent" not in loops, loops


def _user_token(demo: Demo, user: str) -> str:
    """A token the hub made for ``user`` (all of their scopes), as at <hub>/hub/token."""
    with _login(demo.url, user) as client:
        made = client.post(
            f"/hub/api/users/{user}/tokens",
            json={"note": "test", "expires_in": 3600},
            headers={"X-XSRFToken": client.cookies["_xsrf"]},
        )
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    return token


@contextmanager
def _api(demo: Demo, user: str) -> Iterator[Portal]:
    """The portal as ``user``, through the hub's proxy."""
    portal = Portal(f"{demo.url}/services/gpuportal/", _user_token(demo, user))
    try:
        yield portal
    finally:
        portal.close()


def _serve_pid(demo: Demo) -> int | None:
    demo.remember_descendants()
    found = [
        pid
        for pid, started in demo.seen
        if _running(pid, started) and "portal.cli serve" in _cmdline(pid)
    ]
    return found[0] if found else None


@pytest.mark.hub
def test_a_quota_edit_survives_the_portal_killed_and_restarted_by_the_hub(demo: Demo) -> None:
    # Changes team-b's H100 limit to 2 (no other shared test depends on it).
    with _api(demo, "erin") as portal:  # team-b's tenant admin
        before = portal.quota("team-b", "H100-80GB")
        assert before.value.limit == 1
        portal.set_quota("team-b", "H100-80GB", guaranteed=0, limit=2, if_match=before.etag)
    pid = _serve_pid(demo)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    # The hub notices its service died and starts it again, which applies the seed again.
    deadline = time.monotonic() + START_TIMEOUT_S
    while (new := _serve_pid(demo)) in (None, pid):
        assert time.monotonic() < deadline, (
            f"the hub did not restart the portal:\n{demo.log_tail()}"
        )
        time.sleep(0.5)
    with _api(demo, "erin") as portal:
        while True:
            try:
                after = portal.quota("team-b", "H100-80GB").value
                break
            except PortalError:
                assert time.monotonic() < deadline, demo.log_tail()
                time.sleep(0.5)
    assert (after.limit, after.version) == (2, before.value.version + 1)
    assert "kept as edited since the seed was applied" in demo.log.read_text(errors="replace")
    assert new != pid


@pytest.mark.hub
def test_the_portal_releases_a_notebook_whose_server_the_hub_does_not_run(demo: Demo) -> None:
    # A notebook workload as a spawner names it, for a server alice does not run (as one left
    # behind when its release could not reach the portal).
    with _api(demo, "alice") as portal:
        ghost = portal.request(
            "team-a", "T4/share", milli=250, gpu_memory_mib=3072, name="alice/ghost"
        )
        assert ghost.state == "running"
        kept = portal.request("team-a", "T4/share", milli=250, gpu_memory_mib=3072, name="notes")
        # The reconcile judges a workload after 2 s and runs every 2 s (SHARED_DEMO_SETTINGS).
        asked = time.monotonic()
        deadline = asked + 120
        while (now := portal.status(ghost.id)).state == "running":
            assert time.monotonic() < deadline, demo.log_tail()
            time.sleep(0.5)
        assert (now.state, now.reason) == ("released", "server-gone")
        # Sooner than the default minimum age of 30 s allows: the setting reached the loop.
        assert time.monotonic() - asked < 30, demo.log_tail()
        # Not a spawner's name: no server to check, left alone.
        assert portal.status(kept.id).state == "running"
        portal.release(kept.id)
    assert "the hub no longer runs alice's server 'ghost'" in demo.log.read_text(errors="replace")


def _oauth_scopes(demo: Demo, user: str) -> set[str]:
    """The scopes of the OAuth token the hub gave the dashboards when ``user`` opened them."""
    with _login(demo.url, user) as client:
        deadline = time.monotonic() + START_TIMEOUT_S
        while client.get(DASHBOARDS_URL, follow_redirects=True).status_code != 200:
            assert time.monotonic() < deadline, demo.log_tail()
            time.sleep(1)
    # A second session: the dashboards set an _xsrf cookie of their own in the first.
    with _login(demo.url, user) as client:
        tokens = client.get(
            f"/hub/api/users/{user}/tokens", headers={"X-XSRFToken": client.cookies["_xsrf"]}
        )
    assert tokens.status_code == 200, tokens.text
    # The dashboards' OAuth client is named after the service ("Service dashboards").
    oauth = [
        t for t in tokens.json()["api_tokens"] if "dashboards" in (t.get("oauth_client") or "")
    ]
    assert oauth, tokens.json()
    return set(oauth[-1]["scopes"])


DASHBOARDS_URL = "/services/dashboards/"
PORTAL = "custom:gpuportal:"


@pytest.mark.hub
@pytest.mark.parametrize(
    ("user", "held", "not_held"),
    [
        # The platform admin: every view of every tenant (Cluster needs inventory:read, Tenant
        # quotas:read and quotas:write), though the dashboards may not ask for admin itself.
        (
            "carol",
            {"inventory:read", "quotas:read", "quotas:write", "cost:read", "queue:read"},
            {"admin"},
        ),
        ("dave", {"quotas:write!group=team-a", "cost:read!group=team-a"}, {"quotas:write"}),
        ("erin", {"quotas:write!group=team-b"}, {"quotas:write!group=team-a"}),
        ("alice", {"workloads:write!group=team-a"}, {"quotas:write!group=team-a"}),
        ("frank", {"cost:read", "usage:read"}, {"quotas:read", "workloads:read"}),
    ],
)
def test_each_demo_role_gets_its_scopes_in_the_dashboards(
    demo: Demo, user: str, held: set[str], not_held: set[str]
) -> None:
    scopes = _oauth_scopes(demo, user)
    assert {PORTAL + s for s in held} <= scopes, scopes
    assert not {PORTAL + s for s in not_held} & scopes, scopes


@pytest.mark.hub
@pytest.mark.parametrize("user", ["alice", "bob", "carol", "dave", "erin", "frank"])
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
    tenants = {"team-a": ["alice", "dave"], "team-b": ["bob", "erin"]}
    assert {name: groups[name] for name in tenants} == tenants
    others = {name: users for name, users in groups.items() if name not in tenants}
    assert others == {
        "gpuportal-admins": ["carol"],
        "gpuportal-leadership": ["frank"],
        "team-a-admins": ["dave"],
        "team-b-admins": ["erin"],
    }


# The three leaked servers: a whole H100, a MIG 3g.40gb and a T4 share.
SERVERS = {
    "bob": ("team-b", "gpu:H100-80GB:1"),
    "alice": ("team-a", "mig:A100-80GB:3g.40gb"),
    "dave": ("team-a", "share:T4:250"),
}
CLIENT_CHECK = (
    "from portal.client import Portal; p = Portal(); q = p.queue(); "
    "print('queue', len(q)); print('workloads', *[w.name for w in p.workloads()])"
)


def _spawn(demo: Demo, user: str, tenant: str, option: str) -> None:
    with _login(demo.url, user) as client:
        form = client.get(f"/hub/spawn/{user}")
        assert form.status_code == 200
        if user == "bob":
            # team-b may hold one whole H100: offered now; four are over its limit.
            assert re.search(r"1 × H100-80GB <span[^>]*>available now", form.text)
            assert re.search(r"4 × H100-80GB NVLink <span[^>]*>not allowed", form.text)
        chosen = {"tenant": tenant, f"option-{tenant}": option, "_xsrf": client.cookies["_xsrf"]}
        posted = client.post(f"/hub/spawn/{user}", data=chosen)
        assert posted.status_code == 302, posted.text


def _wait_for_lab(demo: Demo, user: str, deadline: float) -> str:
    with _login(demo.url, user) as client:
        while True:
            lab = client.get(f"/user/{user}/lab", follow_redirects=True)
            if lab.status_code == 200 and lab.url.path == f"/user/{user}/lab":
                return lab.text
            assert time.monotonic() < deadline, f"{user}'s lab is not up:\n{demo.log_tail()}"
            time.sleep(0.5)


def _allocations(state_dir: Path) -> list[AllocationRecord]:
    store = Store(f"sqlite:///{state_dir / 'portal' / 'portal.sqlite'}")
    try:
        return store.allocations_between(
            datetime(1970, 1, 2, tzinfo=UTC), datetime(2999, 1, 1, tzinfo=UTC)
        )
    finally:
        store.close()


@pytest.mark.hub
@pytest.mark.slow
def test_spawned_servers_use_the_portal_and_ctrl_c_releases_their_gpus(
    tmp_path: Path,
    demo_factory: list[Demo],
    record_testsuite_property: Callable[[str, object], None],
) -> None:
    state = tmp_path / "state"
    demo = _start_demo(state)
    demo_factory.append(demo)
    started = time.monotonic()
    for user, (tenant, option) in SERVERS.items():
        _spawn(demo, user, tenant, option)
    deadline = started + LAB_TIMEOUT_S
    labs = {user: _wait_for_lab(demo, user, deadline) for user in SERVERS}
    record_testsuite_property("lab_spawn_s", f"{time.monotonic() - started:.1f}")
    assert all("JupyterLab" in text for text in labs.values())
    assert (state / "home" / "bob").is_dir()

    demo.remember_descendants()
    labs_pids = {
        user: pid
        for pid, _ in demo.seen
        for user in SERVERS
        if "jupyterhub.singleuser" in _cmdline(pid) and _environ(pid).get("JUPYTERHUB_USER") == user
    }
    assert set(labs_pids) == set(SERVERS), [_cmdline(pid) for pid, _ in demo.seen]
    env = _environ(labs_pids["bob"])
    assert env["GPUPORTAL_TENANT"] == "team-b" and env["GPUPORTAL_FLAVOR"] == "H100-80GB"
    assert env["CUDA_VISIBLE_DEVICES"] == env["GPUPORTAL_GPU_UUIDS"]
    # Simulated GPUs carry stable UUIDs (GPU-sim-<node>-<index>), as real ones do.
    assert re.fullmatch(r"GPU-sim-[a-z0-9-]+-[0-7]", env["CUDA_VISIBLE_DEVICES"])
    assert env["CUDA_VISIBLE_DEVICES"].endswith(f"-{env['GPUPORTAL_GPUS']}")

    # The README's notebook client and CLI, from a process with only the server's environment
    # (as its JupyterLab terminal has): found on PATH, at GPUPORTAL_URL, with the server's token.
    cli = subprocess.run(
        ["gpuportal", "queue"], env=env, capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    client = subprocess.run(
        ["python", "-c", CLIENT_CHECK], env=env, capture_output=True, text=True, timeout=60
    )
    assert client.returncode == 0, client.stdout + client.stderr
    # bob's token sees team-b's workloads only: his own server's.
    assert client.stdout.splitlines() == ["queue 0", "workloads bob/default"], client.stdout
    running = [a for a in _allocations(state) if a.released_at is None]
    assert len(running) == 3, running

    demo.stop(signal.SIGINT)  # Ctrl-C
    stopped = datetime.now(UTC)
    assert demo.process.returncode is not None, "the demo ignored SIGINT"
    assert demo.alive() == [], f"left running after SIGINT:\n{demo.log_tail()}"
    # Each server released its GPUs before the portal stopped: nothing charged after the stop.
    allocations = _allocations(state)
    assert len(allocations) == 3
    assert all(a.released_at is not None and a.released_at <= stopped for a in allocations), (
        allocations,
        demo.log_tail(),
    )
    assert "PortalUnreachable" not in demo.log.read_text(errors="replace")

    again = _start_demo(state)
    demo_factory.append(again)
    with _api(again, "alice") as portal:
        assert portal.workloads() == []
    assert _allocations(state) == allocations


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
    hubs = [pid for pid, _ in demo.seen if "-m portal.demohub --config" in _cmdline(pid)]
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
        h100 = seed["tenants"]["team-a"]["quotas"]["H100-80GB"]
        assert (h100["guaranteed"], h100["limit"]) == (4, 8)
    else:
        assert found.spec == "demo" and summary.startswith("inventory (simulated): ")
