"""Supervision under fault injection: real role processes SIGKILLed, a port taken away,
the supervisor itself SIGKILLed — what keeps running, what comes back, and how soon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from aenv.stack.process import free_port
from bus import Bus, BusSettings
from tests.vmless.conftest import AENV, VmlessStack, vmless_stack


def eventually(
    check: Callable[[], object],
    timeout: float,
    what: str,
    detail: Callable[[], object] = lambda: "",
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout}s: {what} {detail()}"
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def info(stack: VmlessStack) -> dict[str, object]:
    return json.loads((stack.data_dir / "stack.json").read_text())  # type: ignore[no-any-return]


def role_pid(stack: VmlessStack, role: str) -> int:
    roles = info(stack)["roles"]
    assert isinstance(roles, dict)
    return int(roles[role])


NODE_PROXY_PORT = free_port()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    with vmless_stack(
        tmp_path_factory.mktemp("aenv-supervise"),
        AENV_RESTART_CAP_S="1",
        AENV_PROXY_PORT=str(NODE_PROXY_PORT),
    ) as s:
        yield s


def _kill_and_squat(supervisor: int, role: int, port: int) -> socket.socket:
    """kill -9 `role` and take its `port`, so that it fails at every start. The supervisor
    is held (SIGSTOP) meanwhile: its restart must not take the port back first."""
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(role, signal.SIGKILL)
        eventually(lambda: not alive(role), 10, "the role died")
        deadline = time.monotonic() + 10
        while True:
            squatter = socket.socket()
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                squatter.bind(("127.0.0.1", port))
                break
            except OSError as e:  # who still holds it (its last connections closing?)
                squatter.close()
                if time.monotonic() > deadline:
                    held = subprocess.run(["ss", "-tanp"], capture_output=True, text=True)
                    mine = [ln for ln in held.stdout.splitlines() if f":{port} " in ln]
                    pytest.fail(f"{e}: {mine}")
                time.sleep(0.2)
        squatter.listen()
        return squatter
    finally:
        os.kill(supervisor, signal.SIGCONT)


def test_a_node_crash_loop_leaves_the_api_answering_and_says_so(stack: VmlessStack) -> None:
    """The node cannot start (its proxy port taken): the API stays up (live 200), its
    readiness and `aenv status` name the node, and the node is back once it can listen."""
    supervisor = int(str(info(stack)["pid"]))
    api, node = role_pid(stack, "api"), role_pid(stack, "node")
    squatter = _kill_and_squat(supervisor, node, NODE_PROXY_PORT)
    try:
        log = stack.data_dir / "aenv.log"
        eventually(
            lambda: "node exited during start-up" in log.read_text(errors="replace"),
            60,
            "the node failing to start",
        )

        def named() -> bool:
            r = httpx.get(f"{stack.api_url}/health/ready", timeout=10)
            return r.status_code == 503 and "node: no node is beating" in r.json()["message"]

        eventually(named, 30, "readiness names the node")
        assert httpx.get(f"{stack.api_url}/health/live", timeout=10).status_code == 200
        status = stack.aenv("status", "--data-dir", str(stack.data_dir))
        assert status.returncode == 3 and "role node is" in status.stderr, status.stderr
        assert alive(supervisor) and role_pid(stack, "api") == api and alive(api)
    finally:
        squatter.close()
    eventually(
        lambda: httpx.get(f"{stack.api_url}/health/ready", timeout=10).status_code == 200,
        60,
        "ready once the node is back",
    )
    assert stack.aenv("status", "--data-dir", str(stack.data_dir)).returncode == 0


def test_an_api_crash_loop_never_stops_the_node(stack: VmlessStack) -> None:
    """The API cannot listen (its port taken) and crashes at every start: the supervisor
    keeps restarting it, the node role and its sandbox live on, and once the port is free
    the API is back with the sandbox still running."""
    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 300})
        assert r.status_code == 201, r.text
        sid = r.json()["sandboxID"]
    supervisor = int(str(info(stack)["pid"]))
    node, api = role_pid(stack, "node"), role_pid(stack, "api")
    port = urlsplit(stack.api_url).port
    log = stack.data_dir / "aenv.log"
    before = log.read_text(errors="replace").count("api exited unexpectedly")
    assert port is not None
    squatter = _kill_and_squat(supervisor, api, port)
    try:

        def crashes() -> int:
            assert alive(supervisor) and alive(node), "an API crash loop took the stack down"
            return log.read_text(errors="replace").count("api exited unexpectedly") - before

        # each start that cannot listen exits in seconds (its shutdown once waited 30 s on
        # a NATS drain: uvicorn's sys.exit stopped the event loop under it)
        # (90 s: three starts of a loaded host's Python, not three 30 s drains)
        eventually(lambda: crashes() >= 3, 90, "three API crashes in a row")
        assert alive(supervisor) and alive(node), "an API crash loop took the node down"
        assert role_pid(stack, "node") == node
        assert info(stack)["role_status"]["api"]["state"] in ("starting", "restarting")  # type: ignore[index]
    finally:
        squatter.close()

    def api_back() -> bool:
        try:
            return httpx.get(f"{stack.api_url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    eventually(api_back, 60, "the API back once its port is free")
    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
        assert c.delete(f"/sandboxes/{sid}").status_code == 204
    assert role_pid(stack, "node") == node and alive(node)
    assert info(stack)["role_status"]["api"]["state"] == "ready"  # type: ignore[index]


def _stack_processes(stack: VmlessStack) -> dict[str, int]:
    """Every process the supervisor started, by name (from the pids it published)."""
    out = {role: role_pid(stack, role) for role in ("api", "node")}
    pidfile = stack.data_dir / "services/postgres/data/postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        out["postgres"] = int(pidfile.read_text().split()[0])
    for proc in Path("/proc").iterdir():  # nats-server: found by its store under this stack
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"nats-server" in cmd and str(stack.data_dir).encode() in cmd:
                out["nats"] = int(proc.name)
    return out


def _up_again(stack: VmlessStack) -> subprocess.CompletedProcess[str]:
    port = urlsplit(stack.api_url).port
    return subprocess.run(
        [*AENV, "up", "--data-dir", str(stack.data_dir), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        env=stack.env,
    )


def _serves(stack: VmlessStack) -> None:
    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
    ) as c:
        r = c.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        assert r.status_code == 201, r.text
        assert c.delete(f"/sandboxes/{r.json()['sandboxID']}").status_code == 204


EMBEDDED = {"AENV_NATS_URL": "", "AENV_DATABASE_URL": ""}


def test_a_killed_supervisor_leaves_nothing_running_past_the_drain_deadline(
    tmp_path: Path,
) -> None:
    """kill -9 of the supervisor: its roles and servers notice (parent-death signal) and
    are gone within the roles' drain deadline — not draining for ever against a NATS that
    went with it — and `aenv up` on the same data dir starts cleanly (no Postgres lock)."""
    with vmless_stack(tmp_path / "d", AENV_DRAIN_S="3", **EMBEDDED) as stack:
        procs = _stack_processes(stack)
        assert set(procs) == {"api", "node", "nats", "postgres"}
        os.kill(int(str(info(stack)["pid"])), signal.SIGKILL)
        t0 = time.monotonic()
        eventually(
            lambda: not any(alive(p) for p in procs.values()),
            20,
            f"the stack's processes gone: {procs}",
            lambda: {n: p for n, p in procs.items() if alive(p)},
        )
        assert time.monotonic() - t0 < 15
        up = _up_again(stack)
        assert up.returncode == 0, up.stderr + (stack.data_dir / "aenv.log").read_text()[-3000:]
        _serves(stack)


def test_aenv_down_finds_and_stops_a_stack_whose_supervisor_died(tmp_path: Path) -> None:
    """Right after the supervisor's kill -9 its roles may still be draining: `aenv down`
    must find them by the data dir's records, not say "not running". They are held
    (SIGSTOP) across the kill so that they are surely still there when `aenv down` looks,
    however long its start takes on a loaded host; held, they ignore its stop signal, so
    they also prove that it ends them with SIGKILL after its `--timeout`."""
    with vmless_stack(tmp_path / "d", **EMBEDDED) as stack:
        procs = _stack_processes(stack)
        for pid in procs.values():
            os.kill(pid, signal.SIGSTOP)
        os.kill(int(str(info(stack)["pid"])), signal.SIGKILL)
        down = subprocess.run(
            [*AENV, "down", "--data-dir", str(stack.data_dir), "--timeout", "5"],
            capture_output=True,
            text=True,
            timeout=90,
            env=stack.env,
        )
        assert down.returncode == 0, down.stderr
        assert "not running" not in down.stdout, down.stdout
        assert "stopped" in down.stdout, down.stdout
        assert not [n for n, p in procs.items() if alive(p)], down.stdout
        up = _up_again(stack)
        assert up.returncode == 0, up.stderr + (stack.data_dir / "aenv.log").read_text()[-3000:]
        _serves(stack)


def _history(stack: VmlessStack, sandbox_id: str) -> list[str]:
    """The sandbox's events, read back from the stack's (embedded) JetStream."""
    settings = BusSettings(
        nats_url=str(info(stack)["nats_url"]), bus_prefix=stack.bus_settings.bus_prefix
    )

    async def read() -> list[str]:
        bus = await Bus.connect(settings, setup=False)
        try:
            return [type(r.event).__name__ for r in await bus.sandboxes.read(sandbox_id)]
        finally:
            await bus.close()

    return asyncio.run(read())


def _api_serves(stack: VmlessStack) -> bool:
    try:
        _serves(stack)
    except (AssertionError, httpx.HTTPError):
        return False
    return True


@pytest.mark.parametrize("server", ["postgres", "nats"])
def test_a_killed_embedded_server_is_restarted_and_the_roles_reconnect(
    tmp_path: Path, server: str
) -> None:
    """kill -9 of the embedded Postgres (stale postmaster.pid left behind) or NATS: the
    supervisor starts it again on the same port and data, the roles reconnect by
    themselves, and what was stored before is still there (JetStream's file store)."""
    with vmless_stack(tmp_path / "d", AENV_RESTART_CAP_S="2", **EMBEDDED) as stack:
        with httpx.Client(
            base_url=stack.api_url, headers={"X-API-KEY": stack.api_key}, timeout=30
        ) as c:
            r = c.post("/sandboxes", json={"templateID": "base", "timeout": 300})
            assert r.status_code == 201, r.text
            sid = r.json()["sandboxID"]
            roles = {role: role_pid(stack, role) for role in ("api", "node")}
            victim = _stack_processes(stack)[server]
            os.kill(victim, signal.SIGKILL)
            eventually(lambda: not alive(victim), 10, f"{server} died")
            back = eventually(
                lambda: _stack_processes(stack).get(server) not in (None, victim),
                60,
                f"{server} restarted",
            )
            assert back
            eventually(lambda: _api_serves(stack), 90, "the API serves again")
            # a create needs no read model, a GET does: while Postgres replays its WAL
            # ("the database system is starting up") the GET is an outage (503 with
            # Retry-After), never a 500
            answers: list[httpx.Response] = []

            def read_back() -> bool:
                answers.append(c.get(f"/sandboxes/{sid}"))
                return answers[-1].status_code == 200

            eventually(read_back, 60, "the sandbox read back")
            assert {r.status_code for r in answers} <= {200, 503}, [r.text for r in answers]
            got = answers[-1]
            assert got.json()["state"] == "running", got.text
            assert _history(stack, sid)[:2] == ["SandboxRequested", "SandboxCreated"]
            assert c.delete(f"/sandboxes/{sid}").status_code == 204
        log = stack.data_dir / "aenv.log"
        assert f"{server} exited unexpectedly" in log.read_text(errors="replace")
        # the supervisor says so once its readiness probe passed: maybe after the API served
        eventually(
            lambda: f"{server} is back" in log.read_text(errors="replace"),
            30,
            f"'{server} is back' in the log",
        )
        assert {role: role_pid(stack, role) for role in ("api", "node")} == roles


def test_roles_drain_within_their_deadline_when_nats_hangs(tmp_path: Path) -> None:
    """A drain that waits on a hung NATS (SIGSTOPped: it neither answers nor refuses) ends
    at the roles' deadline, and `aenv down` with it — not after a minute per role."""
    with vmless_stack(tmp_path / "d", AENV_DRAIN_S="3", **EMBEDDED) as stack:
        procs = _stack_processes(stack)
        os.kill(procs["nats"], signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            down = subprocess.run(
                [*AENV, "down", "--data-dir", str(stack.data_dir)],
                capture_output=True,
                text=True,
                timeout=120,
                env=stack.env,
            )
            took = time.monotonic() - t0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(procs["nats"], signal.SIGCONT)
        assert down.returncode == 0, down.stderr
        assert not [n for n, p in procs.items() if alive(p)]
        assert took < 45, f"aenv down took {took:.0f}s"  # hung: a minute per role
        up = _up_again(stack)
        assert up.returncode == 0, up.stderr + (stack.data_dir / "aenv.log").read_text()[-3000:]
