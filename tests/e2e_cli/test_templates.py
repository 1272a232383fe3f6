"""Template builds from the command line, as a user runs them: `aenv build` of a
Dockerfile with COPY/ENV/WORKDIR/USER/RUN, then a sandbox of it through the unchanged e2b
SDK; a failing build's reason and exit code; `aenv pull` and FROM of a local OCI archive;
`aenv template ls|rm`; and every template command's help."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.e2e_cli.conftest import CliStack, run_aenv
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def _names(stack: CliStack) -> dict[str, dict[str, object]]:
    r = run_aenv("template", "ls", env=stack.env())  # piped: JSON
    assert r.returncode == 0, r.stderr.decode()
    return {row["name"]: row for row in json.loads(r.stdout)}


def _sandbox(stack: CliStack, template: str) -> Sandbox:
    return Sandbox.create(
        template,
        api_url=stack.api_url,
        api_key=stack.api_key,
        sandbox_url=stack.api_url,
        timeout=120,
    )


def test_build_with_copy_then_a_sandbox_sees_files_env_workdir(
    cli_stack: CliStack, tmp_path: Path
) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    (tmp_path / "app" / "lib").mkdir(parents=True)
    (tmp_path / "app" / "main.py").write_text("print('app ok')\n")
    (tmp_path / "app" / "lib" / "util.py").write_text("X = 1\n")
    (tmp_path / "settings.ini").write_text("[app]\nmode=prod\n")
    (tmp_path / "Dockerfile").write_text(
        "# a template built by the CLI e2e test\n"
        "FROM base\n"
        "ARG GREETING=hello\n"
        "ENV APP_ENV=production \\\n"
        '    MSG="${GREETING} world"\n'
        "WORKDIR /srv/app\n"
        "COPY app/ ./\n"
        "COPY --chown=user --chmod=640 settings.ini /etc/myapp/\n"
        'RUN echo "arg=$GREETING" > built.txt && python3 main.py >> built.txt\n'
        "RUN <<EOF\necho first > heredoc.txt\necho second >> heredoc.txt\nEOF\n"
        "USER user\n"
        "EXPOSE 8080\n"
    )
    fetch = "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/main.py\").read().decode())'"
    r = run_aenv(
        "build",
        str(tmp_path / "Dockerfile"),
        "--name",
        name,
        "--start-cmd",
        "python3 -m http.server 8000",
        "--ready-cmd",
        fetch,
        env=cli_stack.env(),
        timeout=600,
    )
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout.decode().strip() == name
    for progress in (
        "upload app/",
        "upload settings.ini",
        "[3/8] WORKDIR /srv/app",
        "start command: python3 -m http.server 8000",
        "waiting for: python3",
        "capturing the template snapshot",
        f"template {name} ready",
    ):
        assert progress in err, err
    assert "EXPOSE has no effect" in err

    sbx = _sandbox(cli_stack, name)
    try:
        out = sbx.commands.run("pwd; whoami; echo $APP_ENV/$MSG; cat built.txt lib/util.py")
        assert out.stdout.split("\n")[:6] == [
            "/srv/app",
            "user",
            "production/hello world",
            "arg=hello",
            "app ok",
            "X = 1",
        ]
        assert sbx.commands.run("cat heredoc.txt").stdout == "first\nsecond\n"
        ini = sbx.commands.run(
            "stat -c '%U %a' /etc/myapp/settings.ini; cat /etc/myapp/settings.ini"
        )
        assert ini.stdout == "user 640\n[app]\nmode=prod\n"
        # the start command runs in every sandbox (it was running when the snapshot was taken)
        assert sbx.commands.run(fetch).stdout == "print('app ok')\n\n"
        # the sandbox's own env vars merge over the template's
        own = Sandbox.create(
            name,
            envs={"APP_ENV": "dev"},
            api_url=cli_stack.api_url,
            api_key=cli_stack.api_key,
            sandbox_url=cli_stack.api_url,
        )
        try:
            assert own.commands.run("echo $APP_ENV $MSG").stdout == "dev hello world\n"
        finally:
            own.kill()
    finally:
        sbx.kill()

    assert _names(cli_stack)[name]["status"] == "ready"
    r = run_aenv("template", "rm", name, env=cli_stack.env())
    assert r.returncode == 0, r.stderr.decode()
    assert name not in _names(cli_stack)
    r = run_aenv("start", "-d", name, env=cli_stack.env())
    assert r.returncode != 0


def test_failing_builds_say_why_and_exit_1(cli_stack: CliStack, tmp_path: Path) -> None:
    cases = {
        "run": (
            "FROM base\nRUN echo starting && ls /definitely-missing\n",
            ["failed at step 1", "exit code 2", "definitely-missing"],
        ),
        "nobase": (
            "FROM no-such-template\nRUN true\n",
            ["failed at step base", "base template 'no-such-template' not found"],
        ),
        "instr": (
            "FROM base\nRUN true\nFROBNICATE now\n",
            ["line 3", "unknown instruction: FROBNICATE"],
        ),
        # a registry that is not there (on loopback: tests reach nothing else)
        "registry": (
            "FROM 127.0.0.1:1/nothing/here:1\n",
            ["failed at step base", "127.0.0.1:1/nothing/here:1"],
        ),
        "syntax": ("RUN echo no from\n", ["line 1", "before FROM"]),
    }
    names = {}
    for key, (text, expected) in cases.items():
        df = tmp_path / f"Dockerfile.{key}"
        df.write_text(text)
        names[key] = f"fail-{key}-{uuid.uuid4().hex[:6]}"
        r = run_aenv("build", str(df), "-n", names[key], env=cli_stack.env(), timeout=300)
        err = r.stderr.decode()
        assert r.returncode == 1, (key, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("aenv: "), (key, err)
        for word in expected:
            assert word in last, (key, word, err)
    # a failed first build of a name is listed, with its reason and step; its log is kept
    listed = _names(cli_stack)
    failed = listed[names["run"]]
    assert failed["status"] == "error" and "step 1" in str(failed["failure"]), failed
    logs = run_aenv("template", "logs", names["run"], env=cli_stack.env())
    assert logs.returncode == 1, logs.stderr.decode()
    assert b"starting" in logs.stdout and b"definitely-missing" in logs.stdout, logs.stdout
    assert b"build failed" in logs.stderr


def test_two_builds_run_at_once(cli_stack: CliStack, tmp_path: Path) -> None:
    """A builder runs two builds side by side (AENV_BUILD_PARALLEL, 2): their build
    sandboxes overlap in time."""
    import subprocess

    from tests.e2e_cli.conftest import AENV

    (tmp_path / "Dockerfile").write_text("FROM base\nRUN sleep 4 && echo slept\n")
    names = [f"twin-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    procs = [
        subprocess.Popen(
            [*AENV, "build", str(tmp_path / "Dockerfile"), "-n", n],
            env=cli_stack.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in names
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-500:] for o in outs]
    spans = []
    for n in names:
        r = run_aenv("template", "logs", n, env=cli_stack.env())
        times = [line.split()[0] for line in r.stdout.decode().splitlines() if line.strip()]
        spans.append((min(times), max(times)))
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, spans  # neither ended before the other began
    for n in names:
        assert run_aenv("template", "rm", n, env=cli_stack.env()).returncode == 0


def test_pull_and_build_from_a_local_oci_archive(cli_stack: CliStack, tmp_path: Path) -> None:
    from workers.node.image import base_rootfs_tree
    from workers.node.image.oci_write import write_archive, write_layout_from_dir

    layout = tmp_path / "layout"
    write_layout_from_dir(base_rootfs_tree(), layout)
    archive = tmp_path / "bookworm.tar"
    write_archive(layout, archive)

    r = run_aenv("pull", "127.0.0.1:1/nothing/here:1", env=cli_stack.env(), timeout=300)
    assert r.returncode == 1 and b"127.0.0.1:1/nothing/here:1" in r.stderr, r.stderr

    pulled = f"oci-{uuid.uuid4().hex[:6]}"
    r = run_aenv("pull", str(archive), "--name", pulled, env=cli_stack.env(), timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().strip() == pulled

    (tmp_path / "note.txt").write_text("from the context\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM ./bookworm.tar\nENV FROM_OCI=yes\nCOPY note.txt /opt/\n"
        "RUN cat /etc/debian_version > /opt/debian_version\n"
    )
    built = f"ocib-{uuid.uuid4().hex[:6]}"
    r = run_aenv(
        "build", str(tmp_path / "Dockerfile"), "-n", built, env=cli_stack.env(), timeout=900
    )
    assert r.returncode == 0, r.stderr.decode()
    for template, expect in ((pulled, "\n"), (built, "yes\nfrom the context\n")):
        sbx = _sandbox(cli_stack, template)
        try:
            out = sbx.commands.run("echo $FROM_OCI; cat /opt/note.txt 2>/dev/null; true")
            assert out.stdout == expect, template
            assert sbx.commands.run("cat /etc/debian_version").stdout.startswith("12")
        finally:
            sbx.kill()
    for t in (pulled, built):
        assert run_aenv("template", "rm", t, env=cli_stack.env()).returncode == 0
    records = cli_stack.data_dir / "node" / "snapshot-templates"
    eventually_sync(lambda: not any(records.glob(f"{pulled}*")), timeout=10)  # node freed it


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["build", "--help"],
        ["pull", "--help"],
        ["template", "--help"],
        ["template", "ls", "--help"],
        ["template", "rm", "--help"],
    ],
)
def test_help_completes(cli_stack: CliStack, argv: list[str]) -> None:
    r = run_aenv(*argv, env=cli_stack.env(), timeout=30)
    assert r.returncode == 0 and b"Usage" in r.stdout, r.stderr.decode()


def test_an_image_with_no_libc_no_python_and_no_bash_is_a_sandbox(
    cli_stack: CliStack, tmp_path: Path
) -> None:
    """A busybox-only image (static busybox, nothing else): envd runs on its own runtime,
    `commands.run` (the SDK asks for /bin/bash) runs in the image's sh, files and background
    processes work as on Debian."""
    from tests.registry import busybox_tree, layout

    image = layout(tmp_path / "layout", busybox_tree(tmp_path / "tree", "ps"))
    name = f"busybox-{uuid.uuid4().hex[:6]}"
    r = run_aenv("pull", str(image), "--name", name, env=cli_stack.env(), timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    sbx = _sandbox(cli_stack, name)
    try:
        out = sbx.commands.run("echo hi from $(uname -s); id -un")
        assert out.stdout == "hi from Linux\nuser\n", out.stdout
        sbx.files.write("/home/user/note.txt", "written through envd")
        assert sbx.commands.run("cat /home/user/note.txt").stdout == "written through envd"
        assert [e.name for e in sbx.files.list("/home/user")] == ["note.txt"]
        bg = sbx.commands.run("sleep 600", background=True)
        assert bg.pid in [p.pid for p in sbx.commands.list()]
        assert sbx.commands.kill(bg.pid)
    finally:
        sbx.kill()
    assert run_aenv("template", "rm", name, env=cli_stack.env()).returncode == 0
