"""How a sandbox's VM comes up on this node: a warm VM handed over or its template
restored (a create), its own capture restored or its disk booted again (a resume), its
parent captured once and the children restored from that (a fork).

The host checks and records (its maps, its locks); these run the runtime and say how long
each stage took to the stage hook, so the node's histograms see every start alike."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bus.failpoints import failpoint
from workers.node.garbage import Garbage
from workers.node.hosted import LiveSandbox, PausedSandbox
from workers.node.ports import GuestConfig, HostError, Stage
from workers.node.runtime import Runtime, Vm, wait_and_init
from workers.node.templates import TemplateCatalog
from workers.node.transfer import Transfers
from workers.node.volumes.images import VolumeImages
from workers.node.warm import WarmPool

__all__ = ["VmStarts"]

log = logging.getLogger(__name__)


class VmStarts:
    def __init__(
        self,
        runtime: Runtime,
        templates: TemplateCatalog,
        transfers: Transfers,
        warm: WarmPool | None,
        garbage: Garbage,
        volumes: VolumeImages,
        *,
        running: Callable[[LiveSandbox], None],
    ) -> None:
        self.runtime = runtime
        self.templates = templates
        self.transfers = transfers
        self.warm = warm
        self.garbage = garbage
        self.volumes = volumes
        #: registers a VM that runs (the host's map and its death watch)
        self.running = running
        self.stage: Stage = lambda op, stage, seconds, start: None
        self._starting: Counter[str] = Counter()

    def starting(self) -> set[str]:
        """Templates a create is restoring from now: their captures are in use (the disk
        budget must not evict one to make room for its own restore — a create right after
        a kill did, and its restore found no RAM file)."""
        return {t for t, n in list(self._starting.items()) if n > 0}

    def _images(self, guest: GuestConfig) -> tuple[Path | None, ...]:
        """The image of each volume slot the guest mounts (slot i: its i-th volume)."""
        return tuple(self.volumes.image(v.volume_id) for v in guest.volumes)

    def _timed(self, op: str, running_s: float, envd_s: float, start: str = "cold") -> None:
        """A restore's stages (`Timing`: both from its start) to the stage hook; a warm
        VM's "restore" is its hand-over (vCPUs running again)."""
        self.stage(op, "restore", running_s, start)
        self.stage(op, "envd_ready", envd_s - running_s, start)

    async def create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        """A warm VM of the template handed over, else the template restored into a new
        VM; returns once envd in it has been initialised."""
        self._starting[template_id] += 1
        try:
            await self._create(sandbox_id, template_id, guest)
        finally:
            self._starting[template_id] -= 1

    async def _create(self, sandbox_id: str, template_id: str, guest: GuestConfig) -> None:
        t0 = time.monotonic()
        try:
            snap = await self.transfers.template(template_id)
            claimed = None
            if self.warm is not None and not guest.volumes:  # its slots hold placeholders
                claimed = await self.warm.claim(template_id, snap, guest, sandbox_id)
            if claimed is not None:
                warm, handed = claimed
                log.info(
                    "sandbox %s up: warm, claimed in %.1f ms",
                    sandbox_id,
                    (time.monotonic() - t0) * 1000,
                )
                self._timed("create", handed.running, handed.envd, start="warm")
                console = warm.qemu.spec.console_log
                start = console.stat().st_size if console.exists() else 0
                self.running(
                    LiveSandbox(sandbox_id, template_id, warm, guest, warm=True, console_from=start)
                )
                return
            vm, timing = await self.runtime.restore(
                snap,
                vm_id=sandbox_id,
                # a sandbox that may pause gets a RAM file of its own; a snapshot fork's
                # child maps the template's copy-on-write (its pause streams its RAM)
                private_memory=guest.copy_on_write,
                policy=guest.egress,
                init=guest.init_body(sandbox_id),
                init_token=self.templates.guest_token(template_id),
                volumes=self._images(guest),
            )
        except HostError:
            raise
        except Exception as e:
            log.exception("create %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} failed to start: {e}") from e
        log.info(
            "sandbox %s up: running %.1f ms, envd %.1f ms",
            sandbox_id,
            timing.running * 1000,
            timing.envd * 1000,
        )
        self._timed("create", timing.running, timing.envd)
        self.running(LiveSandbox(sandbox_id, template_id, vm, guest))

    async def resume(self, sandbox_id: str, paused: PausedSandbox) -> Vm:
        """The VM of a paused sandbox from its capture (here, whole): a memory capture
        restored (the RAM file adopted), a filesystem-only one's disk booted again."""
        failpoint("resume.before_restore")
        try:
            if paused.snapshot.disk_only:  # a filesystem-only pause: boot its disk again
                vm, timing = await self.runtime.boot_disk(
                    paused.snapshot,
                    vm_id=sandbox_id,
                    policy=paused.guest.egress,
                    init=paused.guest.init_body(sandbox_id),
                    init_token=paused.guest.access_token,
                    volumes=self._images(paused.guest),
                )
            else:
                vm, timing = await self.runtime.restore(
                    paused.snapshot,
                    vm_id=sandbox_id,
                    private_memory=False,
                    adopt_memory=True,
                    policy=paused.guest.egress,
                    init=paused.guest.init_body(sandbox_id),
                    init_token=paused.guest.access_token,
                    volumes=self._images(paused.guest),
                )
        except Exception as e:
            log.exception("resume %s failed", sandbox_id)
            raise HostError(f"sandbox {sandbox_id} could not be resumed: {e}") from e
        failpoint("resume.after_envd")
        log.info(
            "sandbox %s resumed: running %.1f ms, envd %.1f ms",
            sandbox_id,
            timing.running * 1000,
            timing.envd * 1000,
        )
        self._timed("resume", timing.running, timing.envd)
        return vm

    async def reconfigure(self, sandbox_id: str, live: LiveSandbox | None, g: GuestConfig) -> None:
        """Swap a running VM's egress firewall for `g`'s (one `iptables-restore` of its
        slot's tables: no moment without rules); the sandbox keeps it, so a pause here
        resumes under it."""
        if live is None or not live.vm.qemu.alive:
            raise HostError(f"sandbox {sandbox_id} is not running on this node")
        try:
            await self.runtime.pool.apply(live.vm.slot, g.egress)
        except Exception as e:
            log.exception("network update of %s failed", sandbox_id)
            raise HostError(f"the network of sandbox {sandbox_id} was not updated: {e}") from e
        live.guest = dataclasses.replace(live.guest, egress=g.egress)

    async def fork(
        self, parent_id: str, parent: LiveSandbox, children: dict[str, GuestConfig]
    ) -> dict[str, str | None]:
        """Children of a running sandbox, each with its own id and guest config (token);
        returns child id → error (None when it runs). The parent keeps running."""
        ids = list(children)
        t0 = time.monotonic()
        try:
            capture, vms = await self.runtime.fork(
                parent.vm, len(ids), wait=False, vm_ids=ids, policy=parent.guest.egress
            )
        except Exception as e:
            log.exception("fork of %s failed", parent_id)
            raise HostError.about(f"sandbox {parent_id} could not be captured for a fork", e) from e
        # The capture stays on disk while children map its RAM file copy-on-write (a child's
        # pause copies what it needs); the garbage collector deletes it after the last child.
        self.garbage.fork_captures.append(capture)
        log.info("sandbox %s fork into %d: paused %.1f ms", parent_id, len(ids), capture.stopped_ms)

        async def init(cid: str, vm: Vm | BaseException) -> str | None:
            if isinstance(vm, BaseException):
                return f"child failed to start: {vm}"
            guest = children[cid]
            try:
                await wait_and_init(
                    vm.host, guest.init_body(cid), token=parent.guest.access_token, timeout=60
                )
            except Exception as e:
                await self.runtime.destroy(vm)
                return f"child envd did not initialise: {e}"
            self.running(LiveSandbox(cid, parent.template_id, vm, guest))
            return None

        running_s = time.monotonic() - t0
        errors = await asyncio.gather(*(init(c, v) for c, v in zip(ids, vms, strict=True)))
        self._timed("fork", running_s, time.monotonic() - t0)
        return dict(zip(ids, errors, strict=True))
