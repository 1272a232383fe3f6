import asyncio
from urllib.parse import quote, urlencode

import pytest

from api.errors import ApiError
from api.metrics import Metrics
from api.reads import parse_metadata_filter
from shared.proxy import sandbox_target


def scope(headers: dict[str, str]) -> dict[str, object]:
    return {
        "type": "http",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


def test_sandbox_traffic_is_recognised_by_headers_first() -> None:
    s = scope({"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "49999", "Host": "127.0.0.1:3000"})
    assert sandbox_target(s, "aenv.dev") == ("abc", 49999)
    assert sandbox_target(scope({"E2b-Sandbox-Id": "abc"}), None) == ("abc", 49983)


def test_sandbox_traffic_by_host_name_needs_our_domain() -> None:
    assert sandbox_target(scope({"Host": "8080-abc123.aenv.dev"}), "aenv.dev") == ("abc123", 8080)
    assert sandbox_target(scope({"Host": "8080-abc123.other.dev"}), "aenv.dev") is None
    assert sandbox_target(scope({"Host": "8080-abc123.aenv.dev"}), None) is None
    assert sandbox_target(scope({"Host": "127.0.0.1:3000"}), "aenv.dev") is None


def test_metadata_filter_decodes_the_sdks_double_encoding() -> None:
    # what the SDK does: urlencode({quote(k): quote(v)}); the server's query decode undoes
    # the outer layer before we see it
    inner = urlencode({quote("a b"): quote("c&d=e"), "suite": "acc"})
    assert parse_metadata_filter(inner) == {"a b": "c&d=e", "suite": "acc"}
    assert parse_metadata_filter(None) == {}
    with pytest.raises(ApiError):
        parse_metadata_filter("novalue")


def test_metrics_histogram_is_cumulative() -> None:
    m = Metrics()
    m.observe("GET", "/x", 200, 0.004)
    m.observe("GET", "/x", 200, 0.2)
    text = asyncio.run(m.render()).decode()
    assert 'aenv_api_requests_total{method="GET",route="/x",status="200"} 2.0' in text
    assert 'aenv_api_request_seconds_bucket{le="0.005",route="/x"} 1.0' in text
    assert 'aenv_api_request_seconds_bucket{le="0.25",route="/x"} 2.0' in text
    assert 'aenv_api_request_seconds_count{route="/x"} 2.0' in text
