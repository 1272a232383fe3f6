"""E2B's own clients build Dockerfiles against aenv: the CLI (npm `@e2b/cli`, unchanged)
with `e2b template create`, and the Python SDK with `Template().from_dockerfile`, each FROM
an image in a registry on loopback, with RUN, COPY and ENV; the templates then start
sandboxes through the Python SDK.

The heredoc (`RUN <<EOF`) goes through the Python SDK only: the CLI's Dockerfile parser
(`dockerfile-ast`, joined by `handleRunInstruction`) sends it flattened to one line,
newlines lost, so no server can run it as written (E2B's included). The Python SDK (on
`e2b-dockerfile-utils`) sends the body whole, as `aenv build` reads it
(`tests/e2e_cli/test_templates.py`)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox, Template

from tests.e2e.conftest import Stack
from tests.registry import busybox_tree, layout, push

pytestmark = pytest.mark.vm

CLI = Path(__file__).resolve().parents[2] / ".npm-e2b" / "node_modules" / ".bin" / "e2b"


def _base_and_context(stack: Stack, tmp_path: Path, copied: str) -> tuple[str, Path]:
    """A busybox image on the stack's loopback registry, and a build context to COPY from."""
    tree = busybox_tree(tmp_path / "tree", "mkdir")
    ref = push(layout(tmp_path / "img", tree), stack.hub, f"tests/{tmp_path.name}", "1")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text(copied)
    return ref, ctx


def _sandbox_says(name: str, command: str) -> str:
    sbx = Sandbox.create(name)
    try:
        return sbx.commands.run(command).stdout
    finally:
        sbx.kill()
        Sandbox.delete_snapshot(name)


def test_e2b_template_create_builds_a_dockerfile(stack: Stack, tmp_path: Path) -> None:
    if not CLI.exists():
        pytest.skip("npm's @e2b/cli is not installed (scripts/setup.sh installs it with npm)")
    name = f"cli-{uuid.uuid4().hex[:8]}"
    ref, ctx = _base_and_context(stack, tmp_path, "copied by the E2B CLI\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {ref}\n"
        "ENV FROM_CLI=yes\n"
        "COPY hello.txt /opt/\n"
        "RUN mkdir -p /opt/made && echo by run > /opt/made/note\n"
    )
    env = {**os.environ, **stack.env(), "NO_COLOR": "1"}
    out = subprocess.run(
        [str(CLI), "template", "create", name, "-p", str(ctx), "-d", "Dockerfile"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = _sandbox_says(name, "echo $FROM_CLI; cat /opt/hello.txt /opt/made/note")
    assert got == "yes\ncopied by the E2B CLI\nby run\n"


def test_the_python_sdk_builds_a_dockerfile_with_a_heredoc(stack: Stack, tmp_path: Path) -> None:
    name = f"sdk-df-{uuid.uuid4().hex[:8]}"
    ref, ctx = _base_and_context(stack, tmp_path, "copied by the SDK\n")
    dockerfile = (
        f"FROM {ref}\n"
        "ENV FROM_SDK=yes\n"
        "COPY hello.txt /opt/\n"
        "RUN <<EOF\n"
        "echo first > /opt/heredoc.txt\n"
        "echo second >> /opt/heredoc.txt\n"
        "EOF\n"
    )
    Template.build(Template(file_context_path=str(ctx)).from_dockerfile(dockerfile), name)
    got = _sandbox_says(name, "echo $FROM_SDK; cat /opt/hello.txt /opt/heredoc.txt")
    assert got == "yes\ncopied by the SDK\nfirst\nsecond\n"
