"""The `ramkeep` shim (`native/ramkeep.c`): a VM with the balloon whose RAM is a private
mapping of a file other VMs map (a fork child over its parent's capture) gives freed pages
back without punching holes in that file.

QEMU discards the pages free page reporting hands back by punching a hole in the RAM
*file*, private mapping or not (measured here: a fork child freeing 200 MiB punched
196 MiB out of the capture its siblings and its parent read). Preloaded into that QEMU, the
shim turns the punch on that one file into a no-op, so only the VM's private copies go
(MADV_DONTNEED) and the file stays as captured. Built on first use with the host's C
compiler (it is ~80 lines); without a compiler there is no shim, and such a VM is refused
rather than run unguarded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from workers.node.vmm.errors import VmmError
from workers.node.vmm.spec import LaunchSpec

__all__ = ["SOURCE", "build", "prepare", "qemu_env"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "native" / "ramkeep.c"
#: what QEMU reads to know the file it must keep whole (the shim's own setting)
KEEP_ENV = "RAMKEEP_FILE"


def build(into: Path) -> Path | None:
    """The shim built from `SOURCE` under `into` (once per source: its hash names it), or
    None — said in the log — when this host has no C compiler or the build fails."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = into / f"ramkeep-{digest}.so"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.warning("no C compiler: the ramkeep shim is not built, the balloon stays off")
        return None
    into.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        log.warning("the ramkeep shim did not build (balloon off): %s", done.stderr[-500:])
        return None
    tmp.replace(out)
    return out


def prepare(into: Path, wanted: bool) -> tuple[Path | None, bool]:
    """The shim, built whatever `wanted` says (a capture with the balloon, taken on another
    node, may be forked here), and whether VMs booted here get the balloon."""
    shim = build(into)
    on = wanted and shim is not None
    if wanted:
        log.info("runtime: balloon with free page reporting %s", "on" if on else "off")
    return shim, on


def qemu_env(spec: LaunchSpec) -> dict[str, str] | None:
    """The environment `spec`'s QEMU runs with: None (the node's own) unless it has the
    balloon over a private mapping, then its shim (`spec.ram_keep`) preloaded and told the
    RAM file."""
    shim = spec.ram_keep
    if not spec.machine.balloon or spec.mem_shared:
        return None
    if shim is None:
        raise VmmError(
            f"{spec.vm_id}: a VM with the balloon over a shared capture's RAM needs the "
            "ramkeep shim (a C compiler on the node builds it); refused rather than let "
            "its freed pages punch holes in the capture"
        )
    preload = " ".join(p for p in (str(shim), os.environ.get("LD_PRELOAD", "")) if p)
    return {**os.environ, "LD_PRELOAD": preload, KEEP_ENV: str(spec.mem_file)}
