"""A client whose connection a test cuts: it runs one command in the foreground through the
unchanged e2b SDK (`commands.run(cmd, on_stdout=…)`) and prints its output as it arrives,
until the test kills it (SIGKILL: the kernel closes its connection, nothing says goodbye).

    python -m tests.cutclient envd URL TOKEN TIMEOUT CMD   # envd on the host (no API)
    python -m tests.cutclient sandbox ID TIMEOUT CMD       # a sandbox of a stack (E2B_* env)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from e2b import Sandbox
from e2b.connection_config import ConnectionConfig
from packaging.version import Version

from envd.version import ENVD_VERSION


def host_envd(url: str, token: str) -> Sandbox:
    """The SDK's Sandbox pointed at an envd on the host (as tests/integration/envd does)."""
    headers = {"E2b-Sandbox-Id": "envdtest", "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    config = ConnectionConfig(sandbox_url=url, api_key="unused", extra_sandbox_headers=headers)
    return Sandbox(
        sandbox_id="envdtest",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


def run_and_cut(args: list[str], until: str, env: dict[str, str] | None = None) -> list[str]:
    """Start this client with `args`, read its output up to the line `until`, then SIGKILL
    it; returns the lines it had received (RUNNING first)."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cutclient", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == until or lines[-1] == "NOT CUT":
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert lines[-1] == until, lines
    return lines


def main(argv: list[str]) -> None:
    if argv[0] == "envd":
        sbx, timeout, cmd = host_envd(argv[1], argv[2]), float(argv[3]), argv[4]
    else:
        sbx, timeout, cmd = Sandbox.connect(argv[1]), float(argv[2]), argv[3]
    print("RUNNING", flush=True)
    sbx.commands.run(cmd, timeout=timeout, on_stdout=lambda s: print(s, end="", flush=True))
    print("NOT CUT", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
