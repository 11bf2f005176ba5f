"""The served pages over HTTP, without a browser: what every page links loads under the
prefix the hub serves the dashboards at."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest

from dashboards.app import Settings, serve
from dashboards.auth import TokenArgIdentity
from tests.dashboards.conftest import Portal
from tests.dashboards.seed import NOW, VIEWERS
from tests.support.ports import free_port

PREFIX = "/services/dashboards"


@pytest.fixture
def served(portal: Portal) -> Iterator[str]:
    port = free_port()
    settings = Settings(portal.url, TokenArgIdentity(VIEWERS), clock=lambda: NOW.timestamp())
    server: Any = serve(settings, port=port, prefix=PREFIX, threaded=True)
    try:
        yield f"http://127.0.0.1:{port}{PREFIX}"
    finally:
        server.stop()


@pytest.mark.parametrize("path", ["/", "/cost"])
def test_the_icon_each_page_links_is_served_under_the_prefix(served: str, path: str) -> None:
    page_url = f"{served}{path}?token=tok-lead"
    page = httpx.get(page_url, timeout=60)
    assert page.status_code == 200
    (href,) = re.findall(r'<link rel="icon" href="([^"]+)"', page.text)
    icon = httpx.get(urljoin(page_url, href), timeout=10)
    assert icon.status_code == 200, urljoin(page_url, href)
    assert icon.content[:4] == b"\x00\x00\x01\x00"  # an .ico file
