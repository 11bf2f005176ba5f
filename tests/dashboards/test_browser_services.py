"""My work's Services section in Chromium (the served app over a portal with a service
controller; stand-in runner, probe and sleep calls at the process boundary): the service's
row and its replicas show, a scale-up arrives by live update, and the page has no JavaScript
errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboards.app import Settings, serve
from dashboards.auth import TokenArgIdentity
from portal.client import Portal as Client
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.dashboards.test_browser import WAIT_MS, Console
from tests.dashboards.test_browser_jobs import listening, page  # noqa: F401  (a fixture)
from tests.dashboards.test_services_view import by_name, deploy, portal, settle  # noqa: F401
from tests.support.ports import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def served(portal: Portal) -> Iterator[str]:  # noqa: F811
    port = free_port()
    settings = Settings(
        portal.url, TokenArgIdentity(VIEWERS), refresh_s=1.0, clock=lambda: NOW.timestamp()
    )
    server: Any = serve(settings, port=port, threaded=True)
    try:
        listening(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def cells(p: Page) -> list[str]:
    table = p.locator("table.gp-table").filter(has_text="first byte p50 / p99")
    return [t.strip() for t in table.locator("tbody tr").first.locator("td").all_inner_texts()]


def test_my_work_shows_a_service_and_its_scale_up_live(
    page: tuple[Page, Console],  # noqa: F811
    portal: Portal,  # noqa: F811
    served: str,
) -> None:
    p, console = page
    llm = deploy("tok-alice", portal, "team-a", "llm", max_replicas=2, warm=1)
    settle(portal, "tok-alice", lambda found: found[0].ready == 1 and found[0].asleep == 1)
    p.goto(f"{served}/my_work?token=tok-alice", timeout=WAIT_MS)
    table = p.locator("table.gp-table").filter(has_text="first byte p50 / p99")
    expect(table).to_contain_text("llm", timeout=WAIT_MS)
    # service, tenant, owner, state, serving, starting, queued, warm asleep, min–max (warm)
    assert cells(p)[:9] == ["llm", "team-a", "alice", "active", "1", "0", "0", "1", "1–2 (1)"]
    replicas = p.locator("table.gp-table").filter(has_text="ready since")
    expect(replicas).to_contain_text("asleep", timeout=WAIT_MS)
    with Client(portal.url, "tok-alice") as alice:
        alice.services.scale(llm.id, min_replicas=2)
    settle(portal, "tok-alice", lambda found: by_name(found, "llm").ready == 2)
    expect(table.locator("tbody tr").first.locator("td").nth(4)).to_have_text("2", timeout=WAIT_MS)
    assert console.errors == []
