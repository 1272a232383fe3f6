"""E2B's code interpreter, unchanged: `e2b_code_interpreter.Sandbox` (PyPI) and
`@e2b/code-interpreter` (npm) against `code-interpreter-v1` on aenv — the guest's server on
port 49999 reached through aenv's sandbox proxy like any guest port. Few VMs: one sandbox
for the protocol, one for pause/resume and fork."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.models import OutputMessage

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm

NPM = Path(__file__).resolve().parents[2] / ".npm-e2b-ci"


def test_run_code_speaks_e2bs_protocol(stack: Stack) -> None:
    t0 = time.monotonic()
    # the SDK's default template: code-interpreter-v1
    sbx = Sandbox.create(timeout=600, envs={"FROM_CREATE": "sandbox-env"})
    try:
        first = sbx.run_code("x = 1")
        took = time.monotonic() - t0
        assert first.error is None, first.error
        assert sbx.run_code("x + 1").results[0].text == "2"
        # the sandbox's env vars reach the kernels (E2B's server reads envd's /envs)
        assert sbx.run_code("import os; os.environ['FROM_CREATE']").text == "sandbox-env"
        print(f"create + first run_code: {took:.2f}s")

        seen: list[tuple[str, str]] = []

        def out(m: OutputMessage) -> None:
            seen.append(("err" if m.error else "out", m.line))

        e = sbx.run_code(
            "import sys, time\nfor i in range(3):\n    print('o', i, flush=True)\n"
            "    print('e', i, file=sys.stderr, flush=True)\n    time.sleep(0.2)",
            on_stdout=out,
            on_stderr=out,
        )
        assert seen == [
            ("out", "o 0\n"),
            ("err", "e 0\n"),
            ("out", "o 1\n"),
            ("err", "e 1\n"),
            ("out", "o 2\n"),
            ("err", "e 2\n"),
        ]
        assert e.logs.stdout == ["o 0\n", "o 1\n", "o 2\n"]

        e = sbx.run_code(
            "import matplotlib.pyplot as plt\nprint('plotting')\n"
            "plt.bar(['a', 'b'], [3, 5])\nplt.title('fruit')\nplt.show()"
        )
        assert e.logs.stdout == ["plotting\n"]
        png = [r for r in e.results if r.png]
        assert png and png[0].png.startswith("iVBOR")
        assert png[0].chart is not None and png[0].chart.type.value == "bar"
        assert [el.value for el in png[0].chart.elements] == [3.0, 5.0]

        e = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert e.results[0].html and "<table" in e.results[0].html

        e = sbx.run_code("raise KeyError('k')")
        assert e.error is not None and e.error.name == "KeyError" and "'k'" in e.error.value
        assert "KeyError" in e.error.traceback

        ctx = sbx.create_code_context(cwd="/tmp")
        sbx.run_code("secret = 42", context=ctx)
        assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
        assert sbx.run_code("secret").error is not None  # the default context lacks it
        assert ctx.id in {c.id for c in sbx.list_code_contexts()}
        sbx.restart_code_context(ctx)
        assert sbx.run_code("secret", context=ctx).error is not None
        sbx.remove_code_context(ctx)
        assert ctx.id not in {c.id for c in sbx.list_code_contexts()}

        assert sbx.run_code("import os; os.environ['V']", envs={"V": "per-run"}).text == "per-run"

        sbx.run_code("survivor = 'still here'")
        t = time.monotonic()
        with pytest.raises(Exception, match=r"[Tt]imeout|timed out"):
            sbx.run_code("import time\ntime.sleep(120)", timeout=3)
        assert sbx.run_code("survivor").text == "still here"
        assert time.monotonic() - t < 60

        e = sbx.run_code('echo "bash $((6 * 7))"; cd /tmp; pwd', language="bash")
        assert e.logs.stdout == ["bash 42\n", "/tmp\n"], e

        if (NPM / "node_modules" / "@e2b" / "code-interpreter").exists():
            script = (
                "const {Sandbox} = require('@e2b/code-interpreter');"
                "(async () => { const s = await Sandbox.connect(process.argv[1]);"
                " await s.runCode('y = 20');"
                " const r = await s.runCode('y + 1');"
                " const b = await s.runCode('echo js-bash', {language: 'bash'});"
                " console.log(JSON.stringify({text: r.text, bash: b.logs.stdout}));"
                "})().catch(e => {console.error(e); process.exit(1)})"
            )
            env = {**os.environ, **stack.env()}
            r = subprocess.run(
                ["node", "-e", script, sbx.sandbox_id],
                env=env,
                cwd=NPM,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout.strip().splitlines()[-1]) == {
                "text": "21",
                "bash": ["js-bash\n"],
            }
    finally:
        sbx.kill()


def test_a_plain_sandbox_too_pause_keeps_the_kernel_fork_diverges(stack: Stack) -> None:
    a = Sandbox.create(timeout=600)
    b = Sandbox.create(timeout=600)
    kids: list[Sandbox] = []
    try:
        draw = "import random, numpy; (random.random(), float(numpy.random.rand()))"
        assert a.run_code(draw).text != b.run_code(draw).text  # one capture, two seeds
        assert a.commands.run("echo plain").stdout == "plain\n"
        a.files.write("/home/user/data.txt", "from files")
        assert a.run_code("open('/home/user/data.txt').read()").text == "from files"

        a.run_code("kept = [1, 2, 3]")
        a.pause()
        a = Sandbox.connect(a.sandbox_id, timeout=600)  # resumes
        assert a.run_code("sum(kept)").text == "6"

        results = a.fork(count=2, timeout=300)
        kids = [Sandbox.connect(k.sandbox_id) for k in results if not isinstance(k, Exception)]
        assert len(kids) == 2
        kids[0].run_code("kept.append(10)")
        assert kids[0].run_code("sum(kept)").text == "16"
        assert kids[1].run_code("sum(kept)").text == "6"
        assert a.run_code("sum(kept)").text == "6"
        assert kids[0].run_code(draw).text != kids[1].run_code(draw).text
    finally:
        for s in (a, b, *kids):
            s.kill()
