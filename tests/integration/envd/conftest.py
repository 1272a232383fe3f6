"""Fixtures that run envd as a real process on the host and drive it with the e2b SDK.

The SDK objects are built with their own constructors, pointed at envd through
`sandbox_url` (what E2B_SANDBOX_URL does), so every call takes the SDK's real client path —
connectrpc over pyqwest for RPCs, httpx for /files — with no control plane in between.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

from envd.version import ENVD_VERSION

REPO = Path(__file__).resolve().parents[3]
TEST_USER = "aenvtest"
TEST_HOME = "/tmp/aenv-envd-test-home"
# The guest runs Debian's python3 (3.11.2); use the same interpreter when the host has it.
GUEST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@dataclass
class Envd:
    proc: subprocess.Popen[str]
    port: int
    token: str | None
    user: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def ensure_test_user() -> str:
    """A throwaway unprivileged user (idempotent), so processes really switch users."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        pw = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "-M", "-d", TEST_HOME, "-s", "/bin/bash", TEST_USER],
            check=True,
            capture_output=True,
        )
        pw = pwd.getpwnam(TEST_USER)
    os.makedirs(pw.pw_dir, exist_ok=True)
    os.chown(pw.pw_dir, pw.pw_uid, pw.pw_gid)
    os.chmod(pw.pw_dir, 0o755)
    return TEST_USER


def start_envd(*args: str) -> Envd:
    """Start `python3 -m envd` on a free port and wait for its ENVD-READY line."""
    proc = subprocess.Popen(
        [GUEST_PYTHON, "-m", "envd", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if not os.environ.get("ENVD_TEST_LOGS") else None,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ENVD-READY "):
        proc.kill()
        raise RuntimeError(f"envd did not start: {line!r}")
    user = args[args.index("--default-user") + 1] if "--default-user" in args else "user"
    return Envd(proc, int(line.split()[1]), None, user)


def stop_envd(envd: Envd) -> None:
    envd.proc.terminate()
    try:
        envd.proc.wait(5)
    except subprocess.TimeoutExpired:
        envd.proc.kill()
        envd.proc.wait()


def init_envd(envd: Envd, token: str, **extra: object) -> None:
    r = httpx.post(f"{envd.url}/init", json={"accessToken": token, **extra})
    assert r.status_code == 204, r.text
    envd.token = token


def make_sandbox(envd: Envd, token: str | None, cls: type[Sandbox] = Sandbox) -> Sandbox:
    headers = {"E2b-Sandbox-Id": "envdtest", "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    config = ConnectionConfig(sandbox_url=envd.url, api_key="unused", extra_sandbox_headers=headers)
    return cls(
        sandbox_id="envdtest",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


@pytest.fixture(scope="session")
def test_user() -> str:
    return ensure_test_user()


@pytest.fixture(scope="session")
def envd(test_user: str) -> Iterator[Envd]:
    """The shared envd, initialised with an access token like a real sandbox's."""
    e = start_envd("--default-user", test_user)
    init_envd(e, "tok-" + uuid.uuid4().hex, envVars={"SANDBOX_VAR": "from-init"})
    yield e
    stop_envd(e)


@pytest.fixture(scope="session")
def sandbox(envd: Envd) -> Sandbox:
    return make_sandbox(envd, envd.token)


@pytest.fixture
def async_sandbox(envd: Envd) -> AsyncSandbox:
    sbx = make_sandbox(envd, envd.token, AsyncSandbox)  # type: ignore[arg-type]
    assert isinstance(sbx, AsyncSandbox)
    return sbx


@pytest.fixture(scope="session")
def home(test_user: str) -> str:
    return pwd.getpwnam(test_user).pw_dir


@pytest.fixture
def workdir(home: str, test_user: str) -> Iterator[str]:
    """A fresh directory in the test user's home, owned by that user."""
    pw = pwd.getpwnam(test_user)
    d = os.path.join(home, "t-" + uuid.uuid4().hex[:10])
    os.makedirs(d)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)
