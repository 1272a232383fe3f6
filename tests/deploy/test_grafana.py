"""Static checks of deploy/grafana/ (issue 20): the dashboard passes a JSON Schema of
Grafana's dashboard model and a layout check, every query in it names only series the
metrics tests found in real scrapes (`tests/series.py`) and the dashboard shows each of
them; the Prometheus scrape config scrapes both roles with the metrics token; the
documentation names exactly those series. Every check is shown to reject a broken copy."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from tests.deploy import deploy_files as df
from tests.deploy.promql import fleet_sum_errors
from tests.deploy.settings_names import ROOT
from tests.series import FAMILIES, FLEET_WIDE, samples

GRAFANA = df.DEPLOY / "grafana"
DASHBOARD = GRAFANA / "aenv-dashboard.json"
PROMETHEUS = GRAFANA / "prometheus.yml"
SCHEMA = Path(__file__).parent / "schemas" / "grafana-dashboard.schema.json"
DOC = ROOT / "docs" / "observability.md"

_SERIES = re.compile(r"\baenv_[a-z0-9_]+\b")
#: PromQL functions and aggregations the dashboard may use
_FUNCTIONS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "increase",
    "irate",
    "histogram_quantile",
    "by",
    "without",
}
_CALL = re.compile(r"\b([a-z_]+)\s*\(")


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]


def schema_errors(dash: dict[str, Any]) -> list[str]:
    validator = Draft202012Validator(json.loads(SCHEMA.read_text()))
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(dash)
    ]


def layout_errors(dash: dict[str, Any]) -> list[str]:
    """Unique panel ids, panels inside the 24-column grid and not over each other, one
    refId per query of a panel."""
    errors: list[str] = []
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    if len(ids) != len(set(ids)):
        errors.append("panel ids repeat")
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            errors.append(f"panel {p['id']} runs past the grid's 24 columns")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (other := cells.setdefault((x, y), p["id"])) != p["id"]:
                    errors.append(f"panels {other} and {p['id']} overlap")
                    break
        refs = [t["refId"] for t in p.get("targets", [])]
        if len(refs) != len(set(refs)):
            errors.append(f"panel {p['id']} repeats a refId")
    return sorted(set(errors))


def query_errors(dash: dict[str, Any]) -> list[str]:
    """Each query: balanced, using known functions, naming only series the tests found;
    a quantile over a histogram's buckets grouped by `le`."""
    known = samples(FAMILIES)
    errors = []
    for expr in _exprs(dash):
        for opening, closing in ("()", "[]", "{}"):
            if expr.count(opening) != expr.count(closing):
                errors.append(f"{expr!r}: unbalanced {opening}{closing}")
        if expr.count('"') % 2:
            errors.append(f"{expr!r}: unbalanced quotes")
        for fn in set(_CALL.findall(expr)) - _FUNCTIONS:
            errors.append(f"{expr!r}: unknown function {fn}")
        names = _SERIES.findall(expr)
        if not names:
            errors.append(f"{expr!r}: names no aenv series")
        for name in names:
            if name not in known:
                errors.append(f"{expr!r}: {name} is no series the metrics tests found")
        if "histogram_quantile" in expr and not (
            re.search(r"by \([^)]*\ble\b", expr) and "_bucket" in expr
        ):
            errors.append(f"{expr!r}: a quantile needs the buckets grouped by le")
    return errors


def test_dashboard_passes_the_schema_and_the_layout_check() -> None:
    Draft202012Validator.check_schema(json.loads(SCHEMA.read_text()))
    dash = _dashboard()
    assert schema_errors(dash) == []
    assert layout_errors(dash) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = d
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return mutate


@pytest.mark.parametrize(
    "mutate",
    [
        _set("uid", "short"),  # uid of 8-40 characters
        _set("panels/1/gridPos/w", 25),  # wider than the grid
        _set("panels/1/targets/0/exprr", "up"),  # a misspelt key Grafana would drop
        _set("panels/1/datasource", {"type": "loki", "uid": "x"}),
        lambda d: d["panels"][1]["targets"][0].pop("expr"),  # a query without its query
        lambda d: d["panels"][1].pop("targets"),  # a graph without queries
    ],
)
def test_the_schema_rejects_a_broken_copy(mutate: Callable[[dict[str, Any]], None]) -> None:
    dash = copy.deepcopy(_dashboard())
    mutate(dash)
    assert schema_errors(dash)


def test_the_layout_check_rejects_overlap_and_repeats() -> None:
    dash = copy.deepcopy(_dashboard())
    dash["panels"][2]["gridPos"] = dict(dash["panels"][1]["gridPos"])
    dash["panels"][3]["id"] = dash["panels"][4]["id"]
    errors = layout_errors(dash)
    assert any("overlap" in e for e in errors) and "panel ids repeat" in errors


