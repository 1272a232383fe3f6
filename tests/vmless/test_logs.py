"""Every line of a stack's log parses as JSON (issue 20): the supervisor's, both roles',
their progress lines, their libraries' (alembic, uvicorn, Litestar), after a whole
lifecycle and after requests that fail."""

from __future__ import annotations

import json

import httpx

from tests.vmless.conftest import VmlessStack


def test_every_line_of_the_stack_log_is_a_json_record(vmless: VmlessStack) -> None:
    with httpx.Client(
        base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}, timeout=30
    ) as c:
        sid = c.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        assert c.post(f"/sandboxes/{sid}/pause").status_code == 204
        assert c.post(f"/sandboxes/{sid}/resume", json={}).status_code == 201
        assert c.delete(f"/sandboxes/{sid}").status_code == 204
        c.post("/sandboxes", content=b'{"templateID": "no\nsuch"')  # bad JSON: a 400
        c.get("/sandboxes/%22%7D%0A%7B%22forged%22: true%7D")
    files = sorted(vmless.data_dir.glob("aenv.log*"))
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert len(lines) > 10
    records = []
    for n, line in enumerate(lines):
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise AssertionError(f"line {n} of the stack's log is not JSON: {line!r}") from e
        assert isinstance(doc, dict) and {"ts", "level", "logger", "msg", "service"} <= set(doc)
        records.append(doc)
    services = {r["service"] for r in records}
    assert {"aenv", "aenv-api", "aenv-node"} <= services, services
    progress = [r["msg"] for r in records if r["logger"] == "aenv.progress"]
    assert any(str(m).startswith("AENV-READY") for m in progress)
    assert not any(str(m) == "ROLE-READY" for m in progress)  # the supervisor's, not the log's
