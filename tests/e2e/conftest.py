"""An aenv stack started the way a user starts it (`aenv up`, embedded NATS/Postgres/S3),
and E2B SDK settings pointing at it. Shared by every e2e test; stopped with `aenv down`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.stack.process import free_port
from tests.registry import LocalRegistry, local_registry
from tests.support import tagged
from tests.vmstack import AENV as AENV  # the CLI, for the tests that drive it
from tests.vmstack import TLS_ENV, add_log_tail, not_json_lines, running_stack

pytestmark = pytest.mark.vm

#: E2B's own SDK tests, vendored unchanged: run by test_e2b_suite.py in a pytest of their own
collect_ignore = ["e2b_suite"]

#: lines of the stack's log a failing test's report carries (QMP chatter left out)
LOG_TAIL = 200


@dataclass(frozen=True)
class Stack:
    data_dir: Path
    api_url: str
    api_key: str
    nats_url: str
    #: a registry on loopback the stack's node pulls Docker Hub names from (its mirror):
    #: `from_python_image("3.12")` is `library/python:3.12` here, pushed by the test
    hub: LocalRegistry
    #: what `aenv up` prints for clients over HTTPS by name: `E2B_DOMAIN`, `SSL_CERT_FILE`
    #: (the system's CAs and the stack's local CA), `NODE_EXTRA_CA_CERTS`
    tls_env: dict[str, str]

    def env(self) -> dict[str, str]:
        return {
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.api_url,
            "E2B_VOLUME_API_URL": self.api_url,
            "E2B_API_KEY": self.api_key,
        }


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing e2e test's report ends with the stack's log around the failure: the stack
    is shared and its data directory is gone with the run, so an intermittent failure in CI
    is otherwise a bare SDK timeout with nothing to go on."""
    outcome = yield
    report = outcome.get_result()
    st = getattr(item, "funcargs", {}).get("stack")
    if report.failed and isinstance(st, Stack):
        add_log_tail(report, st.data_dir, LOG_TAIL)


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("the stack runs microVMs: needs root")
    data = tmp_path_factory.mktemp("aenv-e2e")
    with local_registry(tmp_path_factory.mktemp("hub")) as hub:
        yield from _stack(data, hub)


def _stack(data: Path, hub: LocalRegistry) -> Iterator[Stack]:
    prefix = tagged("aenve")
    env = {
        **os.environ,
        "AENV_SLOT_PREFIX": prefix,
        "AENV_NODE_ID": "e2e",
        "AENV_REGISTRY_MIRRORS": f"docker.io={hub.host}",
        "AENV_TRACE_FILE": str(data / "traces.jsonl"),
        # sandbox traffic takes the multi-host path: API proxy -> node proxy -> guest
        "AENV_PROXY_VIA_NODE": "1",
        # code-interpreter-v1 too (tests/e2e/test_code_interpreter.py): its image is
        # built once per machine (cached by digest), captured once per stack
        "AENV_CODE_INTERPRETER": "1",
        # small, so the pause/resume cycles of the e2e suite exercise chain compaction
        "AENV_MAX_LAYER_DEPTH": "3",
        # the warm pool on, as for users, but its refills after a burst bounded: every
        # warm VM is a restore's worth of CPU on CI's two cores
        "AENV_WARM_POOL_MAX": "4",
        # HTTPS by name on a port of its own (`tests/e2e/test_domain.py`)
        "AENV_TLS_PORT": str(free_port()),
    }
    with running_stack(data, env, prefix) as exports:
        info = json.loads((data / "stack.json").read_text())
        tls = {k: exports[k] for k in TLS_ENV}
        yield Stack(
            data, exports["E2B_API_URL"], exports["E2B_API_KEY"], info["nats_url"], hub, tls
        )
    # the whole suite's life, VMs and all, then the stop: every line a JSON record (issue 20)
    assert not_json_lines(data) == [], not_json_lines(data)[:5]


@pytest.fixture(scope="package")
def n2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data dir of the second node the two-node tests start, one for the package as a
    host keeps its disk: a node's first start readies the `base` template (30 s under TCG),
    a start with the dir in place takes 2 s. Their assertions name their own sandboxes."""
    return tmp_path_factory.mktemp("n2")
