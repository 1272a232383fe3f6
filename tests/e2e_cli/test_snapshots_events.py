"""`aenv snapshot` and `aenv events` against a real stack, on one sandbox (VMs are slow
under TCG): snapshot create/ls/rm, `events --follow` watching live and stopping cleanly on
Ctrl-C, and the fork lineage drawn by `aenv events`."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import AENV
from tests.e2e_cli.conftest import CliStack, run_aenv
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def sandbox_id(cli_stack: CliStack) -> Iterator[str]:
    r = run_aenv("start", "-d", "--timeout", "900", env=cli_stack.env())
    assert r.returncode == 0, r.stderr.decode()
    sid = r.stdout.decode().strip()
    try:
        yield sid
    finally:
        run_aenv("rm", sid, env=cli_stack.env())


class Follower:
    """`aenv events … --follow` in the background; its stdout lines collected as they come."""

    def __init__(self, stack: CliStack, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*AENV, "events", "--follow", "--data-dir", str(stack.data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=stack.bare_env(),
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode())

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in list(self.lines)]

    def saw(self, sandbox: str, type_: str) -> bool:
        return any(e["aggregate_id"] == sandbox and e["type"] == type_ for e in self.events())

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C, as a terminal sends it; returns exit code and stderr."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=15)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _snapshots(stack: CliStack, *args: str) -> list[str]:
    r = run_aenv("snapshot", "ls", *args, env=stack.env())  # piped: JSON
    assert r.returncode == 0, r.stderr.decode()
    return [row["snapshot_id"] for row in json.loads(r.stdout)]


@pytest.mark.timeout(600)
def test_snapshot_create_ls_rm_seen_live_by_events_follow(
    cli_stack: CliStack, sandbox_id: str
) -> None:
    env = cli_stack.env()
    every = Follower(cli_stack, "-o", "json")
    mine = Follower(cli_stack, sandbox_id)  # piped: JSON lines without asking
    name = f"cli-{uuid.uuid4().hex[:8]}"
    try:
        # one sandbox: its history first, at once
        eventually_sync(lambda: mine.saw(sandbox_id, "SandboxCreated"), timeout=20)
        assert mine.events()[0]["type"] == "SandboxRequested"
        # every sandbox, from when it subscribed: poke until it shows it is listening
        eventually_sync(
            lambda: (
                run_aenv("timeout", sandbox_id, "900", env=env).returncode == 0
                and every.saw(sandbox_id, "SandboxTimeoutSet")
            ),
            timeout=30,
        )

        r = run_aenv("snapshot", "create", sandbox_id, "--name", name, env=env, timeout=320)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout.decode().strip() == name
        for f in (every, mine):
            eventually_sync(lambda f=f: f.saw(sandbox_id, "SnapshotTaken"), timeout=10)
        taken = next(e for e in every.events() if e["type"] == "SnapshotTaken")
        assert taken["details"]["snapshot_id"] == name and taken["seq"] > 0

        for f in (every, mine):
            code, err = f.interrupt()
            assert code == 0 and "Traceback" not in err, err
    finally:
        every.kill()
        mine.kill()

    try:
        assert name in _snapshots(cli_stack)
        assert _snapshots(cli_stack, "--sandbox", sandbox_id) == [name]
        assert _snapshots(cli_stack, "--sandbox", "no-such-sandbox") == []
        r = run_aenv("snapshot", "ls", "-o", "table", env=cli_stack.env(COLUMNS="200"))
        header, *rows = r.stdout.decode().splitlines()
        assert header.split() == ["SNAPSHOT", "ID", "NAMES"]
        assert any(row.split()[0] == name and row.split()[1].endswith(f"/{name}") for row in rows)
        # the sandbox ran on through the snapshot
        assert run_aenv("exec", sandbox_id, "--", "true", env=env).returncode == 0
        r = run_aenv("snapshot", "create", sandbox_id, "--name", "Bad Name!", env=env)
        assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr
        r = run_aenv("snapshot", "rm", "base", env=env)  # a template, not a snapshot
        assert r.returncode == 1 and b"no such snapshot" in r.stderr
    finally:
        r = run_aenv("snapshot", "rm", name, env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert name not in _snapshots(cli_stack)
    r = run_aenv("snapshot", "rm", name, env=env)
    assert r.returncode == 1 and r.stderr.decode() == f"aenv: no such snapshot: {name}\n"
    r = run_aenv("snapshot", "create", "no-such-sandbox", env=env)
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1 and b"Traceback" not in r.stderr
    # a paused sandbox cannot be snapshotted: the API's 409 is exit 1, one line
    assert run_aenv("pause", sandbox_id, env=env).returncode == 0
    try:
        r = run_aenv("snapshot", "create", sandbox_id, env=env)
        assert r.returncode == 1 and r.stderr.count(b"\n") == 1, r.stderr
        assert r.stderr.startswith(f"aenv: snapshot create {sandbox_id}: 409".encode()), r.stderr
    finally:
        assert run_aenv("resume", sandbox_id, env=env).returncode == 0


def test_events_draws_the_fork_lineage(cli_stack: CliStack, sandbox_id: str) -> None:
    env = cli_stack.env()
    r = run_aenv("fork", sandbox_id, env=env)
    assert r.returncode == 0, r.stderr.decode()
    child = r.stdout.decode().strip()
    d = ("--data-dir", str(cli_stack.data_dir))
    try:
        r = run_aenv("events", child, "-o", "table", *d, env=cli_stack.bare_env())
        assert r.returncode == 0, r.stderr.decode()
        text = r.stdout.decode()
        history, _, lineage = text.partition("\nFORK LINEAGE\n")
        assert history.splitlines()[0].split()[:3] == ["SEQ", "REV", "WHEN"]
        assert lineage.splitlines() == [
            f"{sandbox_id}  running",
            f"└── {child}  running  <- this sandbox",
        ]
        r = run_aenv("events", sandbox_id, *d, env=cli_stack.bare_env())  # piped: JSON lines
        parsed = [json.loads(ln) for ln in r.stdout.decode().splitlines()]
        forked = [e for e in parsed if e["type"] == "SandboxForked"]
        assert forked and forked[-1]["details"]["children"][0]["sandbox_id"] == child
        assert {e["aggregate_id"] for e in parsed} == {sandbox_id}
        assert "envd_access_token" not in r.stdout.decode()
    finally:
        assert run_aenv("rm", child, env=env).returncode == 0
    r = run_aenv("events", child, "-o", "table", *d, env=cli_stack.bare_env())
    assert f"{child}  killed  <- this sandbox" in r.stdout.decode()
    r = run_aenv("events", "no-such-sandbox", *d, env=cli_stack.bare_env())
    assert r.returncode == 1 and r.stderr.decode().startswith("aenv: no events")
