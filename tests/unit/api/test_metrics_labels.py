"""The exposition stays parseable and bounded whatever a request brings (issue 16 #8)."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import LIVE_STATES, SANDBOX_PROXY, UNMATCHED, Metrics, method_label, route_label
from api.scrape import bearer
from shared.metrics import Scrape, is_token


def families(text: str) -> dict[str, list[dict[str, str]]]:
    """Samples' label sets per family; the parser raises on any malformed line."""
    parsed = text_string_to_metric_families(text)
    return {f.name: [dict(s.labels) for s in f.samples] for f in parsed}


def render(m: Metrics) -> str:
    return asyncio.run(m.render()).decode()


def test_label_values_cannot_end_the_value_or_the_line() -> None:
    forged = '/x"} 1\nforged_total{a="b\\'
    m = Metrics()
    m.observe("GET", forged, 200, 0.01)
    text = render(m)
    parsed = families(text)
    assert set(parsed) == {
        "aenv_api_requests",
        "aenv_api_request_seconds",
        "aenv_sandboxes",
        "aenv_projection_lag_events",
        "aenv_node_heartbeat_age_seconds",
        "aenv_node_uploads_waiting",
        "aenv_node_oldest_upload_wait_seconds",
        "aenv_scrape_errors",
        "aenv_task_restarts",
        "aenv_admission_refusals",
        "aenv_lease_expiries",
    }
    requests = [s for s in parsed["aenv_api_requests"] if "route" in s]
    assert {s["route"] for s in requests} == {forged}
    assert {s["route"] for s in parsed["aenv_api_request_seconds"]} == {forged}
    assert not any(line.startswith("forged") for line in text.splitlines())


def test_sandboxes_by_state_and_node_come_from_the_census_at_each_scrape() -> None:
    rows = [("running", "n1", 3), ("paused", "n1", 1), ("creating", "", 1)]

    async def census() -> list[tuple[str, str, int]]:
        return list(rows)

    m = Metrics()
    m.count_sandboxes(census)
    got = {(s["state"], s["node"]): v for s, v in _samples(render(m), "aenv_sandboxes")}
    assert got[("running", "n1")] == 3 and got[("paused", "n1")] == 1
    assert got[("creating", "")] == 1 and got[("forking", "n1")] == 0
    assert {state for state, _ in got} == set(LIVE_STATES)
    rows[:] = [("running", "n2", 2)]  # n1 emptied: its series go, not stay at 3
    got = {(s["state"], s["node"]): v for s, v in _samples(render(m), "aenv_sandboxes")}
    assert {node for _, node in got} == {"n2"} and got[("running", "n2")] == 2


def test_a_beating_node_without_sandboxes_reads_zero() -> None:
    async def census() -> list[tuple[str, str, int]]:
        return []

    m = Metrics()
    m.count_sandboxes(census, lambda: ["idle"])
    got = {(s["state"], s["node"]): v for s, v in _samples(render(m), "aenv_sandboxes")}
    assert got == {(state, "idle"): 0 for state in LIVE_STATES}


def test_a_failing_refresh_is_counted_and_the_rest_still_answers() -> None:
    async def broken() -> list[tuple[str, str, int]]:
        raise ConnectionError("postgres is down")

    m = Metrics()
    m.count_sandboxes(broken)
    m.observe("GET", "/health", 200, 0.001)
    text = render(m)
    errors = {s["source"]: v for s, v in _samples(text, "aenv_scrape_errors")}
    assert errors == {"sandboxes": 1}
    assert any(s.get("route") == "/health" for s, _ in _samples(text, "aenv_api_requests"))


def _samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
    ]


def test_route_is_the_template_or_one_shared_value() -> None:
    assert route_label("/sandboxes/{sandbox_id}", proxied=False) == "/sandboxes/{sandbox_id}"
    assert route_label(None, proxied=False) == UNMATCHED
    assert route_label(None, proxied=True) == SANDBOX_PROXY


def test_unknown_methods_share_one_value() -> None:
    assert method_label("GET") == "GET"
    assert method_label("X" * 40) == method_label("get") == "OTHER"


def test_the_metrics_token_is_compared_whole() -> None:
    assert is_token("s3cret", "s3cret")
    assert not is_token("s3cre", "s3cret") and not is_token("s3cret", None)
    assert not is_token(None, "s3cret") and not is_token("", "")


def test_a_scrape_has_its_own_registry() -> None:
    a, b = Metrics(Scrape()), Metrics(Scrape())
    a.observe("GET", "/health", 200, 0.001)
    assert "/health" in render(a) and "/health" not in render(b)


def test_bearer_credentials() -> None:
    assert bearer("Bearer abc") == bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None
    assert bearer("Bearer ") is None
    assert bearer(None) is None


def test_lease_expiries_count_by_what_the_expiry_does() -> None:
    from datetime import UTC, datetime

    from domain import lease as ls

    m = Metrics()
    now = datetime.now(UTC)
    lease = ls.Lease(
        lease_id="l1", team_id="t", ttl_s=10, on_expiry="pause", opened_at=now, expires_at=now
    )
    m.lease_expired(lease)
    samples = {
        s.labels["on_expiry"]: s.value
        for f in text_string_to_metric_families(render(m))
        if f.name == "aenv_lease_expiries"
        for s in f.samples
        if s.name == "aenv_lease_expiries_total"
    }
    assert samples == {"kill": 0.0, "pause": 1.0}  # both scraped from the start
