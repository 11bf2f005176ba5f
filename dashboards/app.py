"""Serve the dashboards: one Bokeh/Panel application per view, each session acting as its
viewer. ``build_view`` makes a view without a server (tests); ``serve`` serves them all;
``serve_hub_service`` is the production entry point behind JupyterHub OAuth.
"""

from __future__ import annotations

import gc
import html
import os
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import panel as pn
from bokeh.document import Document
from panel.viewable import Viewer

from dashboards.auth import HubOAuthIdentity, Identify, Identity
from dashboards.cluster import ClusterView
from dashboards.cost import CostView
from dashboards.forecast_view import CapacityForecastView
from dashboards.jobs_view import JobsView
from dashboards.landing import LandingView
from dashboards.my_work import MyWorkView
from dashboards.ray_view import RayClustersView
from dashboards.services_view import ServicesView
from dashboards.sources import ApiSource, Source
from dashboards.stores import (
    CapacityForecastStore,
    ClusterStore,
    CostStore,
    JobsStore,
    MyWorkStore,
    RayStore,
    ServicesStore,
    Store,
    TenantStore,
    tenants_for,
)
from dashboards.stores.base import may_not
from dashboards.tenant import TenantView
from dashboards.warmup import warm_up
from portal.api.auth import Caller, Scope
from portal.dashboard_views import DASHBOARD_VIEWS, LANDING_TITLE

TITLE = "gpuportal"
# What each page is called: in its header and the browser tab.
TITLES = {"landing": LANDING_TITLE} | {view.name: view.title for view in DASHBOARD_VIEWS}


@dataclass
class Page:
    """A view, the stores to refresh periodically, and the page's title."""

    title: str
    view: pn.viewable.Viewable | Viewer
    stores: list[Store] = field(default_factory=list)

    def refresh(self) -> None:
        for s in self.stores:
            s.refresh()


def _tenant_page(
    source: Source, viewer: Caller, args: Mapping[str, str], clock: Callable[[], float]
) -> Page:
    names = (
        source.tenants()
        if viewer.can_everywhere(Scope.QUOTAS_READ)
        else tenants_for(viewer, Scope.QUOTAS_READ)
    )
    if not names:
        return Page(TITLES["tenant"], pn.pane.Markdown("*No tenant you may see.*"))
    wanted = args.get("tenant", "")
    store = TenantStore(source, tenant=wanted if wanted in names else names[0], clock=clock)
    services = ServicesStore(source, tenant=store.tenant, clock=clock)
    ray = RayStore(source, tenant=store.tenant, clock=clock)
    page = Page(TITLES["tenant"], pn.Column(sizing_mode="stretch_width"), [store, services, ray])
    choose = pn.widgets.Select(label="tenant", options=names, value=store.tenant, width=240)

    def view() -> TenantView:
        shown = ServicesView(services, empty=f"{store.tenant} runs no inference services.")
        clusters = RayClustersView(ray, empty=f"{store.tenant} runs no Ray clusters.")
        return TenantView(store, viewer, shown, clusters)

    def show(tenant: str) -> None:
        store.tenant = services.tenant = ray.tenant = tenant
        store.message = ""
        store.refresh()
        services.refresh()
        ray.refresh()
        page.view[:] = [choose, view()]  # type: ignore[index]

    choose.param.watch(lambda e: show(e.new), "value")
    page.view[:] = [choose, view()]  # type: ignore[index]
    return page


def build_view(
    view: str,
    source: Source,
    viewer: Caller,
    args: Mapping[str, str],
    clock: Callable[[], float] = time.time,
) -> Page:
    """The page of ``view`` for ``viewer``, read once; ``args`` are the page's arguments,
    ``clock`` (epoch s) ends the time windows of telemetry."""
    page: Page
    if view == "cluster":
        cluster = ClusterStore(
            source,
            selected=args.get("node", ""),
            platform_alerts=viewer.can_everywhere(Scope.WORKLOADS_READ),
        )
        page = Page(TITLES["cluster"], ClusterView(cluster), [cluster])
    elif view == "tenant":
        page = _tenant_page(source, viewer, args, clock)
    elif view == "cost":
        if viewer.holds_any(Scope.COST_READ):
            cost = CostStore(source)
            every_ray = RayStore(source, stopped=True, clock=clock)
            stores: list[Store] = [cost, every_ray]
            forecast = None
            # The capacity forecast covers every tenant: only unfiltered cost readers get it.
            if viewer.can_everywhere(Scope.COST_READ):
                outlook = CapacityForecastStore(source)
                forecast = CapacityForecastView(outlook)
                stores.append(outlook)
            shown_ray = RayClustersView(every_ray, empty="no Ray cluster this month")
            page = Page(TITLES["cost"], CostView(cost, forecast, shown_ray), stores)
        else:  # opened by its address: say so instead of a page of refused reads
            page = Page(
                TITLES["cost"],
                pn.pane.Markdown(f"*Cost is not shown: {may_not(Scope.COST_READ)}.*"),
            )
    elif view == "my_work":
        work = MyWorkStore(source, owner=viewer.name, clock=clock)
        # The Launch form offers the tenants the viewer may start work in (the portal still
        # checks each submission); an unfiltered holder gets every tenant the portal lists.
        may_launch = (
            None
            if viewer.can_everywhere(Scope.WORKLOADS_WRITE)
            else tenants_for(viewer, Scope.WORKLOADS_WRITE)
        )
        jobs = JobsStore(source, owner=viewer.name, may_launch=may_launch)
        services = ServicesStore(source, owner=viewer.name, clock=clock)
        shown = ServicesView(services, empty="You have no inference services.")
        own_ray = RayStore(source, owner=viewer.name, clock=clock)
        own_clusters = RayClustersView(own_ray, empty="You have no Ray clusters.")
        page = Page(
            TITLES["my_work"],
            MyWorkView(work, JobsView(jobs), shown, own_clusters),
            [work, jobs, services, own_ray],
        )
    else:
        query = f"?{urlencode({'token': args['token']})}" if "token" in args else ""
        page = Page(TITLES["landing"], LandingView(viewer, query))
    page.refresh()
    return page


