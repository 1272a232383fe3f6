"""A stack of its own for the crash matrix (`aenv up`, embedded NATS/Postgres/S3, real
microVMs), apart from the e2e suite's: its own data dir, slot prefix and node id, so its
faults never touch another stack. Size: `AENV_RELIABILITY_N` sandboxes per scenario (CI runs
the default, a reduced size; `AENV_RELIABILITY_N=8 pytest tests/reliability` for more)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack.process import free_port

pytestmark = pytest.mark.vm

AENV = [sys.executable, "-m", "aenv.cli"]
PREFIX = "aenvr"
SIZE = int(os.environ.get("AENV_RELIABILITY_N", "3"))


@dataclass(frozen=True)
class Stack:
    data_dir: Path
    api_url: str
    api_key: str
    #: the environment `aenv up` ran with (slot prefix, node id): `aenv up` again needs it
    env: dict[str, str]

    def info(self) -> dict[str, object]:
        return dict(json.loads((self.data_dir / "stack.json").read_text()))

    @property
    def nats_url(self) -> str:
        """From stack.json each time: a stack started again may have its NATS elsewhere."""
        return str(self.info()["nats_url"])

    def service_pid(self, name: str) -> int | None:
        """An embedded server's pid, from the supervisor's process records."""
        try:
            records = json.loads((self.data_dir / "processes.json").read_text())
        except (OSError, ValueError):
            return None
        return next((int(r["pid"]) for r in records if r["name"] == name), None)

    def aenv(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AENV, *args, "--data-dir", str(self.data_dir)],
                              capture_output=True, text=True, timeout=timeout,
                              env=self.env)  # fmt: skip


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    st = getattr(item, "funcargs", {}).get("rstack")
    if report.failed and isinstance(st, Stack):
        log = st.data_dir / "aenv.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        lines = [ln for ln in lines if '"qemu.qmp.' not in ln][-300:]
        report.sections.append(("aenv.log (tail)", "\n".join(lines)))


@pytest.fixture(scope="package")
def rstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs: needs root")
    data = tmp_path_factory.mktemp("aenv-reliability")
    env = {**os.environ, "AENV_SLOT_PREFIX": PREFIX, "AENV_NODE_ID": "rel",
           "AENV_PROXY_VIA_NODE": "1"}  # fmt: skip
    up = subprocess.run([*AENV, "up", "--data-dir", str(data), "--port", str(free_port())],
                        capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    if up.returncode != 0:
        log = (data / "aenv.log").read_text(errors="replace")[-4000:]
        pytest.fail(f"aenv up failed ({up.returncode}): {up.stderr[-2000:]}\n--- log\n{log}")
    exports = dict(line.removeprefix("export ").split("=", 1)
                   for line in up.stdout.splitlines() if line.startswith("export "))  # fmt: skip
    st = Stack(data, exports["E2B_API_URL"], exports["E2B_API_KEY"], env)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ.update({"E2B_API_URL": st.api_url, "E2B_SANDBOX_URL": st.api_url,
                       "E2B_API_KEY": st.api_key})  # fmt: skip
    try:
        yield st
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        down = subprocess.run([*AENV, "down", "--data-dir", str(data)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert down.returncode == 0, down.stderr
        leftovers = subprocess.run(["pgrep", "-af", str(data)], capture_output=True, text=True)
        assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"
        from workers.node.net import list_leftovers

        assert list_leftovers(PREFIX) == [], "network namespaces left behind"
