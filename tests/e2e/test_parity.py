"""Where aenv behaved unlike E2B, each reproduced with the SDK calls that showed it (issue
18), now answered the way E2B's own SDK behaviour says it should be."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import SandboxNotRunningException, TimeoutException

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def test_started_after_is_an_inclusive_bound(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=120, metadata={"parity": "started-after"})
    try:
        info = sbx.get_info()
        found = Sandbox.list(
            query=SandboxQuery(started_after=info.started_at, metadata={"parity": "started-after"})
        )
        assert [s.sandbox_id for s in found.next_items()] == [sbx.sandbox_id]
    finally:
        sbx.kill()


def test_a_command_of_a_killed_sandbox_ends_as_e2bs_does(stack: Stack) -> None:
    """`h.wait()` after `kill()`: E2B's SDK sees the connection drop, asks the sandbox's
    health and raises its timeout error saying the sandbox was killed — not "Command ended
    without an end event"."""
    sbx = Sandbox.create(timeout=120)
    h = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(TimeoutException) as caught:
        h.wait()
    assert isinstance(caught.value, SandboxNotRunningException), repr(caught.value)
    assert "killed" in str(caught.value)


def test_a_file_written_again_loses_its_old_metadata(stack: Stack) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/f", "a", metadata={"k": "v"})
        assert sbx.files.get_info("/home/user/f").metadata == {"k": "v"}
        sbx.files.write("/home/user/f", "b")
        assert not sbx.files.get_info("/home/user/f").metadata
        sbx.files.write("/home/user/f", "c", metadata={"other": "1"})
        assert sbx.files.get_info("/home/user/f").metadata == {"other": "1"}
    finally:
        sbx.kill()


@pytest.mark.parametrize("on_timeout", ["pause", "kill"])
def test_a_timeout_of_zero_acts_at_once(stack: Stack, on_timeout: str) -> None:
    sbx = Sandbox.create(timeout=120, lifecycle={"on_timeout": on_timeout})  # type: ignore[arg-type]
    sbx.set_timeout(0)
    client = httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": stack.api_key})
    r = client.get(f"/sandboxes/{sbx.sandbox_id}")
    if on_timeout == "pause":
        assert r.status_code == 200 and r.json()["state"] == "paused", r.text
        Sandbox.connect(sbx.sandbox_id).kill()
    else:
        assert r.status_code == 404, r.text


def test_a_snapshot_is_usable_the_moment_its_creation_answers(stack: Stack) -> None:
    parent = Sandbox.create(timeout=300)
    made: list[str] = []
    try:
        parent.files.write("/home/user/note", "from the parent")
        for _ in range(3):
            snap = parent.create_snapshot()
            made.append(snap.snapshot_id)
            child = Sandbox.create(snap.snapshot_id, timeout=60)  # at once: no 404
            try:
                assert child.files.read("/home/user/note") == "from the parent"
            finally:
                child.kill()
    finally:
        parent.kill()
        for sid in made:
            Sandbox.delete_snapshot(sid)


def test_fork_children_live_as_long_as_their_parent_was_asked_to(stack: Stack) -> None:
    parent = Sandbox.create(timeout=600)
    kids: list[Sandbox] = []
    try:
        kids = [k for k in parent.fork(count=1) if isinstance(k, Sandbox)]
        assert len(kids) == 1
        info = kids[0].get_info()
        left = (info.end_at - info.started_at).total_seconds()
        assert 590 <= left <= 610, left
        time.sleep(1)
        assert kids[0].is_running()
    finally:
        for k in kids:
            k.kill()
        parent.kill()
        eventually_sync(lambda: not parent.is_running(), timeout=30)


def _all_succeed(sbx: Sandbox, commands: tuple[str, ...]) -> None:
    for cmd in commands:
        # quiet for a long while on a loaded TCG host (venv's ensurepip, npm): the SDK's
        # 60 s read timeout would end the stream before the command (seen at load 9)
        r = sbx.commands.run(cmd, timeout=300, request_timeout=300)
        assert r.exit_code == 0, (cmd, r.stderr)


def test_the_base_template_carries_what_e2bs_does(stack: Stack) -> None:
    """git (the SDK's `sbx.git` helpers), curl, a `python` command, pip and venv, Node.js
    and npm — E2B's base image has them, and agents' code assumes them. Two sandboxes of
    the template: venv's ensurepip (~27 s of a TCG vCPU) runs in one while the rest runs in
    the other, on the host's other core."""
    sbx = Sandbox.create(timeout=300)
    other = Sandbox.create(timeout=300)
    try:
        with ThreadPoolExecutor(1) as ex:
            venv = ex.submit(_all_succeed, other, ("python3 -m venv /tmp/v",))
            _all_succeed(
                sbx,
                (
                    "python -c 1",
                    "python3 -m pip --version",
                    "node -e 'process.exit(0)'",
                    "npm --version",
                    "curl --version",
                    "git --version",
                ),
            )
            repo = "/home/user/repo"
            sbx.git.init(repo, initial_branch="main")
            sbx.files.write(f"{repo}/a.txt", "one")
            sbx.git.add(repo, all=True)
            sbx.git.commit(repo, "first", author_name="agent", author_email="agent@example.com")
            status = sbx.git.status(repo)
            assert status.current_branch == "main" and status.is_clean
            sbx.git.create_branch(repo, "feature")
            assert "feature" in sbx.git.branches(repo).branches
            sbx.git.clone(repo, "/home/user/clone")
            assert sbx.files.read("/home/user/clone/a.txt") == "one"
            venv.result()
    finally:
        sbx.kill()
        other.kill()


def _boot_id(sbx: Sandbox) -> str:
    return sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()


def test_a_filesystem_only_pause_keeps_the_disk_and_boots_again(stack: Stack) -> None:
    """`sbx.pause(keep_memory=False)`, the issue's call (`mode="filesystem"` is the same
    `memory: false` to the API): E2B keeps the files and cold-boots on resume — a new boot
    id, no process of before."""
    sbx = Sandbox.create(timeout=300)
    try:
        before = _boot_id(sbx)
        sbx.files.write("/home/user/kept.txt", "written before the pause")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause(keep_memory=False)
        back = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert back.files.read("/home/user/kept.txt") == "written before the pause"
        assert _boot_id(back) != before
        assert "sleep 600" not in back.commands.run("ps ax -o args").stdout
        # and it pauses with its memory again, resumes with the same boot
        back.files.write("/home/user/second.txt", "2")
        back.pause()
        again = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert _boot_id(again) == _boot_id(back)
        assert again.files.read("/home/user/second.txt") == "2"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_timeout_pause_without_memory(stack: Stack) -> None:
    """`lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}`, the issue's
    call (`"mode": "filesystem"` sends the same `autoPauseMemory: false`): the timeout's
    pause is a filesystem-only one."""
    fs_pause = {"on_timeout": {"action": "pause", "keep_memory": False}}
    sbx = Sandbox.create(timeout=300, lifecycle=fs_pause)  # type: ignore[arg-type]
    try:
        before = _boot_id(sbx)
        sbx.files.write("/home/user/kept.txt", "x")
        sbx.set_timeout(0)  # the timeout's action, now
        back = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert back.files.read("/home/user/kept.txt") == "x"
        assert _boot_id(back) != before
    finally:
        Sandbox.kill(sbx.sandbox_id)
