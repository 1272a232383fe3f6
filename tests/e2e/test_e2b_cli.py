"""E2B's own CLI (npm `@e2b/cli`, unchanged) against aenv: `e2b template create` builds a
Dockerfile FROM an image in a registry on loopback, with RUN, COPY and ENV; the template
then starts sandboxes through the Python SDK.

Not a heredoc here: the CLI's own Dockerfile parser (`dockerfile-ast`, joined by
`handleRunInstruction`) sends `RUN <<EOF ...` flattened to one line, newlines lost, so no
server can run it as written (E2B's included). `aenv build` reads heredocs whole
(`tests/e2e_cli/test_templates.py`)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.e2e.conftest import Stack
from tests.registry import busybox_tree, layout, local_registry, push

pytestmark = pytest.mark.vm

CLI = Path(__file__).resolve().parents[2] / ".npm-e2b" / "node_modules" / ".bin" / "e2b"


def test_e2b_template_create_builds_a_dockerfile(stack: Stack, tmp_path: Path) -> None:
    if not CLI.exists():
        pytest.skip("npm's @e2b/cli is not installed (scripts/setup.sh installs it with npm)")
    name = f"cli-{uuid.uuid4().hex[:8]}"
    with local_registry(tmp_path / "registry") as registry:
        ref = push(layout(tmp_path / "img", busybox_tree(tmp_path / "tree", "mkdir")),
                   registry, "tests/cli-base", "1")  # fmt: skip
        ctx = tmp_path / "ctx"
        ctx.mkdir()
        (ctx / "hello.txt").write_text("copied by the E2B CLI\n")
        (ctx / "Dockerfile").write_text(
            f"FROM {ref}\n"
            "ENV FROM_CLI=yes\n"
            "COPY hello.txt /opt/\n"
            "RUN mkdir -p /opt/made && echo by run > /opt/made/note\n"
        )
        env = {**os.environ, **stack.env(), "NO_COLOR": "1"}
        out = subprocess.run([str(CLI), "template", "create", name, "-p", str(ctx),
                              "-d", "Dockerfile"], env=env, capture_output=True, text=True,
                             timeout=900)  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sbx = Sandbox.create(name)
    try:
        got = sbx.commands.run("echo $FROM_CLI; cat /opt/hello.txt /opt/made/note").stdout
        assert got == "yes\ncopied by the E2B CLI\nby run\n"
    finally:
        sbx.kill()
    Sandbox.delete_snapshot(name)
