"""The crash matrix: kill -9 a part of a running stack under a bounded lifecycle load, then
check what a user of an RL run needs after every fault:

* every accepted command has exactly one outcome (or was overtaken by its sandbox's end),
  none twice, nothing left in a transitional state — read from the event log (`audit`);
* every sandbox that was paused (or whose resume was in flight) is still there and resumes
  with its files (checksum) and its memory (a process holding a secret only in RAM);
* a sandbox running when its node died is reported `killed` by the node with a reason, never
  left `running`; one running while the API died is untouched;
* no orphan: QEMU processes and VM directories = running sandboxes; pause captures only for
  paused sandboxes;
* the read models equal a rebuild from the log.

Each scenario prints its counts (`-s` shows them; CI logs keep them).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import nats
import pytest
from e2b import Sandbox

from bus import BusSettings, RecordedEvent
from domain import sandbox as sb
from projections.audit import AuditReport, audit, read_log
from tests.eventwatch import FirstEvent
from tests.reliability.conftest import SIZE, Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

#: a shell that keeps a secret only in memory (its file is deleted) and writes it back on
#: SIGUSR1: alive and answering after a pause/resume proves the guest's RAM came back
KEEPER = (
    "sh -c 'v=$(cat /tmp/secret); rm -f /tmp/secret; "
    'trap "echo $v > /home/user/recalled" USR1; while :; do sleep 0.2; done\''
)


@dataclass
class Rollout:
    """One sandbox of the load, with what it must still hold."""

    sandbox_id: str
    sha: str
    secret: str
    keeper_pid: int
    errors: list[str] = field(default_factory=list)

    @classmethod
    def start(cls) -> Rollout:
        sbx = Sandbox.create(timeout=900)
        data = secrets.token_bytes(256 * 1024)
        sbx.files.write("/home/user/data.bin", data)
        secret = secrets.token_hex(8)
        sbx.files.write("/tmp/secret", secret)
        keeper = sbx.commands.run(KEEPER, background=True)
        eventually_sync(lambda: not sbx.files.exists("/tmp/secret"), timeout=30)
        return cls(sbx.sandbox_id, hashlib.sha256(data).hexdigest(), secret, keeper.pid)

    def check(self, sbx: Sandbox) -> None:
        """Files and memory intact (the sandbox is running)."""
        out = sbx.commands.run("sha256sum /home/user/data.bin").stdout.split()[0]
        assert out == self.sha, f"{self.sandbox_id}: data.bin changed"
        sbx.commands.run("rm -f /home/user/recalled")
        sbx.commands.run(f"kill -USR1 {self.keeper_pid}")
        recalled = eventually_sync(
            lambda: (
                sbx.files.exists("/home/user/recalled")
                and sbx.files.read("/home/user/recalled").strip()
            ),
            timeout=30,
        )
        assert recalled == self.secret, f"{self.sandbox_id}: memory lost"


def _role_pid(st: Stack, role: str) -> int:
    roles = st.info()["roles"]
    assert isinstance(roles, dict)
    return int(roles[role])


def _kill_role(st: Stack, role: str) -> None:
    """kill -9 a role, then wait until the supervisor's replacement serves."""
    pid = _role_pid(st, role)
    serving = _log_count(st, "serving")
    os.kill(pid, signal.SIGKILL)
    eventually_sync(lambda: _role_pid(st, role) != pid, timeout=120, interval=0.2)
    if role == "node":
        eventually_sync(lambda: _log_count(st, "serving") > serving, timeout=300, interval=0.5)
    eventually_sync(lambda: _api_ok(st), timeout=120, interval=0.2)


def _kill_when_seen(watch: FirstEvent, st: Stack, role: str) -> None:
    if watch.seen.wait(60):
        _kill_role(st, role)


def _log_count(st: Stack, what: str) -> int:
    text = (st.data_dir / "aenv.log").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if what in ln and "sandbox proxy" in ln)


