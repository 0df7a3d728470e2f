"""Headless Chromium for the tests of the page (test_page.py, and the Ray ingress's engine view in
test_ray_cluster.py): Debian's `chromium` where installed (.ci/run installs it), else the browser
Playwright brings. One browser per module, closed when the module ends (the sync API holds an event
loop of its own, which no later module should share)."""
from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import sync_playwright


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        yield browser
        browser.close()
