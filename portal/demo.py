"""The one-command demo: JupyterHub, the portal service and gpuportal's local spawner on SQLite.

JupyterHub runs the portal (``gpuportal serve``) as a hub-managed service with its own SQLite
database, seeded with the demo tenants' quotas (``demo_seed``), over the simulated demo inventory
or, when NVML finds GPUs here, the real ones (``choose_inventory``). Users pick a GPU option on
the spawn page and get a JupyterLab pinned to the allocated devices (``GPUSimpleLocalSpawner``).

Every role of the portal has a demo user (``DEMO_ROLES``): a platform admin, one tenant admin
per tenant, members and a leadership viewer. The ``GPUPORTAL_*`` settings of the service
(``service_settings``) set where ``gpuportal demo`` runs are passed on to it: JupyterHub gives
its services only the environment their entry names. The demo prices GPUs with example prices
(``portal/data/demo-pricing.yaml``) unless ``GPUPORTAL_PRICING_FILE`` says otherwise. Spawned
servers get ``GPUPORTAL_URL``, a ``PATH`` that finds this Python's ``gpuportal`` and a token with
the portal scopes their user holds, so the notebook client and the CLI work in them.

``hub_config`` builds the hub's configuration from typed inputs with no I/O, ``render_config``
turns it into a ``jupyterhub_config.py``; ``prepare`` writes the state directory and ``run_hub``
runs JupyterHub (``portal.demohub``: servers stop before the portal) as a child until it exits,
passing on Ctrl-C and SIGTERM, and then stops any process the hub left behind.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import FrameType

import yaml

from policies.capacity import flavor_capacity
from policies.errors import PortalError
from policies.flavors import Flavor, FlavorKind
from policies.inventory import Node
from portal.dashboard_views import DASHBOARDS_OAUTH_SCOPES
from portal.demo_settings import (
    DASHBOARDS_SETTINGS,
    check_service_settings,
    demo_pricing_file,
    service_settings,
)
from portal.hubroles import HubRolesSpec, custom_scopes, load_roles
from portal.settings import Settings
from spawner import hubconfig

# Tenants are JupyterHub groups; the demo has two, each with a member and a tenant admin.
DEMO_TENANTS: Mapping[str, tuple[str, ...]] = {"team-a": ("alice",), "team-b": ("bob",)}
DEMO_TENANT_ADMINS: Mapping[str, tuple[str, ...]] = {"team-a": ("dave",), "team-b": ("erin",)}
# The platform admin (also the hub's admin) and the leadership viewer belong to no tenant.
DEMO_ADMINS: tuple[str, ...] = ("carol",)
DEMO_LEADERSHIP: tuple[str, ...] = ("frank",)
DASHBOARDS_SERVICE = "dashboards"
_ROLES = HubRolesSpec(tenants=tuple(DEMO_TENANTS), oauth_services=(DASHBOARDS_SERVICE,))

# What each demo user may do, in words for the banner, in the order it lists them.
DEMO_ROLES: Mapping[str, str] = {
    **dict.fromkeys(DEMO_ADMINS, "platform admin: every view and tenant, hub admin"),
    **{
        user: f"tenant admin of {tenant}: its quotas and cost, and its GPUs"
        for tenant, users in DEMO_TENANT_ADMINS.items()
        for user in users
    },
    **{
        user: f"member of {tenant}: its GPUs, queue and usage"
        for tenant, users in DEMO_TENANTS.items()
        for user in users
    },
    **dict.fromkeys(DEMO_LEADERSHIP, "leadership: cost and usage of every tenant, read-only"),
}


PROXY_PROGRAM = "configurable-http-proxy"
# Where scripts/bootstrap installs the proxy (npm --prefix), relative to the repository root.
_LOCAL_NODE_BIN = Path(".cache/node/bin")
_REPO_ROOT = Path(__file__).resolve().parents[1]

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>

# JupyterLab's first start on a small machine can take longer than the hub's 60 s default.
_SPAWN_TIMEOUT_S = 180
_MAX_QUEUE_WAIT_S = 1800
SEED_FILE = "portal-seed.yaml"


@dataclass(frozen=True, slots=True)
class HubPorts:
    """The TCP ports of the demo, all on loopback except ``public``."""

    public: int
    hub_api: int
    proxy_api: int
    portal: int
    dashboards: int


@dataclass(frozen=True, slots=True)
class DemoInventory:
    """Where the portal's GPUs come from: ``spec`` is its GPUPORTAL_INVENTORY value."""

    spec: str
    source: str  # in words, for the banner
    nodes: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """Everything ``run_hub`` needs, and what to tell the person who started the demo."""

    state_dir: Path
    config_file: Path
    url: str
    password: str
    inventory: DemoInventory
    passed: Mapping[str, str]  # GPUPORTAL_* settings passed on to the services
    pricing: str  # where the prices come from, in words


