"""My work's Launch form and Jobs section in Chromium (the served app over a portal with a job
controller; stand-in runner at the process boundary): a refused launch shows the portal's field
and message, a launched job appears in the Jobs table, and the page has no JavaScript errors."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from dashboards.app import Settings, serve
from dashboards.auth import TokenArgIdentity
from portal.allocator import Allocator
from portal.jobs.controller import JobController
from tests.dashboards.conftest import Portal, running_portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.dashboards.test_browser import WAIT_MS, Console
from tests.portal.jobs.conftest import FakeRunner, make_backend
from tests.support.browser import chromium
from tests.support.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def listening(port: int, timeout_s: float = 60.0) -> None:
    """Wait until the served app accepts connections (its thread starts the server)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"the dashboards did not listen on {port}"
            time.sleep(0.1)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Portal, str]]:
    runner = FakeRunner(tmp_path)  # STAND-IN runner: no processes, no GPUs here

    def controller(alloc: Allocator) -> JobController:
        return JobController(alloc, backend=make_backend(runner))

    with running_portal(tmp_path, controller) as portal:
        port = free_port()
        settings = Settings(
            portal.url, TokenArgIdentity(VIEWERS), refresh_s=1.0, clock=lambda: NOW.timestamp()
        )
        server: Any = serve(settings, port=port, threaded=True)
        try:
            listening(port)
            yield portal, f"http://127.0.0.1:{port}"
        finally:
            server.stop()


@pytest.fixture
def page() -> Iterator[tuple[Page, Console]]:
    with chromium() as browser:
        b: Browser = browser
        p = b.new_page(viewport={"width": 1400, "height": 1400})
        console = Console()
        console.watch(p)
        yield p, console


def field(p: Page, label: str) -> Any:
    return p.locator(".bk-input-group", has_text=label).locator("input").first


def test_launch_form_refuses_then_launches_a_job(
    page: tuple[Page, Console], served: tuple[Portal, str]
) -> None:
    p, console = page
    portal, url = served
    assert portal.jobs is not None
    p.goto(f"{url}/my_work?token=tok-alice", timeout=WAIT_MS)
    launch = p.get_by_role("button", name="Launch")
    expect(launch).to_be_visible(timeout=WAIT_MS)
    expect(p.get_by_text("You have no training jobs.").first).to_be_visible()
    command = field(p, "command")
    command.fill("python train.py --name 'run one'")
    command.press("Enter")
    cwd = field(p, "working directory")
    cwd.fill("relative/dir")
    cwd.press("Enter")
    launch.click()
    expect(p.get_by_text("not launched: cwd: ").first).to_be_visible(timeout=WAIT_MS)
    assert portal.jobs.jobs() == []
    cwd.fill("/work/run")
    cwd.press("Enter")
    launch.click()
    expect(p.get_by_text("launched python (").first).to_be_visible(timeout=WAIT_MS)
    (job,) = portal.jobs.jobs()
    assert job.job.spec["command"] == ["python", "train.py", "--name", "run one"]
    # The Jobs table (the workloads table above lists the job's workload by the same name).
    table = p.locator("table.gp-table").filter(has_text="restarts / preemptions")
    expect(table).to_contain_text(job.job.id, timeout=WAIT_MS)
    cells = [t.strip() for t in table.locator("tbody tr").first.locator("td").all_inner_texts()]
    state = portal.jobs.get(job.job.id).state.value  # nothing steps the controller here
    assert cells[1:5] == [job.job.id, "team-a", state, "1 × 1 H100-80GB"]
    assert console.errors == []
