"""Signed file URLs, auto-resume and pause/resume by name over HTTPS, with real VMs and the
unchanged SDK configured only with `E2B_DOMAIN`, `E2B_API_KEY` and the CA bundle
(`tests.e2e.by_name`), as E2B's own SDK tests exercise them (python-sdk
`files/test_secured.py`, `test_snapshot.py`; js-sdk `files/signing.test.ts`).

`download_url`/`upload_url` give `https://49983-{id}.{domain}/files?path=…&username=…
&signature=…&signature_expiration=…`: envd checks the signature (`v1_` + unpadded base64 of
sha256 over `path:operation:username:accessToken[:expiration]`) when no `X-Access-Token`
comes, and refuses as E2B's envd does — 401 `{"code": 401, "message": …}` with "invalid
signature", "signature is already expired" or "missing signature query parameter". A paused
sandbox with `auto_resume` wakes on an HTTPS request to `get_host(port)`, answered by the
server in its guest; one without stays paused (E2B's 502) until it is resumed, its server
then answering again."""

from __future__ import annotations

import pytest

from tests.e2e.by_name import run_by_name
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

#: What the scripts share: requests that report [status, body (JSON when it is)], and a
#: server started in the guest, awaited until it answers through `get_host`.
COMMON = """
import json, time
import httpx
from e2b import Sandbox

def answer(r):
    try:
        return [r.status_code, r.json()]
    except ValueError:
        return [r.status_code, r.text]

def get(url, **kw):
    return answer(httpx.get(url, timeout=kw.pop("timeout", 30), **kw))

def post(url, name, data):
    return answer(httpx.post(url, files={"file": (name, data)}, timeout=30))

def serve(sbx, port):
    sbx.commands.run(
        f"mkdir -p /tmp/www && echo served by {sbx.sandbox_id} > /tmp/www/index.html && "
        f"cd /tmp/www && python3 -m http.server {port} >/dev/null 2>&1 &"
    )
    url = f"https://{sbx.get_host(port)}/index.html"
    deadline = time.monotonic() + 30
    while True:  # until the guest's server listens (it starts in the background)
        r = httpx.get(url, timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            return url, [r.status_code, r.text]
        time.sleep(0.5)

def state(sbx):
    return Sandbox.get_info(sbx.sandbox_id).state.value

out = {}
"""

SIGNED = (
    COMMON
    + """
sbx = Sandbox.create(timeout=300)  # secure=True: the SDK's default
out["id"] = sbx.sandbox_id
try:
    sbx.files.write("/home/user/mine.txt", "the user's")
    sbx.files.write("/root/roots.txt", "root's", user="root")
    out["url"] = sbx.download_url("mine.txt", user="root", use_signature_expiration=120)
    down = {}
    for user in (None, "user", "root"):
        for exp in (None, 120):
            path = "roots.txt" if user == "root" else "mine.txt"
            url = sbx.download_url(path, user=user, use_signature_expiration=exp)
            down[f"{user}-{exp}"] = get(url)
    out["down"] = down
    up = {}
    for user in (None, "user", "root"):
        for exp in (None, 120):
            name = f"up-{user}-{exp}.txt"
            url = sbx.upload_url(name, user=user, use_signature_expiration=exp)
            up[name] = post(url, name, f"sent as {user}".encode())
    out["up"] = up
    out["owners"] = sbx.commands.run(
        "stat -c '%n %U' /home/user/up-*.txt /root/up-*.txt", user="root"
    ).stdout.split("\\n")
    out["root_sent"] = sbx.files.read("/root/up-root-120.txt", user="root")

    # refusals, as E2B's envd words them
    ok = httpx.URL(sbx.download_url("mine.txt", use_signature_expiration=120))
    bad = {}
    bad["expired_down"] = get(sbx.download_url("mine.txt", use_signature_expiration=-120))
    bad["expired_up"] = post(
        sbx.upload_url("late.txt", user="root", use_signature_expiration=-120), "late.txt", b"x"
    )
    bad["read_signature_to_write"] = post(str(ok), "mine.txt", b"overwritten")
    bad["other_path"] = get(str(ok.copy_set_param("path", "/root/roots.txt")))
    bad["other_user"] = get(str(ok.copy_set_param("username", "root")))
    exp = int(ok.params["signature_expiration"])
    bad["longer_expiry"] = get(str(ok.copy_set_param("signature_expiration", str(exp + 3600))))
    bad["expired_and_wrong"] = get(
        str(ok.copy_set_param("signature_expiration", str(exp - 3600)))
    )
    bad["garbage"] = get(str(ok.copy_set_param("signature", "v1_" + "A" * 43)))
    unsigned = str(ok.copy_remove_param("signature"))
    bad["missing"] = get(unsigned)
    bad["empty_token_header"] = get(unsigned, headers={"X-Access-Token": ""})
    bad["unparsable_expiry"] = get(str(ok.copy_set_param("signature_expiration", "soon")))
    out["bad"] = bad
    out["still"] = sbx.files.read("/home/user/mine.txt")
    out["late_exists"] = sbx.files.exists("/root/late.txt", user="root")
finally:
    sbx.kill()
print(json.dumps(out))
"""
)

