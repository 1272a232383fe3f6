"""Which sandbox port a request is for, by its headers or its host name.

E2B's SDKs address a sandbox two ways: with `E2B_SANDBOX_URL` set, every request goes to
one URL and the `E2b-Sandbox-Id`/`-Port` headers name the sandbox; otherwise (and always
for `get_host(port)`) the host name does, `{port}-{sandboxId}.{domain}`, as E2B's edge
proxy parses it (infra `packages/shared/pkg/proxy/host.go`). `api.{domain}` is the control
plane, as is any host outside the domain (an address, `localhost`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["API_LABEL", "host_label", "sandbox_target", "stray_host"]

Scope = dict[str, Any]

#: the first label of a sandbox's host name, `{port}-{sandboxId}` (infra's id alphabet),
#: or `{port}-{sandboxId}-{clientId}`: early e2b 1.x SDKs (1.3.3) name a sandbox
#: `{sandboxID}-{clientID}` everywhere, and E2B's proxy keeps the part before the second `-`
_SANDBOX_LABEL = re.compile(r"^(\d{1,5})-([a-z0-9]{1,63})(?:-[a-z0-9]{1,63})?$")
#: the first label of the control plane's host name, `api.{domain}` (the SDK's default URL)
API_LABEL = "api"


def sandbox_target(scope: Scope, domain: str | None) -> tuple[str, int] | None:
    """(sandbox id, port) this request is addressed to, or None for control-plane traffic:
    by the `E2b-Sandbox-Id`/`-Port` headers (`E2B_SANDBOX_URL` clients), else by a Host of
    `{port}-{sandboxId}.{domain}` (every other client, and `get_host`), a client id after
    the sandbox id left out (`{port}-{sandboxId}-{clientId}`, e2b 1.3.3's)."""
    sid = port = host = None
    for k, v in scope.get("headers", ()):
        if k == b"e2b-sandbox-id":
            sid = v.decode("latin-1").strip()
        elif k == b"e2b-sandbox-port":
            port = v.decode("latin-1").strip()
        elif k == b"host":
            host = v.decode("latin-1")
    if sid:
        return sid, int(port) if port and port.isdigit() else 49983
    if host and domain:
        return _sandbox_port(host_label(host, domain))
    return None


def host_label(host: str, domain: str) -> str | None:
    """The part of a Host header before `.{domain}` (None: not a name under the domain).

    Ports are left out on both sides: the domain clients are given may carry the TLS port
    (`aenv.localhost:8443`, so the SDK's `https://api.{domain}` reaches it), and a request
    to the plain port names the same hosts with its own."""
    name, suffix = _bare(host), "." + _bare(domain)
    if not name.endswith(suffix) or len(name) == len(suffix):
        return None
    return name[: -len(suffix)]


def stray_host(scope: Scope, domain: str | None) -> str | None:
    """The Host of a request that is not sandbox traffic yet is under the sandbox domain,
    naming neither the API (`api.{domain}`) nor a sandbox port (`{port}-{sandboxId}.
    {domain}`): answered 400, never guessed at. None for any other."""
    host: str | None = next(
        (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), None
    )
    if not domain or host is None:
        return None
    label = host_label(host, domain)
    if label is None or label == API_LABEL or _sandbox_port(label) is not None:
        return None
    return host


def _sandbox_port(label: str | None) -> tuple[str, int] | None:
    """(sandbox id, port) a host's first label names, if it is `{port}-{sandboxId}`."""
    m = _SANDBOX_LABEL.match(label or "")
    if m is None or not 0 < int(m.group(1)) < 65536:
        return None
    return m.group(2), int(m.group(1))


def _bare(host: str) -> str:
    """A host name without its port and trailing dot, lower case (DNS ignores case)."""
    name = host.strip().lower()
    if not name.startswith("["):  # an IPv6 literal is never under a domain: left whole
        name = name.rsplit(":", 1)[0] if ":" in name else name
    return name.rstrip(".")
