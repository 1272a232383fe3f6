"""The unchanged SDK run as E2B's own users configure it: told only `E2B_DOMAIN`,
`E2B_API_KEY` and the CA bundle (`SSL_CERT_FILE`), no `E2B_API_URL` nor `E2B_SANDBOX_URL`,
in a process of its own (the test process carries the stack's `E2B_*` settings). It then
reaches the API at `https://api.{domain}`, envd at `https://49983-{id}.{domain}` and guest
ports at `get_host(port)`; names resolve through this machine's `*.localhost`
(scripts/setup.sh)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack

__all__ = ["by_name_env", "last_json", "run_by_name"]


def by_name_env(stack: Stack) -> dict[str, str]:
    """This process's environment less any E2B/aenv setting and `SSL_CERT_DIR`, plus only
    what an E2B user sets: the domain, the API key and the CA bundle (`SSL_CERT_FILE` for
    Python, `NODE_EXTRA_CA_CERTS` for Node). Fails at once, naming the cause, when the
    domain's names do not resolve here."""
    domain = stack.tls_env["E2B_DOMAIN"]
    try:
        socket.getaddrinfo(f"api.{domain.rsplit(':', 1)[0]}", None)
    except OSError:
        pytest.fail("*.localhost does not resolve on this machine: run scripts/setup.sh")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))}
    env.pop("SSL_CERT_DIR", None)
    return env | {
        "E2B_DOMAIN": domain,
        "E2B_API_KEY": stack.api_key,
        "SSL_CERT_FILE": stack.tls_env["SSL_CERT_FILE"],
        "NODE_EXTRA_CA_CERTS": stack.tls_env["NODE_EXTRA_CA_CERTS"],
    }


def last_json(
    argv: list[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = 240
) -> dict[str, object]:
    """Run a client script to its end (exit 0); the JSON object its last line prints."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def run_by_name(stack: Stack, script: str, *, timeout: float = 240) -> dict[str, object]:
    """Run `script` with the SDK told only the domain, the API key and the CA bundle; its
    last line of output is a JSON object, returned."""
    return last_json([sys.executable, "-c", script], by_name_env(stack), timeout=timeout)