AUTO_RESUME = (
    COMMON
    + """
sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True})
out["id"] = sbx.sandbox_id
try:
    url, out["before"] = serve(sbx, 8000)
    sbx.pause()
    out["paused"] = state(sbx)
    # no connect, no SDK call: a plain HTTPS request to the guest port wakes it
    out["woken"] = get(url, timeout=120)
    out["after"] = state(sbx)
    out["again"] = get(url)
    out["envd"] = sbx.commands.run("echo still here").stdout
finally:
    sbx.kill()
print(json.dumps(out))
"""
)

PAUSE_RESUME = (
    COMMON
    + """
sbx = Sandbox.create(timeout=300)
out["id"] = sbx.sandbox_id
try:
    url, out["before"] = serve(sbx, 8000)
    sbx.pause()
    out["paused_running"] = sbx.is_running()
    out["while_paused"] = get(url)  # no auto-resume: E2B's 502, and it stays paused
    out["paused"] = state(sbx)
    back = Sandbox.connect(sbx.sandbox_id, timeout=300)
    out["resumed_running"] = back.is_running()
    out["after"] = get(url)
    back.pause()
    back = Sandbox.connect(sbx.sandbox_id, timeout=300)
    out["second"] = get(url)
finally:
    sbx.kill()
print(json.dumps(out))
"""
)

EXPIRED = {"code": 401, "message": "signature is already expired"}
INVALID = {"code": 401, "message": "invalid signature"}


@pytest.fixture(scope="module")
def signed(stack: Stack) -> dict[str, object]:
    """One sandbox's signed URLs, good and bad (one VM for both tests below)."""
    return run_by_name(stack, SIGNED)


def test_signed_urls_with_and_without_expiry_as_user_and_root(
    stack: Stack, signed: dict[str, object]
) -> None:
    domain = stack.tls_env["E2B_DOMAIN"]
    url = str(signed["url"])
    assert url.startswith(
        f"https://49983-{signed['id']}.{domain}/files?path=mine.txt&username=root&signature=v1_"
    )
    assert "&signature_expiration=" in url
    down = signed["down"]
    assert isinstance(down, dict) and len(down) == 6
    for key, (status, body) in down.items():
        assert status == 200, (key, body)
        assert body == ("root's" if key.startswith("root") else "the user's"), key
    up = signed["up"]
    assert isinstance(up, dict) and len(up) == 6
    for name, (status, body) in up.items():
        home = "/root" if name.startswith("up-root") else "/home/user"
        assert status == 200, (name, body)
        assert body == [{"path": f"{home}/{name}", "name": name, "type": "file"}]
    owners = signed["owners"]
    assert isinstance(owners, list)
    assert sorted(line for line in owners if line) == [
        "/home/user/up-None-120.txt user",
        "/home/user/up-None-None.txt user",
        "/home/user/up-user-120.txt user",
        "/home/user/up-user-None.txt user",
        "/root/up-root-120.txt root",
        "/root/up-root-None.txt root",
    ]
    assert signed["root_sent"] == "sent as root"


def test_expired_and_wrong_signatures_are_refused_as_e2b_refuses_them(
    signed: dict[str, object],
) -> None:
    bad = signed["bad"]
    assert isinstance(bad, dict)
    assert bad["expired_down"] == [401, EXPIRED]
    assert bad["expired_up"] == [401, EXPIRED]
    for key in (
        "read_signature_to_write",
        "other_path",
        "other_user",
        "longer_expiry",
        "expired_and_wrong",  # the signature is checked before its expiry
        "garbage",
    ):
        assert bad[key] == [401, INVALID], key
    missing = [401, {"code": 401, "message": "missing signature query parameter"}]
    assert bad["missing"] == missing
    assert bad["empty_token_header"] == missing  # an empty header is no header
    status, text = bad["unparsable_expiry"]
    assert status == 400
    assert text.startswith("Invalid format for parameter signature_expiration")
    assert signed["still"] == "the user's"  # the refused write wrote nothing
    assert signed["late_exists"] is False


def test_an_https_request_to_a_guest_port_wakes_a_paused_auto_resume_sandbox(
    stack: Stack,
) -> None:
    got = run_by_name(stack, AUTO_RESUME)
    served = [200, f"served by {got['id']}\n"]
    assert got["before"] == served
    assert got["paused"] == "paused"
    assert got["woken"] == served
    assert got["after"] == "running"
    assert got["again"] == served
    assert got["envd"] == "still here\n"


def test_pause_and_resume_with_a_guest_server_still_answering(stack: Stack) -> None:
    got = run_by_name(stack, PAUSE_RESUME)
    served = [200, f"served by {got['id']}\n"]
    assert got["before"] == served
    assert got["paused_running"] is False
    assert got["while_paused"] == [
        502,
        {"sandboxId": got["id"], "code": 502, "message": "The sandbox was not found"},
    ]
    assert got["paused"] == "paused"
    assert got["resumed_running"] is True
    assert got["after"] == served
    assert got["second"] == served
