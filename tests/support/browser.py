"""Debian's Chromium driven by Playwright (``executable_path``: Playwright downloads nothing)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, sync_playwright

# No sandbox (tests run as root in CI), software rendering, and no calls out of the machine.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed on exit."""
    path = shutil.which("chromium")
    assert path, "Debian's chromium package is required for the browser tests"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
