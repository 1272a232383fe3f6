"""Static checks of the sandbox domain's deploy files (HTTPS by host name): compose.tls.yaml
merged over compose.yaml, haproxy.tls.cfg, the Kubernetes Ingress, the cert-manager
Certificate and ClusterIssuer example. Every check is shown to reject a broken copy; the
settings they name are checked against the code with the rest of deploy/
(test_deploy_files.py). No service is started."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import deploy_files as df
from tests.deploy import tls_files as tf
from tests.deploy.settings_names import known_names, parse_errors

TLS_CFG = df.COMPOSE / "haproxy.tls.cfg"
CERT_MANAGER = df.K8S / "components" / "cert-manager"
SANDBOX_DOMAIN = df.K8S / "components" / "sandbox-domain"
PRODUCTION = df.K8S / "overlays" / "production"

Doc = dict[str, Any]


@cache
def _env() -> dict[str, str]:
    assigned, _ = df.read_env_file((df.COMPOSE / ".env.example").read_text())
    return {k: f"dummy-{k.lower().replace('_', '-')}" for k in assigned}


def merged() -> Doc:
    """`docker compose -f compose.yaml -f compose.tls.yaml`, .env.example's names filled."""
    base = df.load_compose(df.COMPOSE / "compose.yaml", _env())
    return tf.merge_compose(base, df.load_compose(df.COMPOSE / "compose.tls.yaml", _env()))


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"mutation target {old!r} not found"
    return text.replace(old, new, 1)


# --- compose -----------------------------------------------------------------------------


def test_merge_follows_compose_rules() -> None:
    base = {
        "s": {"environment": {"A": "1"}, "ports": ["1:1"], "command": ["a"], "volumes": ["x:/a"]}
    }
    over = {
        "s": {"environment": {"B": "2"}, "ports": ["2:2"], "command": ["b"], "volumes": ["y:/a"]}
    }
    assert tf.merge_compose(base, over) == {
        "s": {
            "environment": {"A": "1", "B": "2"},
            "ports": ["1:1", "2:2"],
            "command": ["b"],
            "volumes": ["y:/a"],
        }
    }


def test_compose_tls_override_matches_the_compose_specification() -> None:
    assert df.compose_schema_errors(df.load_compose(df.COMPOSE / "compose.tls.yaml", _env())) == []
    assert df.compose_schema_errors(merged()) == []


def test_compose_tls_fleet_is_wired() -> None:
    doc = merged()
    assert df.compose_problems(doc, df.COMPOSE) == []
    assert df.haproxy_problems((df.COMPOSE / "haproxy.cfg").read_text(), doc["services"]) == []
    assert tf.compose_tls_problems(doc, TLS_CFG.read_text()) == []
    api = df.service_env(doc["services"]["api-1"])
    assert api["AENV_SANDBOX_DOMAIN"] == _env()["SANDBOX_DOMAIN"]
    assert api["AENV_TLS_CERT_FILE"] == "/run/secrets/aenv-tls-cert"
    assert doc["secrets"]["aenv-tls-key"] == {"file": _env()["TLS_KEY_FILE"]}


def test_compose_tls_settings_exist_are_required_and_parse() -> None:
    for svc in merged()["services"].values():
        role = df.service_role(svc)
        env = df.service_env(svc)
        assert df.unknown_names(env, known_names()) == []
        if role is not None:
            assert df.missing_required(role, env) == [], role
            assert parse_errors(env) == [], role
    assert parse_errors({"AENV_TLS_PORT": "https"})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["services"]["api-2"].pop("secrets"),
        lambda d: d["services"]["api-1"]["environment"].update(AENV_TLS_KEY_FILE="/etc/tls.key"),
        lambda d: d["services"]["api-1"]["environment"].pop("AENV_SANDBOX_DOMAIN"),
        lambda d: d["services"]["api-2"]["environment"].update(AENV_TLS_PORT="9443"),
        lambda d: d["secrets"].pop("aenv-tls-cert"),
        lambda d: d["services"]["lb"].update(ports=["3000:3000", "443:443"]),
        lambda d: d["services"]["lb"].update(
            command=["haproxy", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
        ),
    ],
)
def test_compose_tls_check_rejects_broken_copy(mutate: Callable[[Doc], None]) -> None:
    doc = copy.deepcopy(merged())
    mutate(doc)
    assert tf.compose_tls_problems(doc, TLS_CFG.read_text())


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("server api-2 api-2:8443", "server api-2 api-2:3000"),
        ("server api-1 api-1:8443", "server api-3 api-3:8443"),
        ("bind :8443", "bind :9443"),
        ("uri /health/ready", "uri /health/live"),
    ],
)
def test_compose_tls_check_rejects_broken_haproxy_cfg(old: str, new: str) -> None:
    assert tf.compose_tls_problems(merged(), _replace(TLS_CFG.read_text(), old, new))


def test_haproxy_accepts_both_files() -> None:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy not installed (Debian: apt-get install haproxy)")
    assert tf.haproxy_check_problems(df.COMPOSE / "haproxy.cfg", TLS_CFG) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("mode tcp", "mode tpc"),  # an error
        ("option tcplog", "option httplog"),  # a warning: HTTP logging of a TCP proxy
        ("resolvers docker", "resolvers dns"),  # no such section in haproxy.cfg
    ],
)
def test_haproxy_check_rejects_broken_copy(tmp_path: Path, old: str, new: str) -> None:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy not installed (Debian: apt-get install haproxy)")
    broken = tmp_path / "haproxy.tls.cfg"
    broken.write_text(_replace(TLS_CFG.read_text(), old, new))
    assert tf.haproxy_check_problems(df.COMPOSE / "haproxy.cfg", broken)