@dataclass(frozen=True)
class Settings:
    """How the app reaches the portal and who the viewers are.

    Args:
        portal_url: the portal's root URL as this process reaches it.
        identify: turns a session's request into the viewer (HubOAuth in production).
        refresh_s: seconds between live updates of an open page.
        clock: epoch seconds, the end of telemetry windows (tests run on a seeded clock).
    """

    portal_url: str
    identify: Identify
    refresh_s: float = 10.0
    clock: Callable[[], float] = time.time


def _session_page(view: str, settings: Settings) -> Any:
    request: Any = pn.state.curdoc.session_context.request  # type: ignore[union-attr]
    identity: Identity | None = settings.identify(request)
    if identity is None:
        return pn.pane.Markdown("## Not logged in\n\nOpen the dashboards from JupyterHub.")
    args = {k: v[0].decode("utf-8", "replace") for k, v in request.arguments.items() if v}
    source = ApiSource(settings.portal_url, identity.token)
    page = build_view(view, source, identity.viewer, args, settings.clock)
    if page.stores:
        # Live updates: the stores' parameters change and their views re-render in place.
        doc = pn.state.curdoc

        def refresh() -> None:
            if doc is not None and watched(doc):
                page.refresh()

        pn.state.add_periodic_callback(refresh, period=int(settings.refresh_s * 1000))
    home = f"./{'?' + urlencode({'token': args['token']}) if 'token' in args else ''}"
    return shell(f"{TITLE} — {page.title}", home, page.view)


HEADER_CSS = """
.gp-header { display: flex; align-items: baseline; gap: 28px; padding: 14px 20px;
  background: #0072b5; color: #fff; font-family: system-ui, sans-serif; }
.gp-header h1 { margin: 0; font-size: 22px; font-weight: 400; }
.gp-header a { color: #fff; font-size: 14px; }
"""


def shell(title: str, home: str, view: Any) -> pn.Column:
    """The page around a view: a header with the title and a link home. A plain column,
    not one of Panel's templates: a template cost every page load ~0.1 s on the server and
    Bootstrap's 0.3 MB of CSS and JavaScript in the browser, for a header bar."""
    header = pn.pane.HTML(
        f'<header class="gp-header"><h1>{html.escape(title)}</h1>'
        f'<a href="{html.escape(home)}">home</a></header>',
        stylesheets=[HEADER_CSS],
        sizing_mode="stretch_width",
        margin=0,
    )
    return pn.Column(
        header,
        pn.Column(view, sizing_mode="stretch_width", margin=(10, 20)),
        sizing_mode="stretch_width",
        margin=0,
    )


def watched(doc: Document) -> bool:
    """Whether a browser is connected to ``doc``'s session now. Refreshes skip pages nobody
    watches: Bokeh keeps a closed page's session (and its periodic callbacks) for its unused
    lifetime, 15-32 s by default, and a page not yet connected was read when it was built.
    Ten closed pages each reading the portal every second would slow every other page."""
    context = doc.session_context
    if context is None:  # not served (tests build views without a server)
        return True
    return any(
        s.id == context.id and s.connection_count > 0 for s in context.server_context.sessions
    )


def applications(settings: Settings) -> dict[str, Callable[[], Any]]:
    """The landing page at ``/`` and one application per view."""

    # Plain functions: Panel serves a function per session, not other callables.
    def app_of(view: str) -> Callable[[], Any]:
        def page() -> Any:
            return _session_page(view, settings)

        return page

    apps = {"/": app_of("landing")}
    apps |= {f"/{view.name}": app_of(view.name) for view in DASHBOARD_VIEWS}
    return apps


