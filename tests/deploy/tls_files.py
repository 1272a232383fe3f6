"""Checkers for the sandbox domain's deploy files (HTTPS by host name, docs/deploy.md "A
sandbox domain with TLS"): compose.tls.yaml with haproxy.tls.cfg, and the Kubernetes
Ingress and cert-manager Certificate. Each returns the problems it finds, so a test can
show it passes the real files and rejects a broken copy.

What they hold together is what the API reads (`aenv/tls/settings.py`, `api/context.py`):
`AENV_SANDBOX_DOMAIN` is the domain whose `api.` and `*.` names are served, the certificate
and key are files named by `AENV_TLS_CERT_FILE`/`AENV_TLS_KEY_FILE`, and HTTPS is served on
`AENV_TLS_PORT`."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.deploy import deploy_files as df

#: compose's secrets are mounted here, one file per secret, named by its target
SECRETS_DIR = "/run/secrets"
#: Sequences compose appends from an override instead of replacing (compose-spec, merge).
_APPENDED = frozenset({"ports", "expose", "secrets", "configs", "dns", "volumes"})
#: ingress-nginx annotations a stream needs: idle timeouts (seconds, at least an hour), no
#: body limit, no buffering of a command's output
_NGINX = "nginx.ingress.kubernetes.io/"
STREAMING_ANNOTATIONS = {
    _NGINX + "proxy-read-timeout": 3600,
    _NGINX + "proxy-send-timeout": 3600,
}
UNBOUNDED_ANNOTATIONS = {
    _NGINX + "proxy-body-size": "0",
    _NGINX + "proxy-buffering": "off",
    _NGINX + "proxy-request-buffering": "off",
}


def merge_compose(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`docker compose -f base -f override` as compose merges them: mappings key by key,
    `ports`/`volumes`/`secrets`… appended (a volume replaced by its target), any other value
    (`command`) replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        have = out.get(key)
        if isinstance(have, Mapping) and isinstance(value, Mapping):
            out[key] = merge_compose(have, value)
        elif key in _APPENDED and isinstance(have, list) and isinstance(value, list):
            if key == "volumes":
                targets = {_mount_target(v) for v in value}
                have = [v for v in have if _mount_target(v) not in targets]
            out[key] = [*have, *copy.deepcopy(value)]
        else:
            out[key] = copy.deepcopy(value)
    return out


def _mount_target(volume: Any) -> str:
    return str(volume).split(":")[1] if ":" in str(volume) else str(volume)


def _secret_name(entry: Any) -> tuple[str, str]:
    """(secret, where it is mounted) of a service's `secrets:` entry."""
    if isinstance(entry, Mapping):
        source = str(entry["source"])
        return source, str(entry.get("target") or source)
    return str(entry), str(entry)


def compose_tls_problems(doc: Mapping[str, Any], tls_cfg: str) -> list[str]:
    """The merged compose fleet serves the sandbox domain: every API has the domain, its
    TLS port, and certificate and key files that are secrets it mounts (declared, from a
    file); the load balancer loads haproxy.tls.cfg, whose servers are exactly the APIs at
    their TLS port, and publishes its TLS frontend."""
    problems: list[str] = []
    services: dict[str, Any] = doc.get("services") or {}
    declared = doc.get("secrets") or {}
    apis = {n: s for n, s in services.items() if df.service_role(s) == "api"}
    ports = set()
    for name, svc in apis.items():
        env = df.service_env(svc)
        if not env.get("AENV_SANDBOX_DOMAIN"):
            problems.append(f"{name}: no AENV_SANDBOX_DOMAIN")
        ports.add(env.get("AENV_TLS_PORT", "8443"))  # TlsSettings' default
        mounted = dict(_secret_name(e)[::-1] for e in svc.get("secrets") or [])
        for setting in ("AENV_TLS_CERT_FILE", "AENV_TLS_KEY_FILE"):
            path = env.get(setting, "")
            target = path.removeprefix(SECRETS_DIR + "/")
            secret = mounted.get(target) or mounted.get(path)
            if secret is None:
                problems.append(f"{name}: {setting}={path!r} is no secret it mounts")
            elif not (declared.get(secret) or {}).get("file"):
                problems.append(f"{name}: secret {secret} is not declared from a file")
    if len(ports) > 1:
        problems.append(f"the APIs serve TLS on different ports: {sorted(ports)}")
    targets = set(re.findall(r"^\s*server\s+\S+\s+([\w.-]+):(\d+)\b", tls_cfg, re.M))
    want = {(n, p) for n in apis for p in ports}
    if targets != want:
        problems.append(f"haproxy.tls.cfg balances {sorted(targets)}, want {sorted(want)}")
    if not re.search(r"^\s*http-check send .*uri /health/ready", tls_cfg, re.M):
        problems.append("haproxy.tls.cfg does not check /health/ready")
    lb = services.get("lb") or {}
    command = " ".join(map(str, lb.get("command") or []))
    mounts = {_mount_target(v): str(v).split(":")[0] for v in lb.get("volumes") or []}
    loaded = re.findall(r"-f\s+(\S+)", command)
    if not any(mounts.get(p) == "./haproxy.tls.cfg" for p in loaded):
        problems.append("lb does not load ./haproxy.tls.cfg")
    binds = set(re.findall(r"^\s*bind\s+\S*:(\d+)", tls_cfg, re.M))
    published = {str(p).rsplit(":", 1)[-1] for p in lb.get("ports") or []}
    if not binds or not binds <= published:
        problems.append(f"lb publishes {sorted(published)}, not the TLS frontend's {binds}")
    return problems


