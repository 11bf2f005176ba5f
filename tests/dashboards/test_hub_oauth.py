"""The production path: a real JupyterHub runs the portal (``gpuportal serve``) and the
dashboards (``gpuportal dashboards``, behind HubOAuth) as managed services, configured by
``portal.demo``'s service entry and ``portal.hubroles``' roles. People log in through the hub's
form and its OAuth redirects (an HTTP client following them, like a browser), and each page is
built from the portal's answers to the viewer's own OAuth token.

The pages themselves render over Bokeh's websocket, so they are read in Debian's Chromium
(Playwright, no browser download), logged in through the hub's form.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import create_engine

from policies.alerts.engine import Alert, AlertKey, AlertState
from portal.alerting.store import AlertStore
from portal.demo import DASHBOARDS_SERVICE, dashboards_service, demo_seed
from portal.hubroles import HubRolesSpec, custom_scopes, load_roles
from portal.inventory import simulated
from spawner import hubconfig
from tests.support.browser import chromium
from tests.support.hub import RunningHub, make_hub
from tests.support.ports import free_port

pytestmark = [pytest.mark.hub, pytest.mark.slow]

PASSWORD = "dashboards-test-password"
USERS = {
    "alice": "team-a",  # member of team-a
    "anna": "team-a-admins",  # tenant admin of team-a
    "lee": "gpuportal-leadership",
    "carol": "gpuportal-admins",  # the platform admin: custom:gpuportal:admin
}
DASHBOARDS = f"/services/{DASHBOARDS_SERVICE}/"
UP_TIMEOUT_S = 120.0
WAIT_MS = 120_000  # two shared CPUs: a first render may take a while under load


def _config(directory: Path, portal_port: int, dashboards_port: int) -> str:
    seed = directory / "portal-seed.yaml"
    seed.write_text(yaml.safe_dump(demo_seed(simulated.load_demo())))
    state = directory / "portal"
    state.mkdir(parents=True, exist_ok=True)
    portal = hubconfig.portal_service(
        f"http://127.0.0.1:{portal_port}",
        [sys.executable, "-m", "portal.cli", "serve", "--seed", str(seed)],
        environment={
            "GPUPORTAL_STATE_DIR": str(state),
            "GPUPORTAL_DATABASE_URL": f"sqlite:///{state / 'portal.sqlite'}",
            "GPUPORTAL_INVENTORY": "demo",
        },
        cwd=directory,
    )
    portal_url = f"http://127.0.0.1:{portal_port}/services/{hubconfig.PORTAL_SERVICE}/"
    dashboards = dashboards_service(
        f"http://127.0.0.1:{dashboards_port}", portal_url, sys.executable
    )
    groups = {g: {"users": [u for u, gu in USERS.items() if gu == g]} for g in USERS.values()}
    roles = HubRolesSpec(tenants=("team-a", "team-b"), oauth_services=(DASHBOARDS_SERVICE,))
    settings: dict[str, object] = {
        "JupyterHub.authenticator_class": "jupyterhub.auth.DummyAuthenticator",
        "DummyAuthenticator.password": PASSWORD,
        "Authenticator.allowed_users": sorted(USERS),
        "JupyterHub.load_groups": groups,
        "JupyterHub.custom_scopes": custom_scopes(),
        "JupyterHub.load_roles": load_roles(roles),
        "JupyterHub.services": [portal, dashboards],
    }
    return "".join(f"c.{k} = {v!r}\n" for k, v in settings.items())


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hub")


@pytest.fixture(scope="module")
def hub(hub_dir: Path) -> Iterator[RunningHub]:
    # Module-scoped: one hub (and its two services) for every test here.
    directory = hub_dir
    portal_port, dashboards_port = free_port(), free_port()
    running = make_hub(directory, lambda _ports: _config(directory, portal_port, dashboards_port))
    try:
        running.start()
        running.remember_descendants()
        _wait_for(f"http://127.0.0.1:{dashboards_port}{DASHBOARDS}", running)
        running.remember_descendants()
        yield running
    finally:
        running.kill_everything()


def _wait_for(url: str, hub: RunningHub) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            # Not logged in: the dashboards answer with a redirect to the hub's OAuth.
            if httpx.get(url, timeout=5).status_code in (200, 302):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the dashboards service did not answer at {url}:\n{hub.log_tail()}")


@contextmanager
def _login(hub: RunningHub, user: str) -> Iterator[httpx.Client]:
    """A client logged in to the hub as ``user`` (the hub's form, xsrf cookie and field)."""
    with httpx.Client(base_url=hub.url, timeout=60, follow_redirects=True) as client:
        assert client.get("/hub/login").status_code == 200
        done = client.post(
            "/hub/login",
            data={"username": user, "password": PASSWORD, "_xsrf": client.cookies["_xsrf"]},
            follow_redirects=False,  # not on to the user's server: only the login matters
        )
        assert done.status_code == 302, done.text[:500]
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@contextmanager
def _browse_as(browser: Browser, hub: RunningHub, user: str) -> Iterator[Page]:
    """A fresh browser context logged in to the hub as ``user`` through its form."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{hub.url}/hub/login", timeout=WAIT_MS)
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", PASSWORD)
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_url(re.compile(r".*/(hub|user)/(?!login).*"), timeout=WAIT_MS)
        yield page
    finally:
        context.close()


def test_the_hub_home_page_links_the_dashboards(hub: RunningHub) -> None:
    with _login(hub, "alice") as client:
        home = client.get("/hub/home")
    assert home.status_code == 200
    assert f'href="{DASHBOARDS}"' in home.text


def test_an_anonymous_visitor_is_sent_to_the_hub_login(hub: RunningHub) -> None:
    with httpx.Client(base_url=hub.url, timeout=60, follow_redirects=True) as client:
        page = client.get(f"{DASHBOARDS}tenant?tenant=team-a")
    # Through the hub's OAuth authorize step to its login form: no dashboard without a login.
    assert page.status_code == 200
    assert str(page.url).startswith(f"{hub.url}/hub/login"), page.url
    assert 'name="password"' in page.text


@pytest.mark.browser
@pytest.mark.parametrize(
    ("user", "views"),
    [
        ("alice", ["My work", "Tenant", "Cluster"]),
        ("anna", ["My work", "Tenant", "Cluster", "Cost"]),
        ("lee", ["Cost"]),
    ],
)
def test_the_landing_page_lists_the_views_the_oauth_token_opens(
    browser: Browser, hub: RunningHub, user: str, views: list[str]
) -> None:
    with _browse_as(browser, hub, user) as page:
        page.goto(f"{hub.url}{DASHBOARDS}", timeout=WAIT_MS)
        # The OAuth round trip ends back on the dashboards, not on the hub.
        assert page.url.startswith(f"{hub.url}{DASHBOARDS}"), page.url
        expect(page.get_by_text(f"Hello {user}")).to_be_visible(timeout=WAIT_MS)
        assert page.locator("a.gp-link").all_inner_texts() == views


@pytest.mark.browser
def test_the_tenant_admin_sees_their_tenant_only(browser: Browser, hub: RunningHub) -> None:
    with _browse_as(browser, hub, "anna") as page:
        for query in ("", "?tenant=team-b"):
            page.goto(f"{hub.url}{DASHBOARDS}tenant{query}", timeout=WAIT_MS)
            # The demo seed: team-a's H100-80GB quota is 8 guaranteed, 16 limit (2 HGX x 8).
            cells = page.locator("table.gp-table tr").filter(
                has=page.locator("td:first-child", has_text=re.compile("^H100-80GB$"))
            )
            expect(cells.first).to_be_visible(timeout=WAIT_MS)
            texts = [t.strip() for t in cells.first.locator("td").all_inner_texts()]
            assert texts[:3] == ["H100-80GB", "8", "16"]
            expect(page.get_by_role("button", name="Save quota")).to_be_visible()
            assert "team-b" not in page.content()


@pytest.mark.browser
def test_node_health_shows_the_platform_admin_the_xid_and_a_member_not_shown(
    browser: Browser, hub: RunningHub, hub_dir: Path
) -> None:
    """An XID error fires on hgx-2's GPU 3 (a platform alert, no tenant), written where the
    hub's portal keeps its alerts. carol's token, narrowed by the hub to the dashboards'
    allowed scopes, still reads the inventory and every alert (admin's subscopes); alice, a
    member, may read the inventory but not the platform's alerts: "not shown", not healthy."""
    now = time.time()
    engine = create_engine(f"sqlite:///{hub_dir / 'portal' / 'portal.sqlite'}")
    try:
        AlertStore(engine).save(
            [
                Alert(
                    AlertKey("xid", "GPU-sim-hgx-2-3", "GPU-sim-hgx-2-3"),
                    AlertState.FIRING,
                    None,
                    None,
                    (),
                    "XID 79: fell off the bus",
                    79.0,
                    now - 600,
                    now - 300,
                )
            ]
        )
    finally:
        engine.dispose()
    health = re.compile(r"Node health")
    with _browse_as(browser, hub, "carol") as page:
        page.goto(f"{hub.url}{DASHBOARDS}cluster", timeout=WAIT_MS)
        expect(page.get_by_text(health)).to_be_visible(timeout=WAIT_MS)
        xid = page.locator("table.gp-table tr").filter(has_text="XID 79: fell off the bus")
        expect(xid).to_be_visible(timeout=WAIT_MS)
        cells = [t.strip() for t in xid.locator("td").all_inner_texts()]
        assert cells == ["hgx-2", "3", "XID", "firing", "XID 79: fell off the bus"]
        assert "lacks scope" not in page.content()
    with _browse_as(browser, hub, "alice") as page:
        page.goto(f"{hub.url}{DASHBOARDS}cluster", timeout=WAIT_MS)
        expect(page.get_by_text(health)).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_text("not shown", exact=True)).to_be_visible(timeout=WAIT_MS)
        assert "no health alerts" not in page.content() and "XID 79" not in page.content()
