"""The views are defined once (``portal.dashboard_views``): the app serves each of them, builds
each one's own page under its title, and the dashboards' OAuth token may carry what they use."""

from __future__ import annotations

from dashboards.app import Settings, applications, build_view, page_titles
from dashboards.auth import TokenArgIdentity
from portal.dashboard_views import DASHBOARD_VIEWS, DASHBOARDS_OAUTH_SCOPES, LANDING_TITLE
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import VIEWERS


def test_the_app_serves_the_landing_page_and_every_view_under_its_title() -> None:
    settings = Settings("http://127.0.0.1:9/", TokenArgIdentity({}), 10.0)
    assert list(applications(settings)) == ["/", *(f"/{v.name}" for v in DASHBOARD_VIEWS)]
    titles = page_titles()
    assert titles["/"].endswith(LANDING_TITLE)
    assert [titles[f"/{v.name}"] for v in DASHBOARD_VIEWS] == [
        f"gpuportal — {v.title}" for v in DASHBOARD_VIEWS
    ]


def test_every_view_has_its_own_page_not_the_landing_page(portal: Portal) -> None:
    root = VIEWERS["tok-root"]
    for view in DASHBOARD_VIEWS:
        page = build_view(view.name, portal.source("tok-root"), root, {})
        assert page.title == view.title, view.name
        assert all(store.error == "" for store in page.stores), view.name


def test_a_view_opens_with_scopes_it_uses_and_the_oauth_token_may_carry_them() -> None:
    for view in DASHBOARD_VIEWS:
        assert set(view.opens_with) <= set(view.uses), view.name
        assert set(view.uses) <= set(DASHBOARDS_OAUTH_SCOPES), view.name
