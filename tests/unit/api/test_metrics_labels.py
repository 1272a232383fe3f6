"""The exposition stays parseable and bounded whatever a request brings (issue 16 #8)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from api.metrics import SANDBOX_PROXY, UNMATCHED, Metrics, escape_label, method_label, route_label
from api.scrape import bearer


def families(text: str) -> dict[str, list[dict[str, str]]]:
    """Samples' label sets per family; the parser raises on any malformed line."""
    parsed = text_string_to_metric_families(text)
    return {f.name: [dict(s.labels) for s in f.samples] for f in parsed}


def test_label_values_cannot_end_the_value_or_the_line() -> None:
    forged = '/x"} 1\nforged_total{a="b\\'
    m = Metrics()
    m.observe("GET", forged, 200, 0.01)
    parsed = families(m.render())
    assert set(parsed) == {"aenv_api_requests", "aenv_api_request_seconds"}
    assert {s["route"] for s in parsed["aenv_api_requests"]} == {forged}
    assert {s["route"] for s in parsed["aenv_api_request_seconds"]} == {forged}


def test_escape_follows_the_exposition_format() -> None:
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_route_is_the_template_or_one_shared_value() -> None:
    assert route_label("/sandboxes/{sandbox_id}", proxied=False) == "/sandboxes/{sandbox_id}"
    assert route_label(None, proxied=False) == UNMATCHED
    assert route_label(None, proxied=True) == SANDBOX_PROXY


def test_unknown_methods_share_one_value() -> None:
    assert method_label("GET") == "GET"
    assert method_label("X" * 40) == method_label("get") == "OTHER"


def test_bearer_credentials() -> None:
    assert bearer("Bearer abc") == bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None
    assert bearer("Bearer ") is None
    assert bearer(None) is None
