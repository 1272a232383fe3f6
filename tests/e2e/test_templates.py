"""The e2b SDK's own template API against aenv: `Template.build()` from `base` with COPY
(through the SDK's file-upload flow), ENV, RUN and WORKDIR, `Template.exists()`, then
`Sandbox.create(<name>)`; a failing step surfaces as the SDK's BuildException. From Docker
Hub names (`from_python_image`, `from_debian_image`, `from_node_image`, through the stack's
hub mirror on loopback): USER, a start command with its ready check, `build_in_background`
with `get_build_status`, and `skip_cache` taking a re-pushed tag that a plain build does
not."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from e2b import BuildException, BuildInfo, Sandbox, Template, TemplateBuildStatusResponse
from e2b.template.readycmd import wait_for_file

from tests.e2e.conftest import Stack
from tests.registry import debian_tree, layout, push

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


START = "bash -c 'echo $STARTED_BY > /home/app/started; exec sleep infinity'"


def _hub_image(stack: Stack, tmp: Path, repository: str, tag: str, marker: str) -> None:
    """A small Debian-layout image (bash, coreutils, a user `app`) as a Docker Hub name."""
    tree = debian_tree(tmp / "tree", "bash", "cat", "id", "sleep", "ls", "mkdir")
    (tree / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\napp:x:1001:1001::/home/app:/bin/bash\n"
    )
    (tree / "etc/group").write_text("root:x:0:\napp:x:1001:\n")
    (tree / "home/app").mkdir()
    os.chown(tree / "home/app", 1001, 1001)
    (tree / "etc/marker").write_text(marker + "\n")
    push(layout(tmp / "layout", tree), stack.hub, repository, tag)


def _watched(info: BuildInfo) -> tuple[TemplateBuildStatusResponse, list[str]]:
    """A background build's last status and its log, polled as a client does."""
    seen: list[str] = []
    deadline = time.monotonic() + 600
    while True:
        status = Template.get_build_status(info, logs_offset=len(seen))
        seen += [e.message for e in status.log_entries]
        if str(status.status.value) in ("ready", "error") or time.monotonic() > deadline:
            return status, seen
        time.sleep(0.5)


def test_templates_from_docker_hub_names(stack: Stack, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]  # tags of our own: the hub registry lives as long as the stack
    _hub_image(stack, tmp_path / "py1", "library/python", tag, "python, first push")
    name = f"hub-{tag}"
    logs: list[str] = []
    template = (
        Template()
        .from_python_image(tag)
        .set_envs({"STARTED_BY": "start-cmd"})
        .set_user("app")
        .run_cmd("id -un > /home/app/built-by")
        .set_workdir("/home/app")
        .set_start_cmd(START, wait_for_file("/home/app/started"))
    )
    Template.build(template, name, on_build_logs=lambda e: logs.append(e.message))
    mirror = f"pull docker.io/library/python:{tag}: from the mirror {stack.hub.host}"
    assert any(mirror in m for m in logs), logs
    sbx = Sandbox.create(name)
    try:
        out = sbx.commands.run("pwd; id -un; cat built-by started /etc/marker").stdout
        assert out == "/home/app\napp\napp\nstart-cmd\npython, first push\n"
        running = [" ".join([p.cmd, *p.args]) for p in sbx.commands.list()]
        assert any("sleep infinity" in c for c in running), running  # kept by the snapshot
    finally:
        sbx.kill()

    # the tag moves on: a plain build keeps the image it pulled, skip_cache takes the new one;
    # from_debian_image/from_node_image build in the background meanwhile (each build is a
    # pull and a VM's boot: beside the skip_cache build they take ~half the time they take
    # one after the other on TCG's two cores), watched through get_build_status
    _hub_image(stack, tmp_path / "py2", "library/python", tag, "python, second push")
    _hub_image(stack, tmp_path / "deb", "library/debian", tag, "debian")
    _hub_image(stack, tmp_path / "node", "library/node", tag, "node")
    again = Template().from_python_image(tag).run_cmd("cat /etc/marker")
    Template.build(again, f"{name}-cached")  # before anything pulls the moved tag
    background = {
        kind: Template.build_in_background(
            getattr(Template(), f"from_{kind}_image")(tag).run_cmd("echo built-in-background"),
            f"{name}-{kind}",
        )
        for kind in ("debian", "node")
    }
    Template.build(again, f"{name}-fresh", skip_cache=True)
    for which, marker in (("cached", "first"), ("fresh", "second")):
        sbx = Sandbox.create(f"{name}-{which}")
        try:
            assert sbx.commands.run("cat /etc/marker").stdout == f"python, {marker} push\n"
        finally:
            sbx.kill()

    for kind, info in background.items():
        status, seen = _watched(info)
        assert str(status.status.value) == "ready", (status, seen)
        assert any("built-in-background" in m for m in seen), seen
        sbx = Sandbox.create(f"{name}-{kind}")
        try:
            assert sbx.commands.run("cat /etc/marker").stdout == f"{kind}\n"
        finally:
            sbx.kill()
    for suffix in ("", "-cached", "-fresh", "-debian", "-node"):
        assert Sandbox.delete_snapshot(f"{name}{suffix}")


def test_aws_and_gcp_registry_logins_are_refused_with_the_reason(stack: Stack) -> None:
    """E2B's ECR and GCR login types are not supported: the build start answers 400 saying
    what works instead, before anything is pulled (and no packet leaves for AWS or GCP)."""
    name = f"cloud-{uuid.uuid4().hex[:8]}"
    ecr = "123.dkr.ecr.eu-west-1.amazonaws.com/x:1"
    aws = Template().from_aws_registry(ecr, "AKIA", "secret", "eu-west-1")
    gcp = Template().from_gcp_registry("europe-docker.pkg.dev/p/r/x:1", {"type": "service_account"})
    for template, kind in ((aws, "aws"), (gcp, "gcp")):
        with pytest.raises(Exception, match=f"registry type '{kind}' is not supported") as e:
            Template.build(template, name)
        assert "Internal" not in str(e.value)
    assert not Template.exists(name)
