"""The alert rules of deploy/prometheus/ (issue 30): `promtool check rules` and the rules'
own unit tests pass; every series a rule names is one aenv's code defines (or Prometheus's
`up`, or NATS's exporter's); no rule sums a fleet-wide gauge; each rule says how bad and
what. promtool comes from Debian's `prometheus` package (scripts/setup.sh installs it, so
CI runs these); without it locally the promtool checks skip and the rest still run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import deploy_files as df
from tests.deploy.promql import enclosing_aggregations, fleet_sum_errors
from tests.deploy.settings_names import ROOT
from tests.series import FAMILIES, FLEET_WIDE, samples

RULES_DIR = df.DEPLOY / "prometheus"
RULES = RULES_DIR / "aenv-alerts.yml"
RULE_TESTS = RULES_DIR / "aenv-alerts.test.yml"
#: Where aenv defines its series
CODE = ("api", "shared", "workers", "bus", "projections", "aenv")
#: Series from outside aenv: Prometheus's own, and prometheus-nats-exporter's (`-jsz=all`,
#: collector/jsz.go of the pinned 0.17.3: job `nats` of deploy/grafana/prometheus.yml)
EXTERNAL = frozenset({"up", "jetstream_server_total_message_bytes", "jetstream_server_max_storage"})
#: PromQL words that are no series
_KEYWORDS = frozenset(
    {"and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
)
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        why = "promtool not installed (Debian: apt-get install prometheus; scripts/setup.sh)"
        if os.environ.get("CI"):  # CI installed it: missing there is a broken setup
            pytest.fail(why)
        pytest.skip(why)
    return exe


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"]]


@cache
def _code_text() -> str:
    return "\n".join(p.read_text() for pkg in CODE for p in sorted((ROOT / pkg).rglob("*.py")))


def _family(name: str) -> str:
    """The family a sample name belongs to (a counter's `_total`, a histogram's parts)."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in FAMILIES:
            return name.removesuffix(suffix)
    return name


def series_errors(doc: dict[str, Any]) -> list[str]:
    """Each rule's series: known to the catalogue (`tests/series.py`) and defined in the
    code as a literal name, or external; and fleet-wide gauges read once."""
    known = samples(FAMILIES)
    code = _code_text()
    errors = []
    for rule in _rules(doc):
        expr = str(rule["expr"])
        names = {n for n, _ in enclosing_aggregations(expr)} - _KEYWORDS
        if not names:
            errors.append(f"{rule['alert']}: names no series")
        for name in sorted(names - EXTERNAL):
            if name not in known:
                errors.append(f"{rule['alert']}: {name} is no series aenv exports")
            elif f'"{_family(name)}"' not in code:
                errors.append(f"{rule['alert']}: {_family(name)} is defined nowhere in {CODE}")
        errors += [f"{rule['alert']}: {e}" for e in fleet_sum_errors([expr], FLEET_WIDE)]
    return errors


def shape_errors(doc: dict[str, Any]) -> list[str]:
    errors = []
    for rule in _rules(doc):
        name = rule.get("alert", "?")
        if not re.fullmatch(r"Aenv[A-Z][A-Za-z]+", name):
            errors.append(f"{name}: alerts are named Aenv…")
        if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
            errors.append(f"{name}: severity warning or critical")
        if not rule.get("annotations", {}).get("summary"):
            errors.append(f"{name}: no summary")
        if "for" not in rule:
            errors.append(f"{name}: no `for` (one bad scrape would page)")
    return errors


def test_promtool_checks_the_rules() -> None:
    run = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    run = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_unit_tests_catch_a_rule_that_sums_two_apis(tmp_path: Path) -> None:
    promtool = _promtool()
    for f in (RULES, RULE_TESTS):
        (tmp_path / f.name).write_text(f.read_text())
    broken = tmp_path / RULES.name
    text = broken.read_text()
    old = "max by (projection) (aenv_projection_lag_events)"
    assert old in text
    broken.write_text(text.replace(old, "sum by (projection) (aenv_projection_lag_events)"))
    run = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / RULE_TESTS.name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0 and "AenvProjectionLagging" in run.stdout + run.stderr


def test_every_series_of_the_rules_exists_and_is_read_once() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert series_errors(doc) == []
    assert shape_errors(doc) == []
    alerts = {r["alert"] for r in _rules(doc)}
    wanted = {
        "AenvEventLogFilling",  # store >= 70 %
        "AenvJetStreamStoreFilling",
        "AenvConsumerLagging",
        "AenvNodeGone",
        "AenvUploadBacklog",
        "AenvCreateFailures",
    }
    assert wanted <= alerts, wanted - alerts


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("aenv_node_heartbeat_age_seconds", "aenv_node_heartbeat_seconds", "no series"),
        (
            "max by (stream) (aenv_jetstream_stream_fill_ratio) >= 0.7",
            "sum by (stream) (aenv_jetstream_stream_fill_ratio) >= 0.7",
            "fleet-wide",
        ),
    ],
)
def test_the_series_check_rejects_a_broken_copy(old: str, new: str, complaint: str) -> None:
    text = RULES.read_text()
    assert old in text, f"mutation target {old!r} not found"
    errors = series_errors(yaml.safe_load(text.replace(old, new, 1)))
    assert any(complaint in e for e in errors), errors


def test_the_shape_check_rejects_a_rule_without_for_or_severity() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rule = _rules(doc)[0]
    rule.pop("for")
    rule["labels"] = {}
    assert len(shape_errors(doc)) == 2
