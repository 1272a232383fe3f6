"""NATS's own monitoring is scraped (issue 30): every NATS server of compose and Kubernetes
serves its monitoring port, one prometheus-nats-exporter (pinned) reads each, and the
Prometheus config scrapes exactly those exporters."""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from tests.deploy import deploy_files as df

EXPORTER = "natsio/prometheus-nats-exporter"
PROMETHEUS = df.DEPLOY / "grafana" / "prometheus.yml"
IMAGES = df.K8S / "components" / "images" / "kustomization.yaml"
#: the series the alert rules read need `-jsz` (and `-varz` for the server's name)
FLAGS = ("-varz", "-jsz=all", "-port=7777")


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load((df.COMPOSE / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def exporter_problems(doc: dict[str, Any]) -> list[str]:
    """One pinned exporter per NATS server, reading its monitoring port with the flags the
    rules need; Prometheus scrapes each on 7777."""
    services = doc["services"]
    servers = {n for n, s in services.items() if str(s.get("image", "")).startswith("nats:")}
    exporters = {n: s for n, s in services.items() if str(s.get("image", "")).startswith(EXPORTER)}
    problems = []
    read = []
    for name, svc in exporters.items():
        image = str(svc["image"])
        if not re.fullmatch(rf"{EXPORTER}:\d+\.\d+\.\d+", image):
            problems.append(f"{name}: image {image} is not pinned to a release")
        args = [str(a) for a in svc.get("command", [])]
        problems += [f"{name}: without {f}" for f in FLAGS if f not in args]
        read += [m.group(1) for a in args if (m := re.fullmatch(r"http://([^:/]+):8222/?", a))]
    if sorted(read) != sorted(servers):
        problems.append(f"exporters read {sorted(read)}, not each of {sorted(servers)} once")
    conf = yaml.safe_load(PROMETHEUS.read_text())
    job = next((j for j in conf["scrape_configs"] if j["job_name"] == "nats"), {})
    targets = sorted(t for sc in job.get("static_configs", []) for t in sc["targets"])
    if targets != sorted(f"{n}:7777" for n in exporters):
        problems.append(f"job nats scrapes {targets}, not the exporters {sorted(exporters)}")
    return problems


def test_each_nats_server_serves_its_monitoring_port() -> None:
    for conf in (df.COMPOSE / "nats.conf", df.K8S / "base" / "nats.conf"):
        assert re.search(r"^http: 0\.0\.0\.0:8222$", conf.read_text(), re.M), conf


def test_compose_runs_one_pinned_exporter_per_server_and_prometheus_scrapes_them() -> None:
    assert exporter_problems(_compose()) == []


def test_the_exporter_check_rejects_a_broken_copy() -> None:
    for mutate in (
        lambda d: d["services"].pop("nats-exporter-3"),
        lambda d: d["services"]["nats-exporter-1"].update(image=f"{EXPORTER}:latest"),
        lambda d: d["services"]["nats-exporter-2"]["command"].remove("-jsz=all"),
    ):
        doc = copy.deepcopy(_compose())
        mutate(doc)
        assert exporter_problems(doc)


def test_kubernetes_nats_pods_carry_the_exporter_beside_the_server() -> None:
    images = df.image_component(IMAGES)
    assert re.fullmatch(rf"{EXPORTER}:\d+\.\d+\.\d+", images["nats-exporter"])
    assert images["nats-exporter"].split(":")[1] == _compose_tag()
    docs = list(yaml.safe_load_all((df.K8S / "base" / "nats.yaml").read_text()))
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    sidecar = containers["metrics"]
    assert sidecar["image"] == "nats-exporter"
    assert all(f in sidecar["args"] for f in FLAGS)
    assert "http://localhost:8222" in sidecar["args"]
    assert {"name": "metrics", "containerPort": 7777} in sidecar["ports"]


def _compose_tag() -> str:
    image = next(
        str(s["image"])
        for s in _compose()["services"].values()
        if str(s.get("image", "")).startswith(EXPORTER)
    )
    return image.split(":")[1]
