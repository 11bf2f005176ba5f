"""A real JupyterHub for tests: configuration text in, a running hub out.

``hub_factory`` (a fixture) starts ``jupyterhub`` as a subprocess in its own session, on
loopback ports chosen for it, with the configurable-http-proxy that scripts/bootstrap installed,
a SQLite database and a cookie secret in a directory of its own. The caller's configuration text
is appended to the base configuration, so it may set anything (authenticator, spawner, services,
roles); a callable gets the chosen ``HubPorts`` first and returns the text. Every hub the
factory started, its proxy, its hub-managed services and every server seen below it are stopped
in teardown.

``RunningHub.restart()`` stops the hub (SIGTERM, as a service manager would) and starts it again
on the same ports, directory and database: with ``c.JupyterHub.cleanup_servers = False`` the
users' servers keep running across it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from portal.demo import find_proxy
from tests.support.ports import free_port

JUPYTERHUB = Path(sys.executable).parent / "jupyterhub"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class HubPorts:
    """The hub's ports, all on 127.0.0.1: the proxy's public one, the hub API, the proxy API."""

    public: int
    hub: int
    proxy_api: int

    @classmethod
    def free(cls) -> HubPorts:
        return cls(free_port(), free_port(), free_port())


def base_config(directory: Path, ports: HubPorts) -> str:
    """What every test hub needs: loopback ports, the local proxy, state in ``directory``."""
    settings: dict[str, object] = {
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": ports.public,
        "JupyterHub.hub_ip": "127.0.0.1",
        "JupyterHub.hub_port": ports.hub,
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{ports.proxy_api}",
        "ConfigurableHTTPProxy.command": [str(find_proxy())],
        "ConfigurableHTTPProxy.pid_file": str(directory / "proxy.pid"),
        "JupyterHub.db_url": f"sqlite:///{directory / 'jupyterhub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(directory / "jupyterhub_cookie_secret"),
        "JupyterHub.pid_file": str(directory / "jupyterhub.pid"),
    }
    lines = ["c = get_config()  # noqa: F821"]
    lines += [f"c.{name} = {value!r}" for name, value in settings.items()]
    return "\n".join(lines) + "\n"


ConfigText = str | Callable[[HubPorts], str]


@dataclass
class RunningHub:
    """A started hub. ``url`` is the public (proxy) URL, ``api_url`` the hub's REST API."""

    directory: Path
    ports: HubPorts
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    seen: set[tuple[int, int]] = field(default_factory=set)
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.public}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.hub}/hub/api"

    @property
    def log(self) -> Path:
        return self.directory / "jupyterhub.log"

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the hub and wait until its API answers through the proxy; fails the test with
        its log if not."""
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"\n--- start {self.starts} ---\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                [str(JUPYTERHUB), "-f", str(self.directory / "jupyterhub_config.py")],
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"jupyterhub exited with {self.process.returncode}:\n{self.log_tail()}")
            # Through the proxy: the hub answers on its own port before it has added its
            # routes to the proxy.
            with suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/hub/api/", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"hub API not up after {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def remember_descendants(self) -> None:
        """Record every process below the hub now (proxy, services, servers)."""
        if self.process is not None:
            self.seen |= _descendants(self.process.pid)

    def stop(self) -> None:
        """SIGTERM the hub and wait for it; what it stops (per its config) stops with it."""
        process = self.process
        if process is None:
            return
        self.remember_descendants()
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.process = None

    def restart(self) -> None:
        """Stop the hub and start it again with the same ports, directory and database."""
        self.stop()
        self.start()

    def kill_everything(self) -> None:
        """Stop the hub and kill whatever was seen below it and still runs (teardown)."""
        self.stop()
        for pid, started in self.seen:
            if _running(pid, started):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while any(_running(p, s) for p, s in self.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid, started in self.seen:
            if _running(pid, started):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


HubFactory = Callable[..., RunningHub]


def make_hub(
    directory: Path,
    config: ConfigText,
    *,
    env: Mapping[str, str] | None = None,
    ports: HubPorts | None = None,
) -> RunningHub:
    """Write the configuration into ``directory`` (created) without starting anything.

    ``config`` is text appended to the base configuration; a callable gets the ports first.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ports = ports or HubPorts.free()
    text = config(ports) if callable(config) else config
    (directory / "jupyterhub_config.py").write_text(base_config(directory, ports) + text)
    return RunningHub(directory=directory, ports=ports, env={**os.environ, **(env or {})})


@pytest.fixture
def hub_factory(tmp_path: Path) -> Iterator[HubFactory]:
    """``hub_factory(config, env=None, name="hub")`` starts a hub and returns it running.

    Every hub it started is stopped, with all processes seen below it, after the test.
    """
    hubs: list[RunningHub] = []

    def start(
        config: ConfigText,
        *,
        env: Mapping[str, str] | None = None,
        name: str = "hub",
    ) -> RunningHub:
        hub = make_hub(tmp_path / name, config, env=env)
        hubs.append(hub)
        hub.start()
        hub.remember_descendants()
        return hub

    yield start
    for hub in hubs:
        hub.kill_everything()


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may itself hold spaces and parentheses.
    return raw[raw.rindex(")") + 2 :].split()


def _running(pid: int, started: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def _descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below ``root``; the start time survives pid
    reuse."""
    table: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = fields
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found: set[tuple[int, int]] = set()
    frontier = [root]
    while frontier:
        for pid in children.get(frontier.pop(), []):
            found.add((pid, int(table[pid][19])))
            frontier.append(pid)
    return found
