"""The e2b SDK's own template API against aenv: `Template.build()` from `base` with COPY
(through the SDK's file-upload flow), ENV, RUN and WORKDIR, `Template.exists()`, then
`Sandbox.create(<name>)`; a failing step surfaces as the SDK's BuildException."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2b import BuildException, Sandbox, Template

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.vm


def test_sdk_template_build_then_sandbox(stack: Stack, tmp_path: Path) -> None:
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello.txt").write_text("hello from the SDK\n")
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template("base")
        .copy("data/hello.txt", "/opt/app/")
        .set_envs({"GREETING": "from-template"})
        .run_cmd("echo built > /opt/app/built.txt && cat /opt/app/hello.txt")
        .set_workdir("/opt/app")
    )
    logs: list[str] = []
    assert not Template.exists(name)
    info = Template.build(template, name, on_build_logs=lambda e: logs.append(e.message))
    assert info.template_id == name
    assert "hello from the SDK" in logs, logs  # the RUN step's output, streamed back
    assert Template.exists(name)

    sbx = Sandbox.create(name)
    try:
        out = sbx.commands.run("pwd; echo $GREETING; cat hello.txt built.txt; whoami").stdout
        assert out == "/opt/app\nfrom-template\nhello from the SDK\nbuilt\nuser\n"
        assert sbx.get_info().template_id == name
    finally:
        sbx.kill()

    failing = Template().from_template("base").run_cmd("echo nope >&2; exit 4")
    with pytest.raises(BuildException, match="exit code 4"):
        Template.build(failing, f"{name}-bad")
    assert Sandbox.delete_snapshot(name) is True  # DELETE /templates/{id}
    assert not Template.exists(name)