def demo_users() -> dict[str, str]:
    """Each demo user with its role in words, e.g. ``{"alice": "member of team-a: ..."}``."""
    return dict(DEMO_ROLES)


def demo_groups() -> dict[str, list[str]]:
    """The hub groups of the demo and their users: tenants (members and their admins), the
    tenants' admin groups, leadership and platform admins."""
    groups = {
        tenant: sorted({*members, *DEMO_TENANT_ADMINS.get(tenant, ())})
        for tenant, members in DEMO_TENANTS.items()
    }
    for tenant, admins in DEMO_TENANT_ADMINS.items():
        groups[_ROLES.admin_group(tenant)] = list(admins)
    groups[_ROLES.leadership_group] = list(DEMO_LEADERSHIP)
    groups[_ROLES.platform_admin_group] = list(DEMO_ADMINS)
    return groups


def demo_seed(nodes: Sequence[Node]) -> dict[str, object]:
    """The portal's seed (``portal.service.seed`` format) for the demo tenants over ``nodes``.

    team-a may use every flavor: half of it guaranteed, all of it as its limit. team-b may use
    MIG instances and shares the same way, but at most one whole GPU of each model: its spawn
    page shows multi-GPU options as not allowed, and a second whole GPU queues. The platform's
    ceilings let each tenant's admins raise its limit up to the whole flavor, never its
    guarantee (guarantees are the platform's to give).
    """
    capacity = flavor_capacity(nodes)
    tenants = list(DEMO_TENANTS)
    quotas: dict[str, dict[str, dict[str, int]]] = {t: {} for t in tenants}
    for flavor, amount in sorted(capacity.items()):
        whole = Flavor.parse(flavor).kind is FlavorKind.GPU
        given = {
            tenants[0]: ((amount + 1) // 2, amount),
            tenants[1]: (0, 1) if whole else (amount // 2, amount),
        }
        for tenant, (guaranteed, limit) in given.items():
            quotas[tenant][flavor] = {
                "guaranteed": guaranteed,
                "limit": limit,
                "ceiling_guaranteed": guaranteed,
                "ceiling_limit": amount,
            }
    return {"tenants": {t: {"quotas": quotas[t]} for t in tenants}}


def hub_config(
    settings: Settings,
    *,
    password: str,
    proxy_command: Path,
    ports: HubPorts,
    python: str,
    run_as_root: bool,
    inventory: str = "demo",
    spawner_token: str = "",
    passed: Mapping[str, str] | None = None,
    pricing_file: Path | None = None,
    search_path: str = os.defpath,
) -> dict[str, dict[str, object]]:
    """The hub configuration as ``{section: {trait: value}}``; pure, for tests and rendering.

    ``passed``: ``GPUPORTAL_*`` settings for the services (``service_settings``), over the
    demo's own defaults; ``pricing_file``: the demo's prices unless ``passed`` names others;
    ``search_path``: the ``PATH`` of the servers, after this Python's own directory.
    """
    state = settings.state_dir
    passed = dict(passed or {})
    users = sorted(demo_users())
    singleuser_args = ["--allow-root"] if run_as_root else []
    defaults = {
        # Synthetic utilization for simulated GPUs (ignored when NVML finds real ones).
        "GPUPORTAL_SIMULATED_SAMPLES": "true",
        # The reconcile that releases GPUs of servers gone while the portal was down.
        "GPUPORTAL_HUB_RECONCILE_INTERVAL_S": "15",
    }
    if pricing_file is not None:
        defaults["GPUPORTAL_PRICING_FILE"] = str(pricing_file)
    portal = hubconfig.portal_service(
        f"http://127.0.0.1:{ports.portal}",
        [python, "-m", "portal.cli", "serve", "--seed", str(state / SEED_FILE)],
        environment={
            **defaults,
            **{k: v for k, v in passed.items() if k not in DASHBOARDS_SETTINGS},
            "GPUPORTAL_STATE_DIR": str(state / "portal"),
            "GPUPORTAL_DATABASE_URL": f"sqlite:///{state / 'portal' / 'portal.sqlite'}",
            "GPUPORTAL_INVENTORY": inventory,
        },
        cwd=state,
    )
    portal_url = _portal_url(ports)
    server_path = os.pathsep.join(p for p in (str(Path(python).parent), search_path) if p)
    return {
        "JupyterHub": {
            "bind_url": f"http://{_host_for_url(settings.demo_ip)}:{ports.public}/",
            "hub_ip": "127.0.0.1",
            "hub_port": ports.hub_api,
            "db_url": f"sqlite:///{state / 'jupyterhub.sqlite'}",
            "cookie_secret_file": str(state / "jupyterhub_cookie_secret"),
            "authenticator_class": "jupyterhub.auth.DummyAuthenticator",
            "spawner_class": "spawner.local.GPUSimpleLocalSpawner",
            "load_groups": {name: {"users": users} for name, users in demo_groups().items()},
            "custom_scopes": custom_scopes(),
            "load_roles": [*load_roles(_ROLES), hubconfig.spawner_role()],
            "services": [
                portal,
                hubconfig.spawner_service(spawner_token),
                *_dashboards_services(ports, python, passed),
            ],
            "cleanup_servers": True,
            "cleanup_proxy": True,
        },
        "Authenticator": {
            "allowed_users": users,
            "admin_users": list(DEMO_ADMINS),
        },
        "DummyAuthenticator": {"password": password},
        "ConfigurableHTTPProxy": {
            "command": [str(proxy_command)],
            "api_url": f"http://127.0.0.1:{ports.proxy_api}",
            "pid_file": str(state / "proxy.pid"),
        },
        "Spawner": {
            "cmd": [python, "-m", "jupyterhub.singleuser"],
            "args": singleuser_args,
            "default_url": "/lab",
            "start_timeout": _SPAWN_TIMEOUT_S,
            "http_timeout": _SPAWN_TIMEOUT_S,
            # The notebook client and the CLI in a server: where the portal is (the hub's
            # API port does not route /services/), `gpuportal` on PATH, and a token with the
            # portal scopes the user holds (the hub keeps their tenant filters).
            "environment": {"GPUPORTAL_URL": portal_url, "PATH": server_path},
            "server_token_scopes": hubconfig.server_token_scopes(),
        },
        "GPUSimpleLocalSpawner": {
            "home_dir_template": str(state / "home" / "{username}"),
            # A demo queue wait is short: long enough to watch the position change.
            "max_queue_wait": _MAX_QUEUE_WAIT_S,
        },
    }


# ---- the dashboards service ------------------------------------------------------------
# The dashboards (Panel apps) run as a hub-managed service behind the hub's OAuth, under
# /services/dashboards/, listed on the hub's home page; every portal role may access them.


def dashboards_service(
    url: str, portal_url: str, python: str, name: str = DASHBOARDS_SERVICE
) -> dict[str, object]:
    """An entry of ``c.JupyterHub.services`` running ``gpuportal dashboards`` at ``url``,
    reading the portal at ``portal_url`` with each viewer's own OAuth token."""
    return {
        "name": name,
        "url": url,
        "command": [python, "-m", "portal.cli", "dashboards", "--portal-url", portal_url],
        "display": True,  # listed under Services on the hub's home page
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [
            *(s.value for s in DASHBOARDS_OAUTH_SCOPES),
            f"access:services!service={name}",
        ],
    }


def _portal_url(ports: HubPorts) -> str:
    return f"http://127.0.0.1:{ports.portal}/services/{hubconfig.PORTAL_SERVICE}/"


def _dashboards_services(ports: HubPorts, python: str, passed: Mapping[str, str]) -> list[object]:
    svc = dashboards_service(f"http://127.0.0.1:{ports.dashboards}", _portal_url(ports), python)
    env = {k: v for k, v in passed.items() if k in DASHBOARDS_SETTINGS}
    if env:
        svc["environment"] = env
    return [svc]


def render_config(config: Mapping[str, Mapping[str, object]]) -> str:
    """A ``jupyterhub_config.py`` that sets exactly ``config`` (values must be literals)."""
    lines = [
        "# Written by `gpuportal demo` on every start; edits are overwritten.",
        "c = get_config()  # noqa: F821",
        "",
    ]
    for section, traits in config.items():
        lines.extend(f"c.{section}.{name} = {value!r}" for name, value in traits.items())
    return "\n".join(lines) + "\n"


def find_proxy(repo_root: Path = _REPO_ROOT) -> Path:
    """The configurable-http-proxy that scripts/bootstrap installed, else the one on PATH.

    Raises:
        PortalError: neither exists.
    """
    local = repo_root / _LOCAL_NODE_BIN / PROXY_PROGRAM
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(PROXY_PROGRAM)
    if found:
        return Path(found)
    raise PortalError(
        f"{PROXY_PROGRAM} not found in {_LOCAL_NODE_BIN}/ nor on PATH; "
        "run `scripts/bootstrap runtime` to install it"
    )


def prepare(settings: Settings) -> DemoPlan:
    """Create the state directory and write the hub configuration and the portal's seed.

    Raises:
        PortalError: the state directory cannot be created or written, or the proxy is missing.
    """
    proxy = find_proxy()
    state = settings.state_dir
    inventory = choose_inventory()
    check_service_settings()  # the portal's own Settings were read already, by the CLI
    passed = service_settings(os.environ)
    pricing = None if "GPUPORTAL_PRICING_FILE" in passed else demo_pricing_file()
    try:
        (state / "home").mkdir(parents=True, exist_ok=True)
        (state / "portal").mkdir(parents=True, exist_ok=True)
        password = _demo_password(settings)
        ports = HubPorts(
            public=settings.demo_port,
            hub_api=_free_port(),
            proxy_api=_free_port(),
            portal=_free_port(),
            dashboards=_free_port(),
        )
        seed = yaml.safe_dump(demo_seed(inventory.nodes), sort_keys=False)
        (state / SEED_FILE).write_text(seed, encoding="utf-8")
        config = hub_config(
            settings,
            password=password,
            proxy_command=proxy,
            ports=ports,
            python=sys.executable,
            run_as_root=os.geteuid() == 0,
            inventory=inventory.spec,
            # A fresh token at every start: the hub stores the one its configuration names.
            spawner_token=secrets.token_urlsafe(32),
            passed=passed,
            pricing_file=pricing,
            search_path=os.environ.get("PATH", os.defpath),
        )
        config_file = state / "jupyterhub_config.py"
        config_file.touch(mode=0o600)  # it holds the spawner's token
        config_file.write_text(render_config(config), encoding="utf-8")
    except OSError as exc:
        raise PortalError(
            f"cannot write the demo state directory {state}: {exc.strerror}; "
            "set GPUPORTAL_STATE_DIR to a writable directory"
        ) from exc
    return DemoPlan(
        state_dir=state,
        config_file=config_file,
        url=f"http://{_host_for_url(settings.demo_ip, display=True)}:{settings.demo_port}/",
        password=password,
        inventory=inventory,
        passed=passed,
        pricing="example prices (demo)" if pricing is not None else "from GPUPORTAL_PRICING_FILE",
    )


_SECRET_HINTS = ("SECRET", "TOKEN", "PASSWORD", "URL")


def banner(plan: DemoPlan) -> str:
    """What to tell the person who started the demo: where to go, who to log in as (one user
    per role) and with which password, and the settings passed on to the services."""
    width = max(map(len, DEMO_ROLES))
    lines = [f"gpuportal demo: open {plan.url} and log in with password {plan.password} as"]
    lines += [f"  {user:<{width}}  {role}" for user, role in DEMO_ROLES.items()]
    shown = [
        f"{k}=(set)" if any(h in k for h in _SECRET_HINTS) else f"{k}={v}"
        for k, v in plan.passed.items()
    ]
    lines.append(
        "settings passed to the services: " + (", ".join(shown) if shown else "none (defaults)")
    )
    lines.append(f"prices: {plan.pricing}")
    return "\n".join(lines)


@cache
def choose_inventory() -> DemoInventory:
    """The GPUs NVML finds on this machine, else the simulated demo inventory."""
    # Imported here: only the demo needs them (and pynvml is slow to import).
    from portal.inventory import nvml, simulated

    try:
        node = nvml.discover()
    except nvml.NvmlError:
        node = None
    if node is not None and node.gpus:
        return DemoInventory("nvml", "NVML", (node,))
    return DemoInventory("demo", "simulated", tuple(simulated.load_demo()))


def inventory_summary() -> str:
    """One line of the demo's inventory: where it comes from, nodes, and GPUs by model."""
    inventory = choose_inventory()
    nodes = inventory.nodes
    by_model = Counter(gpu.model for node in nodes for gpu in node.gpus)
    models = ", ".join(f"{count}x {model}" for model, count in sorted(by_model.items()))
    gpus = sum(by_model.values())
    return f"inventory ({inventory.source}): {len(nodes)} nodes, {gpus} GPUs: {models or 'none'}"


def run_hub(plan: DemoPlan) -> int:
    """Run JupyterHub until it exits, and leave no process of it behind; returns its status.

    SIGINT, SIGTERM and SIGHUP to this process become one SIGTERM to the hub, which stops the
    users' servers (while the portal still answers their releases), then its services and its
    proxy. JupyterHub starts those in sessions of their own and handles signals only once it is
    up, so a signal during start-up (or a crash) would orphan them:
    this process is made their subreaper (Linux) and stops whatever is left after the hub.
    """
    _become_subreaper()
    argv = [sys.executable, "-m", "portal.demohub", "--config", str(plan.config_file)]
    try:
        # Its own process group: a terminal's Ctrl-C reaches only this process, which
        # forwards it once.
        hub = subprocess.Popen(argv, cwd=plan.state_dir, stdin=subprocess.DEVNULL, process_group=0)
    except OSError as exc:
        raise PortalError(f"cannot start JupyterHub with {sys.executable}: {exc}") from exc

    def stop(_signum: int, _frame: FrameType | None) -> None:
        with suppress(ProcessLookupError):
            hub.send_signal(signal.SIGTERM)

    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, stop) for signum in stop_signals}
    try:
        status = hub.wait()
    finally:
        left = _stop_orphans()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if left:
        print(f"gpuportal demo: stopped {left} process(es) the hub left behind", file=sys.stderr)
    return 128 - status if status < 0 else status