def _log(st: Stack) -> list[RecordedEvent]:
    """Every sandbox event the stack's log holds (the source of truth)."""

    async def run() -> list[RecordedEvent]:
        nc = await nats.connect(st.nats_url)
        try:
            return await read_log(nc.jetstream(), BusSettings(nats_url=st.nats_url))
        finally:
            await nc.close()

    return asyncio.run(run())


def _folded(st: Stack) -> dict[str, sb.Sandbox]:
    """Every sandbox's state, folded from the log."""
    states: dict[str, sb.State] = {}
    for r in _log(st):
        if isinstance(r.event, sb.SandboxEvent):
            sid = r.envelope.aggregate_id
            states[sid] = sb.evolve(states.get(sid), r.event)
    return {sid: s for sid, s in states.items() if s is not None}


def _audit(st: Stack) -> AuditReport:
    return audit(_log(st))


def _settled(st: Stack) -> AuditReport:
    """The log once nothing is in flight: no request unanswered, no sandbox in transit."""

    def quiet() -> AuditReport | None:
        r = _audit(st)
        return r if r.unanswered == 0 and r.stuck == 0 else None

    try:
        report = eventually_sync(quiet, timeout=240, interval=1.0)
    except AssertionError:
        r = _audit(st)
        raise AssertionError(f"not settled: {r.summary()}\n{r.findings}") from None
    assert report is not None
    return report


def _states(st: Stack) -> dict[str, str]:
    return {sid: s.status.value for sid, s in _folded(st).items()}


def _durable(st: Stack, sandbox_ids: list[str]) -> bool:
    states = _folded(st)
    return all(i in states and states[i].resumable_anywhere for i in sandbox_ids)


def _no_orphans(st: Stack) -> dict[str, int]:
    """VM directories = running sandboxes (and the node's warm VMs, `warm-…`, which no
    sandbox holds yet); one QEMU process per VM directory; pause captures belong to paused
    sandboxes only."""
    states = _states(st)
    running = {s for s, v in states.items() if v == "running"}
    paused = {s for s, v in states.items() if v == "paused"}
    node = st.data_dir / "node"

    def counts() -> tuple[int, int, set[str]]:
        ps = subprocess.run(
            ["pgrep", "-f", f"qemu-system.*{node}"], capture_output=True, text=True
        ).stdout.split()
        vm_dirs = {d.name for d in (node / "vms").glob("*")}
        return len(ps), len(vm_dirs), {d for d in vm_dirs if not d.startswith("warm-")}

    # a VM being torn down in the background may take a moment to go
    try:
        eventually_sync(
            lambda: counts()[0] == counts()[1] and counts()[2] == running, timeout=60, interval=0.5
        )
    except AssertionError:
        n, _, dirs = counts()
        raise AssertionError(
            f"orphans: {n} QEMU for running {sorted(running)}; VM dirs "
            f"{sorted(dirs)}; states {states}"
        ) from None
    captures = {d.name.rsplit("-p", 1)[0] for d in (node / "snapshots").glob("*-p*")}
    assert captures <= paused, f"pause captures of sandboxes not paused: {captures - paused}"
    return {
        "running": len(running),
        "paused": len(paused),
        "qemu": counts()[0],
        "captures": len(captures),
    }


