"""The served dashboards in Debian's Chromium (Playwright, no browser download): every view
loads without JavaScript errors and shows the seeded dataset's numbers; a live update arrives
without a reload; the quota editor round-trips through the UI. Screenshots are saved in the
test's directory and copied to ``docs/images/``.

Viewers are named by the development setting (``?token=``, ``TokenArgIdentity``).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from dashboards import app as dashboards_app
from dashboards.app import Settings, serve
from dashboards.auth import TokenArgIdentity
from policies.alerts.engine import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore
from tests.dashboards.conftest import Portal, running_portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.dashboards.test_telemetry import gpu_of, post_minutes
from tests.support.browser import chromium
from tests.support.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
WAIT_MS = 120_000  # two shared CPUs: a first render may take a while under load


@dataclass
class Served:
    portal: Portal
    url: str
    shots: Path


@dataclass
class Console:
    """JavaScript errors of a page: console errors and uncaught exceptions."""

    errors: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> None:
        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                self.errors.append(msg.text)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("dashboards")
    with running_portal(folder) as portal:
        port = free_port()
        settings = Settings(
            portal.url, TokenArgIdentity(VIEWERS), refresh_s=1.0, clock=lambda: NOW.timestamp()
        )
        server: Any = serve(settings, port=port, threaded=True)
        try:
            yield Served(portal, f"http://127.0.0.1:{port}", folder)
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, Console]]:
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    console = Console()
    console.watch(p)
    yield p, console
    p.close()


def open_view(page: Page, served: Served, view: str, token: str) -> None:
    page.goto(f"{served.url}/{view}?token={token}", timeout=WAIT_MS)


def shoot(page: Page, served: Served, name: str) -> None:
    shot = served.shots / f"dashboard-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, DOCS_IMAGES / shot.name)


def row(page: Page, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell``."""
    exact = re.compile(f"^{re.escape(first_cell)}$")
    cells = page.locator("table.gp-table tr").filter(
        has=page.locator("td:first-child", has_text=exact)
    )
    expect(cells.first).to_be_visible(timeout=WAIT_MS)
    texts: list[str] = cells.first.locator("td").all_inner_texts()
    return [t.strip() for t in texts]


def test_cluster_view(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "cluster", "tok-ops")
    expect(p.get_by_text("GPUs 24").first).to_be_visible(timeout=WAIT_MS)
    expect(p).to_have_title("gpuportal — Cluster")
    expect(p.get_by_text("allocated 7.6 GPUs (32%)").first).to_be_visible()
    expect(p.get_by_text("fragmentation 14%").first).to_be_visible()
    # Guarantees: those the viewer may read (an operator without quotas:read sees none).
    assert row(p, "H100-80GB") == ["H100-80GB", "16", "9", "0", ""]
    assert row(p, "T4/share") == ["T4/share", "4,000", "3,750", "0", ""]
    # The selected node (a100-1, first by name): its MIG instances, GPU 0's first.
    assert row(p, "0") == ["0", "3g.40gb", "0", "free"]
    expect(p.locator("canvas").first).to_be_visible(timeout=WAIT_MS)  # the heatmap follows
    shoot(p, served, "cluster")
    assert console.errors == []
    # The page loads Bokeh and Panel but not MathJax (1.8 MB no page here needs).
    loaded = p.evaluate("performance.getEntriesByType('resource').map(r => r.name)")
    assert any("bokeh" in url for url in loaded)
    assert [url for url in loaded if "mathjax" in url.lower()] == []


