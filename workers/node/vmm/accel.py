"""Which accelerator this host can really run: decided by booting, not by `/dev/kvm` existing.

Some hosts (this project's CI among them) have a `/dev/kvm` that cannot run a stock guest
kernel (PVM): QEMU either aborts on an MSR or hangs silently. So the probe boots the guest
kernel with no root device and waits for the kernel's own panic message, which a working
KVM prints within a second; anything else means TCG.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers.node.vmm.argv import QEMU_BINARY
from workers.node.vmm.spec import Accel

PROBE_TIMEOUT = 8.0
CACHE = Path(os.environ.get("AENV_RUN_DIR", "/run/aenv")) / "accel.json"


@dataclass(frozen=True)
class AccelChoice:
    accel: Accel
    cpu: str
    reason: str


TCG = AccelChoice("tcg", "max", "")


def qemu_version(binary: str = QEMU_BINARY) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0].split("version", 1)[1].strip().split()[0]


def choose_accel(kernel: Path, *, binary: str = QEMU_BINARY) -> AccelChoice:
    """KVM when a probe VM boots under it, TCG otherwise; `AENV_ACCEL` forces one."""
    forced = os.environ.get("AENV_ACCEL", "auto")
    if forced == "tcg":
        return AccelChoice("tcg", "max", "forced by AENV_ACCEL=tcg")
    if forced == "kvm":
        return AccelChoice("kvm", "host", "forced by AENV_ACCEL=kvm")
    key = f"{platform.release()}|{qemu_version(binary)}|{kernel}"
    try:
        cached = json.loads(CACHE.read_text())
        if cached.get("key") == key:
            return AccelChoice(cached["accel"], cached["cpu"], cached["reason"] + " (cached)")
    except (OSError, ValueError, KeyError):
        pass
    choice = _probe(kernel, binary)
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps({"key": key, **choice.__dict__}))
    except OSError:
        pass
    return choice


def _probe(kernel: Path, binary: str) -> AccelChoice:
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return AccelChoice("tcg", "max", f"/dev/kvm unusable ({e.strerror})")
    with tempfile.TemporaryDirectory(prefix="aenv-accel-") as tmp:
        log = Path(tmp) / "console"
        argv = [
            binary,
            "-machine",
            "microvm",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-m",
            "128M",
            "-nodefaults",
            "-no-reboot",
            "-display",
            "none",
            "-serial",
            f"file:{log}",
            "-kernel",
            str(kernel),
            "-append",
            "console=ttyS0 panic=-1 root=/dev/null",
        ]
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT, check=False)
            err = proc.stderr.decode(errors="replace").strip().splitlines()
        except subprocess.TimeoutExpired:
            return AccelChoice("tcg", "max", "KVM probe VM hung (e.g. a PVM-only /dev/kvm)")
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Kernel panic" in text or "VFS:" in text:
            took = time.monotonic() - start
            return AccelChoice("kvm", "host", f"KVM probe booted a kernel in {took:.2f}s")
        why = err[-1] if err else "no kernel output"
        return AccelChoice("tcg", "max", f"KVM probe failed: {why}")
