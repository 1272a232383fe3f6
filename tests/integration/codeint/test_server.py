"""The guest's code-interpreter server on the host: a real `python -m codeint` with real
IPython kernels and bash, spoken to over HTTP the way the SDK does, its stream read back by
E2B's own parser. (The same server in a microVM, through the SDK itself: tests/e2e.)

Run in a UTS namespace of its own, so the test can rename the "sandbox" (envd's /init sets
the hostname to the sandbox id after a restore) and see the kernel reseed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b_code_interpreter.models import Context, Execution, OutputMessage, parse_output

from tests.integration.envd.conftest import Envd, init_envd, start_envd, stop_envd

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare (a UTS namespace)",
)


class Guest:
    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid

    def run(self, code: str, timeout: float = 60, **body: object) -> Execution:
        execution = Execution()
        with httpx.stream(
            "POST",
            f"{self.url}/execute",
            json={"code": code, **body},
            timeout=httpx.Timeout(timeout, connect=5),
        ) as r:
            if r.status_code != 200:
                r.read()
                raise AssertionError(f"{r.status_code} {r.text}")
            for line in r.iter_lines():
                parse_output(execution, line)
        return execution

    def rename(self, name: str) -> None:
        subprocess.run(["nsenter", "-t", str(self.pid), "-u", "hostname", name], check=True)


@pytest.fixture(scope="module")
def envd() -> Iterator[Envd]:
    """The guest's envd, initialised as a create does: a token and the sandbox's env vars."""
    e = start_envd()
    init_envd(e, "tok", envVars={"SANDBOX_VAR": "from-create", "BOTH": "sandbox"})
    yield e
    stop_envd(e)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory, envd: Envd) -> Iterator[Guest]:
    tmp = tmp_path_factory.mktemp("codeint")
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [
            "unshare",
            "--uts",
            sys.executable,
            "-m",
            "codeint",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--rundir",
            str(tmp / "run"),
            "--cwd",
            str(tmp),
            "--envd",
            f"127.0.0.1:{envd.port}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # blocks until the warmed kernel answers
        m = re.match(r"CODEINT-READY (\d+)", ready)
        assert m, ready + (tmp / "server.log").read_text()
        yield Guest(f"http://127.0.0.1:{m.group(1)}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_state_persists_and_the_main_result_is_text(guest: Guest) -> None:
    guest.run("x = 1")
    e = guest.run("x + 1")
    assert e.results[0].text == "2" and e.text == "2" and e.error is None
    assert e.execution_count is not None and e.execution_count >= 2


def test_streams_in_order_with_results(guest: Guest) -> None:
    e = guest.run(
        "import sys\nfor i in range(3):\n    print('out', i, flush=True)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n'done'"
    )
    assert "".join(e.logs.stdout) == "out 0\nout 1\nout 2\n"
    assert "".join(e.logs.stderr) == "err 0\nerr 1\nerr 2\n"
    assert e.text == "done"


def test_a_figure_is_a_png_with_its_chart_and_a_dataframe_html(guest: Guest) -> None:
    e = guest.run(
        "import matplotlib.pyplot as plt\nprint('plotting')\n"
        "plt.plot([1, 2, 3], [2, 4, 8])\nplt.title('T')\nplt.show()"
    )
    assert e.logs.stdout == ["plotting\n"]
    png = [r for r in e.results if r.png]
    assert png and png[0].png.startswith("iVBOR")  # base64 of the PNG signature
    assert png[0].chart is not None and png[0].chart.type.value == "line"
    assert png[0].chart.title == "T"
    e = guest.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert e.results[0].html and "<table" in e.results[0].html
    assert e.results[0].data == {"a": [1, 2], "b": ["x", "y"]}


def test_an_exception_is_an_error(guest: Guest) -> None:
    e = guest.run("def f():\n    raise ValueError('bad value')\nf()")
    assert e.error is not None
    assert (e.error.name, e.error.value) == ("ValueError", "bad value")
    assert "f()" in e.error.traceback and "ValueError" in e.error.traceback
    assert guest.run("1").text == "1"  # the context goes on


def test_the_sandboxs_env_vars_reach_every_execution_under_the_requests(
    guest: Guest, envd: Envd
) -> None:
    """`Sandbox.create(envs=...)` reaches the kernels (read from envd's /envs, as E2B's
    server reads it); a request's `env_vars` win; a new sandbox (a renamed host: envd's
    /init names it after each) reads its own."""
    assert guest.run("import os; os.environ.get('SANDBOX_VAR')").text == "from-create"
    e = guest.run("import os; os.environ['BOTH']", env_vars={"BOTH": "request"})
    assert e.text == "request"
    e = guest.run('echo "$SANDBOX_VAR"', language="bash")
    assert e.logs.stdout == ["from-create\n"]
    init_envd(envd, "tok", envVars={"SANDBOX_VAR": "next-sandbox"})
    assert guest.run("import os; os.environ.get('SANDBOX_VAR')").text == "from-create"
    guest.rename("next-sandbox-id")
    assert guest.run("import os; os.environ.get('SANDBOX_VAR')").text == "next-sandbox"


def test_env_vars_hold_for_one_execution(guest: Guest) -> None:
    e = guest.run("import os; os.environ['AENV_T']", env_vars={"AENV_T": "v1"})
    assert e.text == "v1"
    assert guest.run("import os; os.environ.get('AENV_T', 'gone')").text == "gone"
    e = guest.run('echo "$AENV_T"', language="bash", env_vars={"AENV_T": "it's"})
    assert e.logs.stdout == ["it's\n"]
    assert guest.run('echo "${AENV_T-gone}"', language="bash").logs.stdout == ["gone\n"]


def test_contexts_are_isolated_listed_restarted_removed(guest: Guest, tmp_path: Path) -> None:
    r = httpx.post(
        f"{guest.url}/contexts", json={"language": "python", "cwd": str(tmp_path)}, timeout=120
    )
    assert r.status_code == 200, r.text
    ctx = Context.from_json(r.json())
    assert ctx.language == "python" and ctx.cwd == str(tmp_path)
    guest.run("only_here = 5", context_id=ctx.id)
    assert guest.run("import os; os.getcwd()", context_id=ctx.id).text == str(tmp_path)
    e = guest.run("only_here")
    assert e.error is not None and e.error.name == "NameError"  # not in the default context
    listed = [Context.from_json(c) for c in httpx.get(f"{guest.url}/contexts").json()]
    assert ctx.id in {c.id for c in listed}
    assert {"python", "bash"} <= {c.language for c in listed}
    assert httpx.post(f"{guest.url}/contexts/{ctx.id}/restart", timeout=120).status_code == 204
    assert guest.run("only_here", context_id=ctx.id).error is not None  # state gone
    assert httpx.delete(f"{guest.url}/contexts/{ctx.id}").status_code == 204
    assert ctx.id not in {c["id"] for c in httpx.get(f"{guest.url}/contexts").json()}
    r = httpx.post(f"{guest.url}/execute", json={"code": "1", "context_id": ctx.id})
    assert r.status_code == 404 and ctx.id in r.text


def test_bad_requests_are_4xx(guest: Guest) -> None:
    r = httpx.post(f"{guest.url}/execute", json={"code": "1", "language": "cobol"})
    assert r.status_code == 400
    r = httpx.post(
        f"{guest.url}/execute", json={"code": "1", "language": "python", "context_id": "x"}
    )
    assert r.status_code == 400
    r = httpx.post(f"{guest.url}/contexts", json={"cwd": "/no/such/dir"})
    assert r.status_code == 400
    assert httpx.post(f"{guest.url}/execute", content=b"{").status_code == 400


def test_a_client_that_gives_up_interrupts_and_the_context_stays_usable(guest: Guest) -> None:
    guest.run("kept = 'yes'")
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        guest.run("import time\ntime.sleep(60)", timeout=2)
    e = guest.run("kept")
    assert e.text == "yes" and time.monotonic() - t0 < 20
    with pytest.raises(httpx.ReadTimeout):
        guest.run("sleep 60", timeout=2, language="bash")
    assert guest.run("echo alive", language="bash").logs.stdout == ["alive\n"]


def test_bash_keeps_its_state_and_reports_a_failure(guest: Guest) -> None:
    guest.run("cd /tmp && V=42", language="bash")
    out: list[OutputMessage] = []
    e = Execution()
    with httpx.stream(
        "POST",
        f"{guest.url}/execute",
        timeout=30,
        json={"code": "echo $V $PWD; ls /no-such-path", "language": "bash"},
    ) as r:
        for line in r.iter_lines():
            parse_output(e, line, on_stdout=out.append, on_stderr=out.append)
    assert e.logs.stdout == ["42 /tmp\n"] and e.logs.stderr
    assert e.error is not None and e.error.value == "2"
    assert [m.error for m in out] == [False, True]


def test_a_restore_under_another_name_reseeds_and_a_resume_does_not(guest: Guest) -> None:
    draw = "import random, numpy; (random.random(), float(numpy.random.rand()))"
    guest.run("import random, numpy; random.seed(7); numpy.random.seed(7)")
    seeded = guest.run(draw).text
    guest.run("random.seed(7); numpy.random.seed(7)")
    assert guest.run(draw).text == seeded  # same sandbox (a resume): the sequence goes on
    guest.run("random.seed(7); numpy.random.seed(7)")
    guest.rename(f"sbx{os.getpid()}")  # what envd's /init does in a new sandbox
    assert guest.run(draw).text != seeded