def haproxy_check_problems(*configs: Path) -> list[str]:
    """`haproxy -c` over the files in the order lb loads them: its errors, and warnings save
    those about the servers' names, which resolve only in compose's network."""
    haproxy = shutil.which("haproxy")
    assert haproxy, "haproxy not found"
    args = [a for c in configs for a in ("-f", str(c))]
    proc = subprocess.run(
        [haproxy, "-c", *args], capture_output=True, text=True, timeout=30, check=False
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    problems = [
        ln
        for ln in lines
        if ("[WARNING]" in ln or "[ALERT]" in ln) and "could not resolve address" not in ln
    ]
    if proc.returncode != 0 and not problems:
        problems.append(f"haproxy -c exited {proc.returncode}")
    return problems


# --- Kubernetes ------------------------------------------------------------------------


def _by_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def api_domain(docs: list[dict[str, Any]]) -> str | None:
    """AENV_SANDBOX_DOMAIN as the API's pods get it (None: they do not)."""
    for c in df.containers(docs).values():
        if df.workload_role(c) == "api":
            return df.container_env(c, docs).get("AENV_SANDBOX_DOMAIN")
    return None


def ingress_problems(docs: list[dict[str, Any]]) -> list[str]:
    """The Ingress serves exactly `api.{domain}` and `*.{domain}` for the API's domain (no
    port: it listens on 443), over TLS from a Secret a Certificate writes when there is
    one, to Service aenv-api on a port that reaches the API's `http`; with ingress-nginx's
    annotations for long streams."""
    domain = api_domain(docs)
    ingresses = _by_kind(docs, "Ingress")
    if not domain:
        return ["the API has no AENV_SANDBOX_DOMAIN"] if ingresses else []
    if ":" in domain:
        return [f"AENV_SANDBOX_DOMAIN={domain}: an Ingress serves 443, the domain has no port"]
    if not ingresses:
        return [f"no Ingress for {domain}"]
    want = {f"api.{domain}", f"*.{domain}"}
    services = {d["metadata"]["name"]: d for d in _by_kind(docs, "Service")}
    written = {c["spec"]["secretName"] for c in _by_kind(docs, "Certificate")}
    problems: list[str] = []
    for ing in ingresses:
        name, spec = ing["metadata"]["name"], ing["spec"]
        hosts = {r.get("host") for r in spec.get("rules", [])}
        if hosts != want:
            problems.append(f"Ingress {name}: hosts {sorted(map(str, hosts))}, want {sorted(want)}")
        tls_hosts = {h for t in spec.get("tls", []) for h in t.get("hosts", [])}
        if not want <= tls_hosts:
            problems.append(f"Ingress {name}: TLS misses {sorted(want - tls_hosts)}")
        secrets = {t.get("secretName") for t in spec.get("tls", [])}
        if written and not secrets <= written:
            problems.append(f"Ingress {name}: TLS Secret {secrets}, Certificates write {written}")
        for rule in spec.get("rules", []):
            for path in rule.get("http", {}).get("paths", []):
                problems += _backend_problems(name, path["backend"], services)
        notes = ing["metadata"].get("annotations") or {}
        for key, least in STREAMING_ANNOTATIONS.items():
            value = str(notes.get(key, "0"))
            if not value.isdigit() or int(value) < least:
                problems.append(f"Ingress {name}: {key} is {value!r}, want >= {least}")
        for key, value in UNBOUNDED_ANNOTATIONS.items():
            if notes.get(key) != value:
                problems.append(f"Ingress {name}: {key} is {notes.get(key)!r}, want {value!r}")
    return problems


def _backend_problems(
    ingress: str, backend: Mapping[str, Any], services: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    svc = backend.get("service") or {}
    target = services.get(svc.get("name", ""))
    if target is None or target["metadata"]["name"] != "aenv-api":
        return [f"Ingress {ingress}: backend {svc.get('name')} is not Service aenv-api"]
    port = svc.get("port") or {}
    for p in target["spec"]["ports"]:
        if port in ({"name": p.get("name")}, {"number": p.get("port")}):
            if p.get("targetPort") != "http":
                return [f"Ingress {ingress}: port {port} does not reach the API's http"]
            return []
    return [f"Ingress {ingress}: Service aenv-api has no port {port}"]


def certificate_problems(
    docs: list[dict[str, Any]], issuers: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Every Certificate names the API's domain and its wildcard and is issued by one of
    `issuers` (the ClusterIssuer example) with an ACME DNS-01 solver: a wildcard name can
    be proven only through DNS."""
    domain = api_domain(docs)
    by_name = {(i["kind"], i["metadata"]["name"]): i for i in issuers}
    problems: list[str] = []
    for cert in _by_kind(docs, "Certificate"):
        name, spec = cert["metadata"]["name"], cert["spec"]
        want = {str(domain), f"*.{domain}"}
        if set(spec.get("dnsNames", [])) != want:
            problems.append(f"Certificate {name}: dnsNames {spec.get('dnsNames')}, want {want}")
        ref = spec.get("issuerRef") or {}
        issuer = by_name.get((ref.get("kind", "Issuer"), ref.get("name")))
        if issuer is None:
            problems.append(f"Certificate {name}: issuer {ref} is not in the example")
            continue
        solvers = issuer["spec"].get("acme", {}).get("solvers", [])
        if not solvers or any(set(s) - {"selector"} != {"dns01"} for s in solvers):
            problems.append(f"{issuer['kind']} {ref.get('name')}: not ACME with DNS-01 only")
    return problems
