"""The web console in a browser (Playwright, Debian's Chromium, headless) against a real
stack with microVMs — the issue's acceptance run, on the shared e2e stack and two VMs:
a wrong key sees nothing; with the key, a sandbox the SDK creates appears; its page shows
its timeline; Pause and Resume from the page are what the SDK then sees; Fork draws the
tree; the terminal runs `echo hi` in the guest and shows `hi`, and follows a resize; a key
of another team gets "not found" from the console as from the REST API. Screenshots of each
page under the basetemp (`console-shots*`), at 1280x800."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Iterator

import httpx
import pytest
from e2b import NotFoundException, Sandbox
from playwright.sync_api import Browser, Page, expect

from tests.browser import Shots, chromium, new_page, page_errors, shots, sign_in, submit
from tests.e2e.conftest import AENV, Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

__all__ = ["chromium", "shots"]  # fixtures

#: a VM's pause, resume or fork under TCG on a shared host: seconds, sometimes tens
TIMEOUT_MS = 90_000


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    p = new_page(chromium)
    p.set_default_timeout(TIMEOUT_MS)
    yield p
    p.context.close()
    assert page_errors(p) == []  # no script error, nothing the page's CSP refused


def _state(sid: str) -> str | None:
    try:
        return Sandbox.get_info(sid).state.value
    except NotFoundException:
        return None


def _screen(page: Page) -> list[str]:
    """The terminal's lines as xterm holds them (what a person reads on it)."""
    return page.evaluate("""() => {
        const b = window.aenvTerm.buffer.active, out = [];
        for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
        return out;
    }""")


def test_the_console_drives_a_real_sandbox(stack: Stack, page: Page, shots: Shots) -> None:
    sign_in(page, stack.api_url, "e2b_" + "f" * 40)
    expect(page.locator("#login-error")).to_have_text("invalid API key")
    expect(page.locator("#main")).to_be_hidden()
    shots(page, "e2e-wrong-key")

    run = secrets.token_hex(3)
    submit(page, stack.api_key)
    expect(page.locator("#nodes tr[data-node='e2e']")).to_contain_text("beating")
    shots(page, "e2e-fleet")
    page.goto(f"{stack.api_url}/console/sandboxes?metadata=run%3D{run}")
    expect(page.locator("#count")).to_contain_text("0 sandboxes")
    sbx = Sandbox.create(timeout=600, metadata={"run": run})
    sid = sbx.sandbox_id
    kids: list[str] = []
    try:
        expect(page.locator(f"tr[data-sid='{sid}']")).to_contain_text("running")
        shots(page, "e2e-sandboxes")
        page.click(f"a[href='/console/sandboxes/{sid}']")
        expect(page.locator("#timeline tr[data-type='SandboxCreated']")).to_be_visible()
        shots(page, "e2e-sandbox")

        page.click("#actions [data-act=pause]")
        eventually_sync(lambda: _state(sid) == "paused", timeout=90)
        expect(page.locator("#timeline tr[data-type='SandboxPaused']")).to_be_visible()
        page.click("#actions [data-act=resume]")
        eventually_sync(lambda: _state(sid) == "running", timeout=90)
        expect(page.locator("#timeline tr[data-type='SandboxResumed']")).to_be_visible()
        assert sbx.commands.run("echo back").stdout == "back\n"  # the SDK uses it again

        page.click("#actions [data-act=fork]")
        expect(page.locator("#flash")).to_contain_text("Forked:")
        kids = re.findall(r"/console/sandboxes/(\w+)", page.inner_html("#flash"))
        expect(page.locator("#fork-tree a.node")).to_have_count(2)
        assert _state(kids[0]) == "running"
        shots(page, "e2e-fork-tree")

        page.click("#open-terminal")
        expect(page.locator("#term-state")).to_have_text("connected")
        page.click("#terminal")
        page.keyboard.type("echo hi")
        page.keyboard.press("Enter")
        eventually_sync(lambda: "hi" in _screen(page), timeout=60)
        shots(page, "e2e-terminal")
        wide = page.evaluate("window.aenvTerm.cols")
        page.set_viewport_size({"width": 900, "height": 600})  # xterm refits: a resize
        cols = eventually_sync(lambda: (c := page.evaluate("window.aenvTerm.cols")) < wide and c)
        rows = page.evaluate("window.aenvTerm.rows")
        page.keyboard.type("stty size")
        page.keyboard.press("Enter")
        eventually_sync(lambda: f"{rows} {cols}" in _screen(page), timeout=60)

        out = subprocess.run(
            [*AENV, "keys", "create", "--team", "console-rival", "--data-dir", str(stack.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        rival = new_page(page.context.browser)  # type: ignore[arg-type]
        rival.set_default_timeout(TIMEOUT_MS)
        sign_in(rival, stack.api_url, out.stdout.strip())
        rival.goto(f"{stack.api_url}/console/sandboxes/{sid}")
        expect(rival.locator("#sandbox .error-box")).to_have_text(f'sandbox "{sid}" not found')
        shots(rival, "e2e-other-team")
        rival.context.close()
        with httpx.Client(
            base_url=stack.api_url, timeout=30, headers={"X-API-KEY": out.stdout.strip()}
        ) as c:
            assert c.post(f"/sandboxes/{sid}/pause", json={}).status_code == 404
        assert _state(sid) == "running"
    finally:
        for s in [sid, *kids]:
            Sandbox.kill(s)
