"""`/metrics` of the real API (issue 16 #8): only for a caller with an API key or the
metrics token, a bounded set of series whatever paths clients request, and an exposition
no request can add lines to."""

from __future__ import annotations

import secrets

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.vmless.conftest import METRICS_TOKEN, VmlessStack


def _scrape(stack: VmlessStack) -> str:
    r = httpx.get(f"{stack.api_url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert r.status_code == 200, r.text
    return r.text


def _series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample's (name, labels); the parser raises on any malformed line."""
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_need_an_api_key_or_the_metrics_token(vmless: VmlessStack) -> None:
    url = f"{vmless.api_url}/metrics"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"X-API-KEY": "wrong"},
        {"Authorization": f"Basic {METRICS_TOKEN}"},
    ):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401, (headers, r.status_code, r.text)
        body = r.json()
        assert body["code"] == 401 and body["message"], body
    for headers in (
        {"Authorization": f"Bearer {METRICS_TOKEN}"},
        {"X-API-KEY": vmless.api_key},
        {"Authorization": f"Bearer {vmless.api_key}"},
    ):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 200, (headers, r.text)
        assert "aenv_api_requests_total" in r.text


def test_random_paths_add_a_bounded_number_of_series(vmless: VmlessStack) -> None:
    with httpx.Client(base_url=vmless.api_url, headers={"X-API-KEY": vmless.api_key}) as c:
        c.get("/nothing-here")  # the shared "unmatched" series exist before we count
        c.get(f"/sandboxes/{secrets.token_hex(8)}")
        c.get("/", headers={"E2b-Sandbox-Id": secrets.token_hex(8)})
        before = _series(_scrape(vmless))
        for _ in range(334):  # 1,002 requests
            c.get(f"/{secrets.token_hex(8)}/{secrets.token_hex(4)}")
            c.get(f"/sandboxes/{secrets.token_hex(8)}")  # a route with an id in it
            # sandbox traffic (to no sandbox: E2B's 502), each to a path of its own
            c.get(f"/{secrets.token_hex(8)}", headers={"E2b-Sandbox-Id": secrets.token_hex(8)})
    after = _series(_scrape(vmless))
    # 1,002 requests, none to a new route or status: no new series at all
    assert after - before == set(), sorted(after - before)[:10]
    routes = {dict(labels).get("route") for _, labels in after}
    assert {"unmatched", "/sandboxes/{sandbox_id}", "sandbox-proxy"} <= routes


def test_a_path_cannot_forge_metric_lines(vmless: VmlessStack) -> None:
    forged = '/x"} 1\nforged_total{route="y'
    raw = forged.replace('"', "%22").replace("\n", "%0A").replace("{", "%7B").replace("}", "%7D")
    r = httpx.get(f"{vmless.api_url}{raw.replace(' ', '%20')}")
    assert r.status_code in (401, 404)
    families = {f.name for f in text_string_to_metric_families(_scrape(vmless))}
    assert {f for f in families if not f.startswith("aenv_")} == set(), families