def page_titles() -> dict[str, str]:
    """The browser tab's title of each application (Panel sets it on every page)."""
    return {"/": f"{TITLE} — {TITLES['landing']}"} | {
        f"/{view.name}": f"{TITLE} — {view.title}" for view in DASHBOARD_VIEWS
    }


def _without_mathjax() -> None:
    """Pages without MathJax: Panel adds its 1.8 MB of JavaScript to every page that holds an
    HTML pane, in case the HTML has LaTeX in it. These pages have none, and parsing MathJax
    cost each page load 0.15-0.25 s in the browser. (Panel has no setting for this: its
    check is replaced; ``tests/dashboards/test_browser.py`` asserts the pages load no
    MathJax, so a Panel that moves the check fails there.)"""
    from panel.io import resources

    resources._panel_use_mathjax = lambda roots: False


def _icon_route() -> tuple[str, Any, dict[str, str]]:
    """``/favicon.ico`` under the prefix. Every page links the icon next to itself
    (``./favicon.ico``), but Bokeh serves it only at the server's root: behind the hub
    (``/services/dashboards/``) each page load asked for an icon that was not there (404)."""
    from panel.io.resources import DIST_DIR
    from tornado.web import StaticFileHandler

    return (r"/(favicon\.ico)", StaticFileHandler, {"path": str(DIST_DIR / "images")})


def serve(
    settings: Settings,
    *,
    address: str = "127.0.0.1",
    port: int = 0,
    prefix: str = "",
    threaded: bool = False,
    **server_kw: Any,
) -> Any:
    """Serve every view; blocks unless ``threaded`` (then returns the server's thread, which
    has ``stop()``)."""
    _without_mathjax()
    warm_up()  # the first visitor does not pay for first-use set-up (~1 s)
    # Panel, Bokeh and HoloViews are a large heap that lives as long as the process: kept out
    # of the collector's generations, full collections during a live update stop walking it.
    gc.collect()
    gc.freeze()
    if prefix:
        server_kw["extra_patterns"] = [*server_kw.get("extra_patterns", []), _icon_route()]
    return pn.serve(
        applications(settings),
        address=address,
        port=port,
        prefix=prefix,
        show=False,
        threaded=threaded,
        title=page_titles(),
        **server_kw,
    )


def _for_panel(handler: Any, url: str) -> str:
    """``url`` as Panel's page handlers need it: they put a ``.`` before the login URL (to
    stay under a prefix), so a path from the server root becomes one relative to the page."""
    from panel.io.server import LoginUrlMixin

    request: Any = handler.request  # before isinstance narrows the handler's type
    if not isinstance(handler, LoginUrlMixin) or not url.startswith("/"):
        return url
    here = posixpath.dirname(urlsplit(request.uri).path) or "/"
    path, mark, query = url.partition("?")
    return f"/{posixpath.relpath(path, here)}{mark}{query}" if here != "/" else url


def serve_hub_service(portal_url: str, *, refresh_s: float = 10.0) -> None:
    """Run as a JupyterHub service behind HubOAuth (the hub sets the ``JUPYTERHUB_*``
    environment variables); blocks."""
    from bokeh.server.auth_provider import AuthProvider
    from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
    from tornado.httputil import url_concat

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/dashboards/")
    hub_auth = HubOAuth.instance(cache_max_age=60)
    secret = os.environ.get("GPUPORTAL_DASHBOARDS_COOKIE_SECRET") or os.urandom(32).hex()

    class HubOAuthProvider(AuthProvider):
        """Bokeh's auth hook: people without the service's OAuth cookie go to the hub."""

        @property
        def get_user(self) -> Callable[[Any], Any]:
            return lambda handler: hub_auth.get_user(handler)

        @property
        def get_login_url(self) -> Callable[[Any], str]:
            def login_url(handler: Any) -> str:
                params: dict[str, str] = {}
                verifier = None
                if hub_auth.pkce_enabled:
                    verifier, challenge, method = hub_auth.generate_pkce_code_challenge()
                    params |= {"code_challenge": challenge, "code_challenge_method": method}
                params["state"] = hub_auth.set_state_cookie(
                    handler, next_url=handler.request.uri, code_verifier=verifier
                )
                url: str = url_concat(hub_auth.login_url, params)
                return _for_panel(handler, url)

            return login_url

    # The hub tells a managed service where to listen; Bokeh prefixes extra routes itself.
    url = urlsplit(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10102"))
    serve(
        Settings(portal_url, HubOAuthIdentity(hub_auth, secret), refresh_s),
        address=url.hostname or "127.0.0.1",
        port=url.port or 10102,
        prefix=prefix.rstrip("/"),
        cookie_secret=secret,
        auth_provider=HubOAuthProvider(),
        extra_patterns=[("/oauth_callback", HubOAuthCallbackHandler)],
        websocket_origin="*",
    )