def _rebuild_identical(st: Stack) -> None:
    r = st.aenv("projections", "rebuild", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _run_all(fns: list[Callable[[], None]]) -> list[BaseException | None]:
    out: list[BaseException | None] = [None] * len(fns)

    def one(i: int) -> None:
        try:
            fns[i]()
        except BaseException as e:  # recorded: a fault is expected to cut some calls
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return out


def _cycle(r: Rollout) -> None:
    """One round of an agent's life: exec, pause, resume, fork one child, kill the child."""
    sbx = Sandbox.connect(r.sandbox_id, timeout=900)
    sbx.commands.run("echo step >> /home/user/steps")
    sbx.pause()
    sbx = Sandbox.connect(r.sandbox_id, timeout=900)
    kids = sbx.fork(count=1, timeout=300)
    for k in kids:
        if isinstance(k, Sandbox):
            k.kill()


def _load(st: Stack, r: Rollout, cut: list[BaseException], rounds: int = 3) -> None:
    """`rounds` cycles, going on after a call the fault cut (as an agent's retry loop
    would) once the API answers again — unless the sandbox is gone with its node."""
    for _ in range(rounds):
        try:
            _cycle(r)
        except Exception as e:
            cut.append(e)
            eventually_sync(lambda: _api_ok(st), timeout=300, interval=0.5)
            eventually_sync(
                lambda: _states(st).get(r.sandbox_id) in _SETTLED_STATES, timeout=300, interval=0.5
            )
            if _states(st).get(r.sandbox_id) in ("killed", "failed"):
                return


_SETTLED_STATES = ("running", "paused", "killed", "failed")


def _api_ok(st: Stack) -> bool:
    try:
        return httpx.get(f"{st.api_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _report(
    name: str,
    cut: list[BaseException | None] | list[BaseException],
    after: AuditReport,
    orphans: dict[str, int],
    **more: object,
) -> None:
    errors = Counter(type(e).__name__ for e in cut if e is not None)
    print(
        f"\n[crash-matrix] {name}: calls cut by the fault {dict(errors)}; {more}; "
        f"after recovery: {orphans}; log: {after.summary()}"
    )


def _verify(
    st: Stack, rollouts: list[Rollout], *, may_lose_running: bool, keep: set[str]
) -> Counter[str]:
    """Each rollout's sandbox: alive with files and memory, or (node faults only, and never
    one in `keep`: paused when the fault came) reported lost by its node. Returns outcome
    counts."""
    states = _states(st)
    seen: Counter[str] = Counter()
    for r in rollouts:
        status = states.get(r.sandbox_id)
        if status == "killed" and may_lose_running and r.sandbox_id not in keep:
            seen["killed (VM lost with its node)"] += 1
            continue
        assert status in ("running", "paused"), f"{r.sandbox_id} ended {status}"
        seen[status] += 1
        sbx = Sandbox.connect(r.sandbox_id, timeout=900)
        r.check(sbx)
    return seen


def _after(
    st: Stack,
    name: str,
    rollouts: list[Rollout],
    cut: list[BaseException | None] | list[BaseException],
    *,
    may_lose_running: bool,
    keep: set[str] | None = None,
    **more: object,
) -> None:
    _settled(st)
    outcomes = _verify(st, rollouts, may_lose_running=may_lose_running, keep=keep or set())
    after = _settled(st)
    assert after.duplicated == 0, after.findings
    orphans = _no_orphans(st)
    _rebuild_identical(st)
    cli = st.aenv("audit", "--output", "json")  # the operator's view of the same log
    assert cli.returncode == 0, cli.stdout + cli.stderr
    _report(name, cut, after, orphans, outcomes=dict(outcomes), **more)
    for r in rollouts:
        Sandbox.kill(r.sandbox_id)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("role", ["api", "node"])
def test_role_killed_under_load(rstack: Stack, role: str) -> None:
    rollouts = [Rollout.start() for _ in range(SIZE)]
    fault = threading.Timer(1.5, _kill_role, args=(rstack, role))
    fault.start()
    cut: list[BaseException] = []
    _run_all([lambda r=r: _load(rstack, r, cut) for r in rollouts])  # type: ignore[misc]
    fault.join()
    # a cut call leaves its sandbox wherever the fault found it: bring paused ones back
    _after(rstack, f"kill -9 {role} under load", rollouts, cut, may_lose_running=role == "node")


@pytest.mark.timeout(1500)
def test_node_killed_while_resumes_are_in_flight(rstack: Stack) -> None:
    """Paused sandboxes whose resume was cut by a node crash stay paused or resume, never
    killed (their captures are durable first: a guest the resume already ran then comes
    back from the repository)."""
    rollouts = [Rollout.start() for _ in range(SIZE)]
    for r in rollouts:
        Sandbox.pause(r.sandbox_id)
    eventually_sync(
        lambda: _durable(rstack, [r.sandbox_id for r in rollouts]), timeout=120, interval=1.0
    )
    watch = FirstEvent(rstack.nats_url, sb.SandboxResumeRequested)
    fault = threading.Thread(target=_kill_when_seen, args=(watch, rstack, "node"))
    fault.start()
    cut = _run_all(
        [
            lambda r=r: Sandbox.connect(r.sandbox_id, timeout=900)  # type: ignore[misc]
            for r in rollouts
        ]
    )
    fault.join()
    assert watch.seen.is_set()
    _after(
        rstack, "kill -9 node while resumes are in flight", rollouts, cut, may_lose_running=False
    )


@pytest.mark.timeout(1500)
def test_node_killed_while_resumes_of_fresh_pauses_run(rstack: Stack) -> None:
    """Resumes right after their pauses — an agent's usual loop, its captures not uploaded
    yet — cut by a node crash the moment the first of them is recorded: the others' guests
    then run on RAM files they adopted, their resumes not recorded. Each of those must stay
    paused, its capture whole (the resume leaves a copy of the RAM to it), and come back
    with its files and memory; only those recorded running before the crash are lost."""
    rollouts = [Rollout.start() for _ in range(max(3, SIZE))]
    for r in rollouts:
        Sandbox.pause(r.sandbox_id)
    watch = FirstEvent(rstack.nats_url, sb.SandboxResumed)
    fault = threading.Thread(target=_kill_when_seen, args=(watch, rstack, "node"))
    fault.start()
    cut = _run_all(
        [
            lambda r=r: Sandbox.connect(r.sandbox_id, timeout=900)  # type: ignore[misc]
            for r in rollouts
        ]
    )
    fault.join()
    assert watch.seen.is_set()
    _settled(rstack)
    log = _log(rstack)
    # at stake: a capture not in the repository when its resume was asked for (uploads after
    # the crash do not count: the restarted node uploads what it rolled back or kept paused)
    asked: dict[str, int] = {}
    for r in log:
        if isinstance(r.event, sb.SandboxResumeRequested):
            asked.setdefault(r.envelope.aggregate_id, r.seq)
    uploaded = {
        r.envelope.aggregate_id
        for r in log
        if isinstance(r.event, sb.SnapshotUploaded)
        and r.seq < asked.get(r.envelope.aggregate_id, r.seq)
    }
    fresh = [r.sandbox_id for r in rollouts if r.sandbox_id not in uploaded]
    assert fresh, "every capture was uploaded before its resume: nothing was at stake"
    mine = {r.sandbox_id for r in rollouts}  # (the stack's log holds earlier scenarios too)
    lost_kill = {
        r.envelope.aggregate_id: r.seq
        for r in log
        if isinstance(r.event, sb.SandboxKillRequested)
        and r.event.reason == "lost"
        and r.envelope.aggregate_id in mine
    }
    resumed_before = {
        sid
        for sid, kill in lost_kill.items()
        if any(
            r.envelope.aggregate_id == sid
            and isinstance(r.event, sb.SandboxResumed)
            and r.seq < kill
            for r in log
        )
    }
    # a sandbox the crash took must have been recorded running: a resume not recorded
    # never costs the sandbox
    assert set(lost_kill) <= resumed_before, (set(lost_kill) - resumed_before, lost_kill)
    came_back = [r.sandbox_id for r in rollouts if r.sandbox_id not in lost_kill]
    _after(
        rstack,
        "kill -9 node while resumes of fresh pauses run",
        rollouts,
        cut,
        may_lose_running=True,
        keep=set(came_back),
        not_uploaded=len(fresh),
        lost_running=len(lost_kill),
        resumed_after_the_crash=len(came_back),
    )


@pytest.mark.timeout(1500)
def test_node_killed_while_a_fork_is_in_flight(rstack: Stack) -> None:
    """The parent (running) is lost with its node and said so; its children, half made,
    must not stay `creating` forever; paused bystanders survive."""
    parent = Rollout.start()
    bystanders = [Rollout.start() for _ in range(max(1, SIZE - 1))]
    for r in bystanders:
        Sandbox.pause(r.sandbox_id)
    watch = FirstEvent(rstack.nats_url, sb.SandboxForkRequested)
    fault = threading.Thread(target=_kill_when_seen, args=(watch, rstack, "node"))
    fault.start()
    cut = _run_all([lambda: Sandbox.fork(parent.sandbox_id, count=2, timeout=300)])  # type: ignore[list-item]
    fault.join()
    assert watch.seen.is_set()
    _after(
        rstack,
        "kill -9 node while a fork is in flight",
        [parent, *bystanders],
        cut,
        may_lose_running=True,
        keep={r.sandbox_id for r in bystanders},
    )


@pytest.mark.timeout(600)
def test_a_vm_that_dies_is_reported_and_cleaned(rstack: Stack) -> None:
    """A QEMU killed under the node (its memory cgroup, a crash) is a sandbox killed in the
    log by its node, with the reason, its directory removed — not `running` until the next
    command fails."""
    sbx = Sandbox.create(timeout=300)
    vm_dir = rstack.data_dir / "node" / "vms" / sbx.sandbox_id
    os.kill(int((vm_dir / "qemu.pid").read_text()), signal.SIGKILL)
    eventually_sync(
        lambda: _states(rstack).get(sbx.sandbox_id) == "killed", timeout=30, interval=0.5
    )
    eventually_sync(lambda: not vm_dir.exists(), timeout=30, interval=0.5)
    r = httpx.get(
        f"{rstack.api_url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-Key": rstack.api_key}
    )
    assert r.status_code == 404
    events = rstack.aenv("events", sbx.sandbox_id, "--output", "json").stdout
    assert '"lost"' in events and "node:rel" in events, events


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("server", ["nats", "postgres", "seaweedfs"])
def test_embedded_server_killed_under_load(rstack: Stack, server: str) -> None:
    """A dead NATS, Postgres or S3 server loses no sandbox: the supervisor restarts it on
    its port and data, the roles reconnect, the load goes on."""
    rollouts = [Rollout.start() for _ in range(SIZE)]
    victim = rstack.service_pid(server)
    assert victim is not None, f"no {server} in the stack's process records"

    def fault() -> None:
        os.kill(victim, signal.SIGKILL)
        eventually_sync(
            lambda: rstack.service_pid(server) not in (None, victim), timeout=120, interval=0.5
        )
        eventually_sync(lambda: _api_ok(rstack), timeout=120, interval=0.5)

    timer = threading.Timer(1.5, fault)
    timer.start()
    cut: list[BaseException] = []
    _run_all([lambda r=r: _load(rstack, r, cut) for r in rollouts])  # type: ignore[misc]
    timer.join()
    _after(rstack, f"kill -9 {server} under load", rollouts, cut, may_lose_running=False)