def _become_subreaper() -> None:
    # PR_SET_CHILD_SUBREAPER: orphaned descendants are re-parented to us instead of init.
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children() -> list[int]:
    """Live (non-zombie) children of this process, read from /proc."""
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        state, ppid = raw[raw.rindex(")") + 2 :].split()[:2]
        if ppid == me and state != "Z":
            found.append(int(stat.parent.name))
    return found


def _reap() -> None:
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _stop_orphans(grace_s: float = 10.0) -> int:
    """SIGTERM every child left (then SIGKILL after ``grace_s``); returns how many there were."""
    signalled: set[int] = set()
    deadline = time.monotonic() + grace_s
    while True:
        _reap()
        children = _children()
        if not children:
            return len(signalled)
        late = time.monotonic() > deadline
        for pid in children:
            if late or pid not in signalled:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                signalled.add(pid)
        time.sleep(0.1)


def _demo_password(settings: Settings) -> str:
    if settings.demo_password is not None:
        return settings.demo_password.get_secret_value()
    stored = settings.state_dir / "demo-password"
    if stored.is_file():
        kept = stored.read_text(encoding="utf-8").strip()
        if kept:
            return kept
    password = secrets.token_urlsafe(9)
    stored.touch(mode=0o600)
    stored.write_text(password + "\n", encoding="utf-8")
    return password


def _free_port() -> int:
    # Ask the kernel for an unused loopback port; the hub binds it a moment later.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _host_for_url(ip: str, *, display: bool = False) -> str:
    if ip in ("", "0.0.0.0"):
        return socket.gethostname() if display else "0.0.0.0"
    return f"[{ip}]" if ":" in ip else ip
