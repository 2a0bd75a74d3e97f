"""Debian's headless Chromium for the page and session tests (never a downloaded browser), and
the platform's login form as a person fills it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def launched_chromium(*extra_args: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls in between are
    # plain synchronous calls all the same.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_ARGS, *extra_args]
            )
            try:
                yield browser
            finally:
                browser.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def log_in(page: Any, site: str, username: str, password: str, *, start: str = "/login/") -> None:
    """From ``start`` (a login page, or a page that sends there) to the Workers page."""
    page.goto(site + start)
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button:has-text('Log in')")
    page.wait_for_url(site + "/workers/")


def logged_in_page(browser: Any, site: str, username: str, password: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    log_in(page, site, username, password)
    return page
