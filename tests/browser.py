"""Playwright driving Debian's Chromium (headless) for the console's browser tests — the
vmless tier's and the e2e tier's. `playwright install` would download a browser build of
its own (the internet); `scripts/setup.sh` installs Debian's instead and this points
Playwright at it. Screenshots go under the pytest basetemp (never committed), at the
1280x800 the issue asks the pages to look right at."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Browser) -> Page:
    """A tab of its own (its own session storage: a key entered in one is not in another).
    Script errors and refusals of the page's Content-Security-Policy are collected in
    `page_errors(page)`; a 4xx the page asked for (and shows) is not one."""
    page = browser.new_context(viewport=VIEWPORT).new_page()  # type: ignore[arg-type]
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"script error: {e}"))
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and not m.text.startswith(_SHOWN) else None
        ),
    )
    page.on(
        "response",
        lambda r: errors.append(f"(answered {r.status}: {r.url})") if r.status >= 400 else None,
    )
    _ERRORS[id(page)] = errors
    return page


_ERRORS: dict[int, list[str]] = {}
#: What Chromium and htmx log for an answer >= 400: the page shows those (a wrong key,
#: another team's sandbox), they are the page working.
_SHOWN = ("Failed to load resource", "Response Status Error Code")


def page_errors(page: Page) -> list[str]:
    """What went wrong in the page; the answers >= 400 it had are kept alongside (in
    parentheses) to tell an error's cause, but are no error themselves."""
    found = _ERRORS.get(id(page), [])
    return found if any(not e.startswith("(answered") for e in found) else []


class Shots:
    """Numbered full-page screenshots of a run, in one directory of the basetemp."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0

    def __call__(self, page: Page, name: str) -> Path:
        self.n += 1
        path = self.root / f"{self.n:02d}-{re.sub(r'[^a-z0-9-]+', '-', name)}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Shots:
    return Shots(tmp_path_factory.mktemp("console-shots", numbered=True))


def sign_in(page: Page, api_url: str, key: str) -> None:
    """Open the console and enter `key` in its form, as a person would; returns once the
    console took it (the team shows) or refused it (the form says why): a page opened
    before that would find no key in the tab."""
    page.goto(api_url + "/console")
    submit(page, key)


def submit(page: Page, key: str) -> None:
    page.fill("#key", key)
    page.click("#login-form button[type=submit]")
    # a locator, not a script: the page's CSP forbids the eval a predicate string needs
    page.locator("#who:not([hidden]), #login-error:not(:empty)").first.wait_for()