@pytest.mark.timeout(1500)
def test_supervisor_killed_then_up_again(rstack: Stack) -> None:
    """kill -9 of the supervisor takes its roles and servers down with it (nothing left
    draining for ever); `aenv up` on the same data dir brings the stack back: the paused
    sandboxes with their files and memory, the running ones reported lost by the node."""
    rollouts = [Rollout.start() for _ in range(SIZE)]
    paused = rollouts[: max(1, SIZE // 2)]
    for r in paused:
        Sandbox.pause(r.sandbox_id)
    pid = int(str(rstack.info()["pid"]))
    os.kill(pid, signal.SIGKILL)
    node = rstack.data_dir / "node"
    eventually_sync(
        lambda: (
            not subprocess.run(["pgrep", "-f", str(rstack.data_dir)], capture_output=True).stdout
        ),
        timeout=60,
        interval=0.5,
    )
    port = rstack.api_url.rsplit(":", 1)[1]
    up = rstack.aenv("up", "--port", port, timeout=900)
    assert up.returncode == 0, up.stderr + (rstack.data_dir / "aenv.log").read_text()[-3000:]
    assert (node / "vms").exists()
    _after(
        rstack,
        "kill -9 supervisor, aenv up again",
        rollouts,
        [],
        may_lose_running=True,
        keep={r.sandbox_id for r in paused},
    )
