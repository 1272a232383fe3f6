"""A stack of its own for the crash matrix (`aenv up`, embedded NATS/Postgres/S3, real
microVMs), apart from the e2e suite's: its own data dir, slot prefix and node id, so its
faults never touch another stack. Size: `AENV_RELIABILITY_N` sandboxes per scenario (CI runs
the default, a reduced size; `AENV_RELIABILITY_N=8 pytest tests/reliability` for more)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack.process import free_port
from tests.support import tagged
from tests.vmstack import AENV, add_log_tail, running_stack

pytestmark = pytest.mark.vm

PREFIX = tagged("aenvr")
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
        return subprocess.run(
            [*AENV, *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    st = getattr(item, "funcargs", {}).get("rstack")
    if report.failed and isinstance(st, Stack):
        add_log_tail(report, st.data_dir, 300)


@pytest.fixture(scope="package")
def rstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs: needs root")
    data = tmp_path_factory.mktemp("aenv-reliability")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": PREFIX,
        "AENV_NODE_ID": "rel",
        "AENV_PROXY_VIA_NODE": "1",
        "AENV_TLS_PORT": str(free_port()),  # kept for the `aenv up` again of a test
    }
    with running_stack(data, env, PREFIX) as exports:
        yield Stack(data, exports["E2B_API_URL"], exports["E2B_API_KEY"], env)
