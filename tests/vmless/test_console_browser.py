"""The console in a browser (Playwright, Debian's Chromium, headless) on the real stack
(VM-less): a wrong key sees nothing; with the key, a sandbox the SDK creates appears in the
live list; its page shows its timeline; Pause and Resume on the page are what the SDK then
sees; Snapshot takes one the REST API lists; Fork draws the tree; Kill asks first; another
team's key gets "not found"; a build's log streams. No script error, nothing the pages'
Content-Security-Policy refuses. Screenshots of each page under the basetemp
(`console-shots*`). The live terminal needs a VM: `tests/e2e/test_console.py`."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import httpx
import pytest
from e2b import BuildException, NotFoundException, Sandbox, Template
from playwright.sync_api import Browser, Page, expect

from tests.browser import Shots, chromium, new_page, page_errors, shots, sign_in
from tests.support import eventually_sync
from tests.vmless.conftest import VmlessStack

__all__ = ["chromium", "shots"]  # fixtures

TIMEOUT_MS = 20_000


pytestmark = pytest.mark.usefixtures("sdk_env")


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    p = new_page(chromium)
    p.set_default_timeout(TIMEOUT_MS)
    yield p
    p.context.close()
    assert page_errors(p) == []  # no script error, nothing the page's CSP refused


def _state(sid: str) -> str | None:
    """What the SDK says of a sandbox: running, paused, or None once it is gone."""
    try:
        return Sandbox.get_info(sid).state.value
    except NotFoundException:
        return None


def test_a_wrong_key_sees_nothing(vmless: VmlessStack, page: Page, shots: Shots) -> None:
    page.goto(vmless.api_url + "/console")
    expect(page.locator("#login")).to_be_visible()
    shots(page, "sign-in")
    sign_in(page, vmless.api_url, "e2b_" + "0" * 40)
    expect(page.locator("#login-error")).to_have_text("invalid API key")
    expect(page.locator("#main")).to_be_hidden()
    assert page.locator("#nodes").count() == 0
    assert page.evaluate("sessionStorage.getItem('aenv.apiKey')") is None
    shots(page, "wrong-key")


def test_the_sandbox_lifecycle_from_the_page(vmless: VmlessStack, page: Page, shots: Shots) -> None:
    run = secrets.token_hex(3)
    sign_in(page, vmless.api_url, vmless.api_key)
    expect(page.locator("#nodes tr[data-node='vmless']")).to_contain_text("beating")
    expect(page.locator("#who-team")).to_have_text("default")
    page.goto(f"{vmless.api_url}/console/sandboxes?metadata=run%3D{run}")  # still signed in
    expect(page.locator("#count")).to_contain_text("0 sandboxes")
    sbx = Sandbox.create(timeout=300, metadata={"run": run, "agent": "browser-test"})
    sid = sbx.sandbox_id
    kids: list[str] = []
    try:
        row = page.locator(f"tr[data-sid='{sid}']")
        expect(row).to_be_visible()  # the list is live: it appeared by itself
        expect(row).to_contain_text("running")
        expect(row).to_contain_text("agent=browser-test")
        shots(page, "sandboxes")
        page.select_option("#filters select[name=status]", "paused")  # filters apply at once
        expect(page.locator("#count")).to_contain_text("0 sandboxes")
        assert "status=paused" in page.url  # and stay in the address, for a link or reload
        page.select_option("#filters select[name=status]", "live")
        expect(row).to_be_visible()
        page.click(f"a[href='/console/sandboxes/{sid}']")
        expect(page.locator("#sandbox .head")).to_have_attribute("data-status", "running")
        expect(page.locator("#timeline tr[data-type='SandboxCreated']")).to_be_visible()
        expect(page.locator("#ttl .ttl")).to_contain_text("left")
        shots(page, "sandbox")

        page.click("#actions [data-act=pause]")
        eventually_sync(lambda: _state(sid) == "paused", timeout=30)  # the SDK sees it
        expect(page.locator("#sandbox .head")).to_have_attribute("data-status", "paused")
        expect(page.locator("#timeline tr[data-type='SandboxPaused']")).to_be_visible()
        expect(page.locator("#actions [data-act=pause]")).to_be_disabled()
        shots(page, "paused")
        page.click("#actions [data-act=resume]")
        eventually_sync(lambda: _state(sid) == "running", timeout=30)
        expect(page.locator("#timeline tr[data-type='SandboxResumed']")).to_be_visible()
        # every event's actor is the key the page signed in with: the SDK's, the page's
        actors = set(page.locator("#timeline td.nw.small").all_inner_texts())
        assert len(actors) == 1 and actors.pop().startswith("key "), actors

        snap = f"console-snap-{run}"
        page.fill("#snapshot-name", snap)
        page.click("#actions [data-act=snapshot]")
        expect(page.locator("#flash")).to_contain_text(f"Snapshot {snap} taken")
        expect(page.locator("#timeline tr[data-type='SnapshotTaken']")).to_be_visible()
        listed = httpx.get(
            f"{vmless.api_url}/snapshots",
            params={"sandboxID": sid},
            headers={"X-API-KEY": vmless.api_key},
        ).json()
        assert [s["snapshotID"] for s in listed] == [snap]  # what the REST API lists

        page.fill("#fork-count", "2")
        page.click("#actions [data-act=fork]")
        expect(page.locator("#flash")).to_contain_text("Forked:")
        kids = re.findall(r"/console/sandboxes/(\w+)", page.inner_html("#flash"))
        assert len(kids) == 2
        tree = page.locator("#fork-tree")
        expect(tree.locator("a.node")).to_have_count(3)
        expect(tree.locator(f"a.node.current[data-sid='{sid}']")).to_be_visible()
        assert {Sandbox.get_info(k).state.value for k in kids} == {"running"}
        shots(page, "fork-tree")

        page.click(f"#fork-tree a.node[data-sid='{kids[0]}']")  # a child's page, same tree
        expect(page.locator("#sandbox .head")).to_have_attribute("data-status", "running")
        expect(page.locator("#fork-tree a.node")).to_have_count(3)
        page.once("dialog", lambda d: d.accept())
        page.click("#actions [data-act=kill]")
        expect(page.locator("#sandbox .head")).to_have_attribute("data-status", "killed")
        eventually_sync(lambda: _state(kids[0]) is None, timeout=30)  # the SDK: gone
        expect(page.locator(f"#fork-tree a.node[data-sid='{kids[0]}']")).to_have_attribute(
            "data-status", "killed"
        )
        shots(page, "killed-child")
        page.once("dialog", lambda d: d.dismiss())  # Kill asks first: no means no
        page.goto(f"{vmless.api_url}/console/sandboxes/{sid}")
        page.click("#actions [data-act=kill]")
        page.wait_for_timeout(500)
        assert _state(sid) == "running"
    finally:
        for s in [sid, *kids]:
            Sandbox.kill(s)


def test_another_team_sees_not_found(vmless: VmlessStack, page: Page, shots: Shots) -> None:
    out = vmless.aenv("keys", "create", "--team", "rival-b", "--data-dir", str(vmless.data_dir))
    assert out.returncode == 0, out.stderr
    sbx = Sandbox.create(timeout=120)
    try:
        sign_in(page, vmless.api_url, out.stdout.strip())
        expect(page.locator("#who-team")).to_have_text("rival-b")
        page.goto(f"{vmless.api_url}/console/sandboxes/{sbx.sandbox_id}")
        expect(page.locator("#sandbox .error-box")).to_have_text(
            f'sandbox "{sbx.sandbox_id}" not found'
        )
        assert page.locator("#timeline").count() == 0
        shots(page, "other-team")
        page.goto(f"{vmless.api_url}/console/sandboxes?status=all")
        expect(page.locator("#count")).to_have_text("0 sandboxes")
    finally:
        sbx.kill()


def test_templates_and_a_builds_log(vmless: VmlessStack, page: Page, shots: Shots) -> None:
    name = f"browser-{secrets.token_hex(3)}"
    with pytest.raises(BuildException):  # its step needs a VM; the FROM step logs first
        Template.build(Template().from_image("busybox:latest").run_cmd("echo hi"), name)
    sign_in(page, vmless.api_url, vmless.api_key)
    expect(page.locator("#nodes")).to_be_visible()
    page.goto(vmless.api_url + "/console/templates")
    link = page.locator("#builds tr", has_text=name).locator("a").first
    expect(link).to_be_visible()
    shots(page, "templates")
    link.click()
    expect(page.locator("#build-log")).to_contain_text("RUN echo hi")
    expect(page.locator("#build-log .end.bad")).to_contain_text("build error")
    expect(page.locator("#build .head")).to_have_attribute("data-status", "error")
    shots(page, "build")
    page.goto(vmless.api_url + "/console")
    expect(page.locator("#builds")).to_contain_text(name)
    shots(page, "fleet")
