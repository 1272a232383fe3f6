"""The warm pool: VMs restored from a template's capture before anyone asks, so that a
create only hands one over.

Under TCG a create's cost is the restore (~200 ms) and then the cold guest: the first
command runs guest code this QEMU has never translated, from pages it has never touched
(~250 ms more). A warm VM has paid both: it was restored, envd initialised, and the path
a first command takes (envd's process table, a login bash) ran once — then its vCPUs were
stopped, so an idle pool costs no CPU, only the memory its pages hold.

Until claimed a warm VM is unusable and unreachable: no route (the proxies cannot reach
it), envd's token a secret only the node knows, its vCPUs stopped. A claim (`claim`) gives
it the sandbox's identity through the same envd `/init` a cold create sends — access
token, env vars, hostname, the clock and fresh entropy (every VM of a pool was restored
from one capture: the kernel's RNG must be reseeded, as it is after any restore) — and its
egress policy. A miss, or a claim that fails, leaves the create to the cold restore.

Sizing is `warmsize` (pure): recent demand per template, a floor, caps and a memory budget
within the room the node's sandboxes leave. Refills are housekeeping: they start when the
foreground is quiet and their QEMU yields the CPU to every other VM (`background`), so a
restore, fork or capture a client waits on is not slowed by them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.node.ports import GuestConfig, WarmStats
from workers.node.runtime import (
    Runtime,
    Snapshot,
    Timing,
    Vm,
    init_envd,
    new_id,
    race_exit,
    run_first_command,
)
from workers.node.templates import TemplateCatalog
from workers.node.warmsize import Demand, WarmPolicy, targets, warmable

__all__ = ["WARM_PREFIX", "WarmPool", "WarmVm"]

log = logging.getLogger(__name__)

#: Warm VMs' ids (and directories, `<state>/vms/warm-…`) until claimed: never a sandbox id,
#: which has no dash.
WARM_PREFIX = "warm-"
#: The refill loop looks again at least this often (demand decays with time).
TICK_S = 1.0
#: A claim's /init (the guest was running before its vCPUs stopped: it answers at once).
CLAIM_INIT_TIMEOUT_S = 10.0
#: A failed warm-up waits this long before that template is tried again.
RETRY_AFTER_FAILURE_S = 30.0


@dataclass
class WarmVm:
    template_id: str
    #: the capture it was restored from: a template rebuilt since makes it stale
    snapshot_id: str
    vm: Vm
    #: envd's access token until the claim: only the node knows it
    secret: str
    mem_mib: int
    born: float = field(default_factory=time.monotonic)
    watch: asyncio.Task[None] | None = None


class WarmPool:
    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        policy: WarmPolicy,
        *,
        spare_mib: Callable[[], int] | None = None,
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        self.policy = policy
        self.demand = Demand(policy)
        #: memory (MiB) the node's sandboxes leave free — warm VMs are not in the node's
        #: ledger: they are given up (evicted) when its sandboxes need that room
        self.spare_mib: Callable[[], int] = spare_mib or (lambda: policy.budget_mib)
        self._ready: dict[str, list[WarmVm]] = {}
        self._failed_at: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.hits = 0
        self.misses = 0

    # ---- what it is -------------------------------------------------------------------
    def stats(self) -> WarmStats:
        every = [w for vms in self._ready.values() for w in vms]
        sizes = {t: len(vms) for t, vms in self._ready.items() if vms}
        pids = tuple(p for w in every if (p := w.vm.qemu.pid) is not None and w.vm.qemu.alive)
        return WarmStats(sizes, self.hits, self.misses, sum(w.mem_mib for w in every), pids)

    # ---- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self.policy.budget_mib > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="warm-pool")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for template in list(self._ready):
            await self.drain(template, forget=False)

    async def drain(self, template_id: str, *, forget: bool = True) -> None:
        """A template deleted (`forget`: its demand too) or rebuilt: its warm VMs go."""
        for w in self._ready.pop(template_id, []):
            await self._destroy(w)
        if forget:
            self.demand.forget(template_id)
        self._wake.set()

    async def drop_where(self, stands: Callable[[Vm], bool]) -> list[str]:
        """Destroy every warm VM `stands` picks, returning their ids: those whose base is
        read through the node's block service once it is down for good (a claim would hand
        over a guest whose reads fail). Their templates wait `RETRY_AFTER_FAILURE_S` before
        a refill, which then fails while the service is still down (QEMU cannot open it)."""
        picked: list[WarmVm] = []
        for template, vms in self._ready.items():
            gone = [w for w in vms if stands(w.vm)]
            if gone:
                vms[:] = [w for w in vms if w not in gone]
                self._failed_at[template] = time.monotonic()
                picked += gone
        for w in picked:  # out of the pool first: no claim takes one while we await
            log.warning(
                "warm VM %s of %s dropped: its base cannot be read", w.vm.vm_id, w.template_id
            )
            await self._destroy(w)
        return [w.vm.vm_id for w in picked]

    # ---- claims -----------------------------------------------------------------------
    async def claim(
        self, template_id: str, snap: Snapshot, guest: GuestConfig, sandbox_id: str
    ) -> tuple[Vm, Timing] | None:
        """A warm VM of `snap` given `sandbox_id`'s identity and how long its hand-over
        took (`running`: until its vCPUs run again, `envd`: until its /init answered), or
        None (a miss: the caller restores cold). Only a sandbox with an access token takes
        one: envd must end up holding the sandbox's token instead of the pool's secret, and
        /init can set a token but never clear one."""
        if warmable(template_id):
            self.demand.record(template_id, time.monotonic())
        try:
            if self._task is None or not guest.access_token:
                return None
            # foreground work: the refill it wakes waits until it (and the create's answer,
            # the client's first command) had the CPU to themselves for a moment
            with self.runtime.foreground.busy():
                return await self._claim(template_id, snap, guest, sandbox_id)
        finally:
            self._wake.set()

    async def _claim(
        self, template_id: str, snap: Snapshot, guest: GuestConfig, sandbox_id: str
    ) -> tuple[Vm, Timing] | None:
        ready = self._ready.get(template_id, [])
        while ready:
            w = ready.pop()  # the most recently warmed: its pages the likeliest in cache
            if w.snapshot_id != snap.snapshot_id:  # the template moved on since
                await self._destroy(w)
                continue
            if w.watch is not None:
                w.watch.cancel()  # the sandbox's own watcher takes over once it runs
            try:
                timing = await self._hand_over(w, guest, sandbox_id)
            except Exception as e:
                log.warning(
                    "warm VM %s of %s could not be claimed (%s): restoring cold",
                    w.vm.vm_id,
                    template_id,
                    e,
                )
                await self._destroy(w)
                continue
            self.hits += 1
            return w.vm, timing
        self.misses += 1
        return None

    async def _hand_over(self, w: WarmVm, guest: GuestConfig, sandbox_id: str) -> Timing:
        vm = w.vm
        t0 = time.monotonic()
        vm.qemu.set_background(False)
        await self.runtime.pool.apply(vm.slot, guest.egress)
        await vm.qemu.cont()
        t1 = time.monotonic()
        init = init_envd(vm.host, guest.init_body(sandbox_id), token=w.secret)
        await race_exit(vm, asyncio.wait_for(init, CLAIM_INIT_TIMEOUT_S))
        t2 = time.monotonic()
        log.info(
            "warm VM %s is sandbox %s: cont %.1f ms, /init %.1f ms",
            vm.vm_id,
            sandbox_id,
            (t1 - t0) * 1000,
            (t2 - t1) * 1000,
        )
        try:
            self.runtime.rename(vm, sandbox_id)
        except OSError as e:  # its directory keeps the warm name: cosmetic, not fatal
            log.warning("warm VM %s keeps its name for sandbox %s: %s", vm.vm_id, sandbox_id, e)
        return Timing(total=t2 - t0, running=t1 - t0, envd=t2 - t0)

    # ---- refills ----------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a refill is best effort; the next tick tries again
                log.exception("warm pool refill failed")

    def _sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in {*self.demand.templates(), *self.policy.keep, *self._ready}:
            mem = self.templates.mem_mib(t)
            if mem is not None and self.templates.ready(t) is not None:
                out[t] = mem
        return out

    def _targets(self) -> dict[str, int]:
        return targets(self.demand, self._sizes(), time.monotonic(), spare_mib=self.spare_mib())

    async def _step(self) -> None:
        """Evict what the targets no longer want, then warm one VM where one is missing
        (one at a time: each is a restore's worth of CPU), and go again at once."""
        while True:
            want = self._targets()
            for template, vms in list(self._ready.items()):
                while len(vms) > want.get(template, 0):
                    await self._destroy(vms.pop(0))  # the oldest first
            now = time.monotonic()
            missing = [
                t
                for t, n in want.items()
                if len(self._ready.get(t, [])) < n
                and now - self._failed_at.get(t, -RETRY_AFTER_FAILURE_S) >= RETRY_AFTER_FAILURE_S
            ]
            if not missing:
                return
            await self.runtime.foreground.settled()  # housekeeping: after the restores
            await self._warm_one(missing[0])

    async def _warm_one(self, template_id: str) -> None:
        snap = self.templates.ready(template_id)
        mem = self.templates.mem_mib(template_id)
        if snap is None or mem is None:
            return
        secret = secrets.token_urlsafe(32)
        t0 = time.monotonic()
        try:
            vm, _ = await self.runtime.restore(
                snap,
                vm_id=f"{WARM_PREFIX}{new_id()[:16]}",
                private_memory=False,
                background=True,
                init={"accessToken": secret},
                init_token=self.templates.guest_token(template_id),
            )
            try:
                await race_exit(vm, run_first_command(vm.host, token=secret))
                await vm.qemu.stop()
            except BaseException:
                await self.runtime.destroy(vm)
                raise
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if self.templates.ready(template_id) is not snap:  # deleted or rebuilt meanwhile
                log.info("warming a VM of %s stopped: the template changed (%s)", template_id, e)
                return
            self._failed_at[template_id] = time.monotonic()
            log.warning("warming a VM of %s failed: %s", template_id, e)
            return
        if self.templates.ready(template_id) is not snap:  # rebuilt or deleted meanwhile
            await self.runtime.destroy(vm)
            return
        w = WarmVm(template_id, snap.snapshot_id, vm, secret, mem)
        w.watch = asyncio.create_task(self._watch(w), name=f"warm-watch:{vm.vm_id}")
        self._ready.setdefault(template_id, []).append(w)
        self._failed_at.pop(template_id, None)
        log.info(
            "warm VM %s of %s ready in %.0f ms",
            vm.vm_id,
            template_id,
            (time.monotonic() - t0) * 1000,
        )

    async def _watch(self, w: WarmVm) -> None:
        """A warm VM whose QEMU exits (its memory cgroup, a crash) is replaced."""
        code = await w.vm.qemu.wait_exit()
        vms = self._ready.get(w.template_id, [])
        if w in vms:
            vms.remove(w)
            log.warning(
                "warm VM %s of %s exited (QEMU status %s): replacing it",
                w.vm.vm_id,
                w.template_id,
                code,
            )
            await self.runtime.destroy(w.vm, background=True)
            self._wake.set()

    async def _destroy(self, w: WarmVm) -> None:
        if w.watch is not None:
            w.watch.cancel()
        await self.runtime.destroy(w.vm, background=True)