def test_tenant_view_for_its_admin(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    # A tenant-wide alert: its admins see it; members (My work) do not.
    now = NOW.timestamp()
    burn = "team-a is projected to spend 5,000.00 USD this month, budget 500.00"
    AlertStore(served.portal.allocator.store.engine).save(
        [
            Alert(
                AlertKey("budget_burn", "team-a", "money"),
                AlertState.FIRING,
                "team-a",
                None,
                (),
                burn,
                10.0,
                now - 3600,
                now - 1800,
            )
        ]
    )
    open_view(p, served, "tenant", "tok-anna")
    expect(p.get_by_text("Tenant team-a").first).to_be_visible(timeout=WAIT_MS)
    assert row(p, "H100-80GB") == ["H100-80GB", "4", "8", "5", "1", "0"]
    assert row(p, "T4/share") == ["T4/share", "500", "1,000", "250", "0", "0"]
    # Members: 126 GPU-hours this month; priced without telemetry, so use is unknown, not 0.
    assert row(p, "alice") == ["alice", "3", "0", "5", "126.0", "not measured", "not measured"]
    assert row(p, "nb-alice") == [
        "nb-alice",
        "alice",
        "notebook",
        "hgx-1: GPU 0 (H100-80GB ×1)",
        "not measured",
    ]
    assert row(p, "budget burn") == ["budget burn", "firing", "—", burn]
    p.set_viewport_size({"width": 1400, "height": 1300})  # the whole view in the screenshot
    expect(p.get_by_role("button", name="Save quota")).to_be_visible()
    assert "team-b" not in p.content()
    shoot(p, served, "tenant")
    assert console.errors == []


def test_tenant_view_for_a_member_has_no_editor(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "tenant", "tok-bob")
    expect(p.get_by_text("Tenant team-b").first).to_be_visible(timeout=WAIT_MS)
    assert row(p, "1")[:5] == ["1", "1", "train-b", "bob", "quota"]
    expect(p.get_by_text("Changing quotas needs").first).to_be_visible()
    assert p.get_by_role("button", name="Save quota").count() == 0
    assert console.errors == []


def test_my_work_view(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    _, node, gpu = gpu_of(served.portal, "nb-alice")
    post_minutes(served.portal, node, gpu)  # 30, 60, 90 % by the minute; test_telemetry.py
    open_view(p, served, "my_work", "tok-alice")
    expect(p.get_by_text("running 3").first).to_be_visible(timeout=WAIT_MS)
    expect(p.get_by_text("whole GPUs held 5").first).to_be_visible()
    expect(p.get_by_text("hgx-1: GPU 4,5,6,7 (H100-80GB ×4) borrowed").first).to_be_visible()
    assert row(p, "train-a")[3:] == ["running", "hgx-1: GPU 4,5,6,7 (H100-80GB ×4) borrowed"]
    expect(p.get_by_role("button", name="Stop / cancel")).to_be_visible()
    usage = p.locator("table.gp-table").filter(has_text="GPU util now")
    expect(usage).to_be_visible()
    cells = usage.locator("tbody td").all_inner_texts()
    assert cells == ["nb-alice", "90%", "60%", "20,480", "20,480"]
    shoot(p, served, "my-work")
    assert console.errors == []


def test_cost_view(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "cost", "tok-lead")
    expect(p.get_by_text("cost 681.26 USD").first).to_be_visible(timeout=WAIT_MS)
    assert row(p, "team-a")[:2] == ["team-a", "482.40"]
    assert row(p, "team-b")[:2] == ["team-b", "198.86"]
    assert row(p, "H100-80GB")[:2] == ["H100-80GB", "672.00"]
    expect(p.get_by_role("button", name="Chargeback CSV")).to_be_visible()
    expect(p.locator("canvas").first).to_be_visible(timeout=WAIT_MS)  # the chart follows
    shoot(p, served, "cost")
    assert console.errors == []


def test_cost_opened_by_a_member_says_why_instead_of_loading_for_ever(
    page: tuple[Page, Console], served: Served
) -> None:
    p, console = page
    open_view(p, served, "cost", "tok-alice")  # not offered to her: typed or bookmarked
    expect(p.get_by_text("Cost is not shown: your roles do not let you read cost.")).to_be_visible(
        timeout=WAIT_MS
    )
    assert p.locator(".pn-loading").count() == 0  # no chart left spinning
    assert p.get_by_role("button", name="Chargeback CSV").count() == 0
    assert "custom:gpuportal" not in p.content()
    assert console.errors == []


def test_landing_routes_by_scopes(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "", "tok-lead")
    expect(p.get_by_text("Hello lead").first).to_be_visible(timeout=WAIT_MS)
    links = p.locator("a.gp-link").all_inner_texts()
    assert links == ["My work", "Tenant", "Cost"]
    shoot(p, served, "landing")
    p.locator("a.gp-link", has_text="Cost").click()
    expect(p.get_by_text("cost 681.26 USD").first).to_be_visible(timeout=WAIT_MS)
    assert console.errors == []


def test_live_update_without_reload(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "my_work", "tok-bob")
    expect(p.get_by_text("queued 1").first).to_be_visible(timeout=WAIT_MS)
    p.evaluate("window.__not_reloaded = true")
    queued = next(w.id for w in served.portal.allocator.workloads() if w.name == "train-b")
    served.portal.allocator.release(queued)
    expect(p.get_by_text("queued 0").first).to_be_visible(timeout=WAIT_MS)
    assert p.evaluate("window.__not_reloaded") is True
    assert console.errors == []


def test_quota_edit_through_the_ui(page: tuple[Page, Console], served: Served) -> None:
    p, console = page
    open_view(p, served, "tenant", "tok-anna")
    save = p.get_by_role("button", name="Save quota")
    expect(save).to_be_visible(timeout=WAIT_MS)
    limit = p.locator(".bk-input-group", has_text="limit").locator("input")
    guaranteed = p.locator(".bk-input-group", has_text="guaranteed").locator("input")

    # Invalid: limit below guaranteed. A clear message; the portal keeps the quota.
    limit.fill("3")
    limit.press("Enter")
    save.click()
    expect(p.get_by_text("invalid limit 3: expected at least guaranteed (4)").first).to_be_visible(
        timeout=WAIT_MS
    )
    q = next(q for q in served.portal.allocator.quotas("team-a") if q.flavor == "H100-80GB")
    assert (q.guaranteed, q.limit) == (4, 8)

    # Valid: saved with the ETag, then shown in the Tenant view's numbers.
    guaranteed.fill("3")
    guaranteed.press("Enter")
    limit.fill("6")
    limit.press("Enter")
    save.click()
    expect(p.get_by_text("saved H100-80GB: guaranteed 3, limit 6").first).to_be_visible(
        timeout=WAIT_MS
    )
    q = next(q for q in served.portal.allocator.quotas("team-a") if q.flavor == "H100-80GB")
    assert (q.guaranteed, q.limit) == (3, 6)
    expect(
        p.locator("table.gp-table tr").filter(has=p.locator("td", has_text="H100-80GB")).first
    ).to_contain_text("6", timeout=WAIT_MS)
    assert row(p, "H100-80GB")[:3] == ["H100-80GB", "3", "6"]
    p.set_viewport_size({"width": 1400, "height": 1450})  # down to the editor's message
    shoot(p, served, "quota-editor")
    assert console.errors == []


def test_only_watched_pages_refresh(
    browser: Browser, served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's periodic refresh reads the portal while a browser shows it and stops when the
    page is closed (Bokeh keeps a closed page's session for 15 s or more)."""
    runs: list[str] = []
    original = dashboards_app.Page.refresh

    def counted(self: dashboards_app.Page) -> None:
        runs.append(self.title)
        original(self)

    monkeypatch.setattr(dashboards_app.Page, "refresh", counted)
    p = browser.new_page(viewport={"width": 1400, "height": 1000})
    open_view(p, served, "cluster", "tok-ops")
    expect(p.get_by_text("GPUs 24").first).to_be_visible(timeout=WAIT_MS)
    deadline = time.monotonic() + 30
    while "Cluster" not in runs and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Cluster" in runs  # refreshes every second while shown
    p.close()
    time.sleep(1.5)  # a refresh already running when the page closed
    after_close = len(runs)
    time.sleep(3)  # three refresh periods
    assert runs[after_close:] == []
