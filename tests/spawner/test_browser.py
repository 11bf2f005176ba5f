"""In Debian's Chromium (Playwright, no browser download): log in to the demo, see the GPU
options with their availability, spawn one, and reach JupyterLab. Screenshots go to the test's
tmp dir and are copied to docs/images/."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.portal.test_demo import PASSWORD, Demo, _start_demo
from tests.support.browser import chromium

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.slow]

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
LAB_TIMEOUT_MS = 180_000


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = _start_demo(tmp_path / "state")
    try:
        yield running
    finally:
        running.stop()
        running.kill_leftovers()


def shoot(page: Page, tmp_path: Path, name: str) -> None:
    """Screenshot into the test's tmp dir, then into docs/images/."""
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, DOCS_IMAGES / shot.name)


def test_a_user_sees_gpu_options_spawns_one_and_reaches_jupyterlab(
    browser: Browser, demo: Demo, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{demo.url}/hub/login")
    page.fill("#username_input", "bob")
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.goto(f"{demo.url}/hub/spawn/bob")

    # team-b may hold one whole GPU per model: one is available, more are not allowed.
    one = page.locator(".gpuportal-offer", has_text="1 × H100-80GB")
    expect(one).to_contain_text("available now")
    four = page.locator(".gpuportal-offer", has_text="4 × H100-80GB NVLink")
    expect(four).to_contain_text("not allowed 4 × H100-80GB NVLink needs 4 gpus")
    expect(four.locator("input")).to_be_disabled()
    mig = page.locator(".gpuportal-offer", has_text="MIG 3g.40gb on A100-80GB")
    expect(mig).to_contain_text("available now")
    shoot(page, tmp_path, "spawn-options")

    page.check("input[value='gpu:H100-80GB:1']")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(r".*/user/bob/lab.*"), timeout=LAB_TIMEOUT_MS)
    expect(page.locator(".jp-LauncherCard").first).to_be_visible(timeout=LAB_TIMEOUT_MS)
    shoot(page, tmp_path, "jupyterlab")
    assert (tmp_path / "spawn-options.png").stat().st_size > 10_000