# --- Kubernetes --------------------------------------------------------------------------


@cache
def _production() -> list[Doc]:
    return df.kustomize(PRODUCTION)


def _issuers() -> list[Doc]:
    return [d for d in yaml.safe_load_all((CERT_MANAGER / "cluster-issuer.yaml").read_text()) if d]


def test_production_serves_the_sandbox_domain() -> None:
    docs = _production()
    kinds = {d["kind"] for d in docs}
    assert {"Ingress", "Certificate"} <= kinds
    assert df.k8s_validation_errors(docs) == []
    assert tf.ingress_problems(docs) == []
    assert tf.certificate_problems(docs, _issuers()) == []
    assert tf.api_domain(docs) == "sandbox.example.com"


def test_cluster_issuer_example_is_valid() -> None:
    assert df.k8s_validation_errors(_issuers()) == []
    assert [d["kind"] for d in _issuers()] == ["ClusterIssuer"]


def test_dev_overlay_has_no_ingress() -> None:
    docs = df.kustomize(df.K8S / "overlays" / "dev")
    assert not [d for d in docs if d["kind"] in ("Ingress", "Certificate")]
    assert tf.ingress_problems(docs) == []


def test_the_domain_is_set_in_one_place(tmp_path: Path) -> None:
    """Another domain in the component's ConfigMap reaches every host and name."""
    tree = tmp_path / "k8s"
    shutil.copytree(df.K8S, tree)
    kustomization = tree / "components" / "sandbox-domain" / "kustomization.yaml"
    kustomization.write_text(
        _replace(kustomization.read_text(), "=sandbox.example.com", "=sbx.corp.example.org")
    )
    docs = df.kustomize(tree / "overlays" / "production")
    assert tf.api_domain(docs) == "sbx.corp.example.org"
    assert tf.ingress_problems(docs) == []
    assert tf.certificate_problems(docs, _issuers()) == []
    ingress = next(d for d in docs if d["kind"] == "Ingress")
    assert {r["host"] for r in ingress["spec"]["rules"]} == {
        "api.sbx.corp.example.org",
        "*.sbx.corp.example.org",
    }


def _ingress(d: list[Doc]) -> Doc:
    return next(x for x in d if x["kind"] == "Ingress")


def _cert(d: list[Doc]) -> Doc:
    return next(x for x in d if x["kind"] == "Certificate")


def _api_config(d: list[Doc]) -> Doc:
    return next(x for x in d if x["kind"] == "ConfigMap" and "AENV_SANDBOX_DOMAIN" in x["data"])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: _ingress(d)["spec"]["rules"][1].update(host="*.example.com"),
        lambda d: _ingress(d)["spec"]["tls"][0].update(hosts=["api.sandbox.example.com"]),
        lambda d: _ingress(d)["spec"]["tls"][0].update(secretName="aenv-tls"),
        lambda d: _ingress(d)["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(
            name="aenv-node"
        ),
        lambda d: _ingress(d)["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(
            port={"number": 8080}
        ),
        lambda d: _ingress(d)["metadata"]["annotations"].pop(
            "nginx.ingress.kubernetes.io/proxy-read-timeout"
        ),
        lambda d: _ingress(d)["metadata"]["annotations"].update(
            {"nginx.ingress.kubernetes.io/proxy-body-size": "1m"}
        ),
        lambda d: _api_config(d)["data"].update(AENV_SANDBOX_DOMAIN="sandbox.example.com:8443"),
        lambda d: _api_config(d)["data"].update(AENV_SANDBOX_DOMAIN="other.example.com"),
    ],
)
def test_ingress_check_rejects_broken_copy(mutate: Callable[[list[Doc]], None]) -> None:
    docs = copy.deepcopy(_production())
    mutate(docs)
    assert tf.ingress_problems(docs)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d, _: _cert(d)["spec"].update(dnsNames=["*.sandbox.example.com"]),
        lambda d, _: _cert(d)["spec"]["issuerRef"].update(name="letsencrypt"),
        lambda _, i: i[0]["spec"]["acme"]["solvers"][0].update(http01={"ingress": {}}),
        lambda _, i: i[0]["spec"]["acme"]["solvers"].__setitem__(0, {"http01": {"ingress": {}}}),
        lambda d, _: _api_config(d)["data"].update(AENV_SANDBOX_DOMAIN="other.example.com"),
    ],
)
def test_certificate_check_rejects_broken_copy(
    mutate: Callable[[list[Doc], list[Doc]], None],
) -> None:
    docs, issuers = copy.deepcopy(_production()), _issuers()
    mutate(docs, issuers)
    assert tf.certificate_problems(docs, issuers)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: _cert(d)["spec"].update(secretname="aenv-sandbox-tls"),  # no such field
        lambda d: _cert(d)["spec"].pop("secretName"),
        lambda d: _cert(d)["spec"]["privateKey"].update(algorithm="DSA"),
        lambda d: _ingress(d)["spec"]["tls"][0].update(secret="aenv-sandbox-tls"),
    ],
)
def test_schema_rejects_broken_copy(mutate: Callable[[list[Doc]], None]) -> None:
    docs = copy.deepcopy(_production())
    mutate(docs)
    assert df.k8s_validation_errors(docs)


def test_cluster_issuer_schema_rejects_broken_copy() -> None:
    issuers = _issuers()
    issuers[0]["spec"]["acme"]["solvers"][0]["dns01"]["cloudflare"]["apiToken"] = "x"
    assert df.k8s_validation_errors(issuers)
    assert df.k8s_validation_errors([{**_issuers()[0], "spec": {"acme": {"email": "x"}}}])