def test_every_query_names_a_series_the_tests_found_and_shows_each() -> None:
    dash = _dashboard()
    assert query_errors(dash) == []
    shown = {name for expr in _exprs(dash) for name in _SERIES.findall(expr)}
    families = {next(f for f in FAMILIES if name in samples({f: FAMILIES[f]})) for name in shown}
    assert families == set(FAMILIES), f"not on the dashboard: {set(FAMILIES) - families}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("aenv_node_free_vcpus", "aenv_node_idle_vcpus"),  # a series nobody exports
        ("aenv_lifecycle_seconds_bucket", "aenv_lifecycle_seconds"),  # quantile off a histogram
        ("(state, node) (aenv_sandboxes))", "(state, node) (aenv_sandboxes)"),  # unbalanced
        ("rate(aenv_node_vm_cpu", "ratee(aenv_node_vm_cpu"),  # no such function
    ],
)
def test_the_query_check_rejects_a_broken_copy(old: str, new: str) -> None:
    text = DASHBOARD.read_text()
    assert old in text, f"mutation target {old!r} not found"
    assert query_errors(json.loads(text.replace(old, new, 1)))


def _scrape_errors(conf: dict[str, Any]) -> list[str]:
    errors = []
    jobs = {j["job_name"]: j for j in conf.get("scrape_configs", [])}
    if set(jobs) != {"aenv-api", "aenv-node", "nats"}:
        errors.append(f"jobs {sorted(jobs)}: want aenv-api, aenv-node and nats")
    # AENV_PORT, AENV_PROXY_PORT; the NATS exporter's (deploy/compose, deploy/k8s)
    ports = {"aenv-api": "3000", "aenv-node": "3001", "nats": "7777"}
    if conf.get("rule_files") != ["/etc/prometheus/aenv-alerts.yml"]:
        errors.append("rule_files: want the alert rules (deploy/prometheus/aenv-alerts.yml)")
    for name, job in jobs.items():
        auth = job.get("authorization", {})
        if name != "nats" and (auth.get("type") != "Bearer" or not auth.get("credentials_file")):
            errors.append(f"{name}: /metrics needs the bearer token (credentials_file)")
        if job.get("metrics_path", "/metrics") != "/metrics":
            errors.append(f"{name}: scrapes {job['metrics_path']}, not /metrics")
        targets = [t for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
        if not targets or any(t.rpartition(":")[2] != ports.get(name) for t in targets):
            errors.append(f"{name}: targets {targets} are not on port {ports.get(name)}")
    return errors


def test_prometheus_scrapes_both_roles_with_the_token() -> None:
    conf = yaml.safe_load(PROMETHEUS.read_text())
    assert _scrape_errors(conf) == []
    env, _ = df.read_env_file((df.SYSTEMD / "aenv.env.example").read_text())
    assert env["AENV_PORT"] == "3000" and env["AENV_PROXY_PORT"] == "3001"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["scrape_configs"][1]["authorization"].pop("credentials_file"),
        lambda c: c["scrape_configs"][0]["static_configs"][0]["targets"].append("api-3:9090"),
        lambda c: c["scrape_configs"].pop(),
        lambda c: c["scrape_configs"][2]["static_configs"][0]["targets"].append("nats-1:8222"),
        lambda c: c.pop("rule_files"),
    ],
)
def test_the_scrape_check_rejects_a_broken_copy(mutate: Callable[[dict[str, Any]], None]) -> None:
    conf = yaml.safe_load(PROMETHEUS.read_text())
    mutate(conf)
    assert _scrape_errors(conf)


def test_the_documentation_names_exactly_the_exported_series() -> None:
    documented = set(_SERIES.findall(DOC.read_text()))
    exported = samples(FAMILIES) | set(FAMILIES)
    assert documented <= exported, f"documented, not exported: {documented - exported}"
    missing = {
        f for f in FAMILIES if f not in documented and not samples({f: FAMILIES[f]}) & documented
    }
    assert missing == set(), f"exported, not documented: {missing}"


def test_fleet_wide_gauges_are_never_summed_once_per_instance() -> None:
    assert fleet_sum_errors(_exprs(_dashboard()), FLEET_WIDE) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            "sum by (state) (max by (state, node) (aenv_sandboxes))",
            "sum by (state) (aenv_sandboxes)",
        ),  # the x2/x3 of issue 30
        (
            "max by (stream, consumer) (aenv_jetstream_consumer_pending)",
            "sum(aenv_jetstream_consumer_pending)",
        ),
        (
            "max by (stream) (aenv_jetstream_stream_fill_ratio)",
            "aenv_jetstream_stream_fill_ratio",
        ),  # raw: one line per API
    ],
)
def test_the_fleet_sum_check_rejects_a_summed_copy(old: str, new: str) -> None:
    text = DASHBOARD.read_text()
    assert old in text, f"mutation target {old!r} not found"
    assert fleet_sum_errors(_exprs(json.loads(text.replace(old, new, 1))), FLEET_WIDE)
