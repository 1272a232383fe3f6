"""Boot a guest image with a bare QEMU command (not the project's VMM driver).

Independent of workers/node/vmm on purpose: these tests check the image, so they use the
plain recipe from vmm-notes §2.5 and own every process and file they create.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from workers.node.image import (
    ENVD_PORT,
    GUEST_MAC,
    GuestImage,
    RuntimeDisk,
    build_runtime,
    kernel_cmdline,
)


@dataclass
class BootedVM:
    """A running QEMU and its serial log."""

    proc: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def console(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, pattern: str, timeout: float) -> tuple[re.Match[str], float]:
        """Wait until the serial log matches `pattern`; returns the match and seconds since start.

        Fails early (with the log) if QEMU exits or the initramfs reports AENV-INIT-FAIL.
        """
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            text = self.console()
            m = rx.search(text)
            if m:
                return m, time.monotonic() - self.started
            if "AENV-INIT-FAIL" in text:
                raise AssertionError(f"guest init failed:\n{text[-3000:]}")
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"QEMU exited {self.proc.returncode} before {pattern!r}:\n{text[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout}s; console:\n{text[-3000:]}")
            time.sleep(0.05)


@contextmanager
def boot(
    image: GuestImage,
    *,
    debug: bool = True,
    mem_mb: int = 512,
    extra: dict[str, str] | None = None,
    forward_port: int | None = None,
    runtime: RuntimeDisk | None = None,
) -> Iterator[BootedVM]:
    """Boot `image` (fresh qcow2 overlay, RAM file in /dev/shm); always kill and clean up.

    With `forward_port`, the guest gets a user-mode (slirp) NIC with the contract's MAC,
    configured through the `vmip`/`vmgw` knobs, and host 127.0.0.1:<port> reaches envd.
    """
    runtime = runtime or build_runtime(progress=lambda m: None)  # envd's own disk
    work = Path(tempfile.mkdtemp(prefix="aenv-imgtest-"))
    shm = Path(tempfile.mkdtemp(prefix="aenv-imgtest-", dir="/dev/shm"))
    overlay, log = work / "root.qcow2", work / "console.log"
    subprocess.run(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            str(image.rootfs),
            "-F",
            "raw",
            str(overlay),
        ],
        check=True,
    )
    if forward_port is None:
        cmdline = kernel_cmdline(image, ip=None, debug=debug, extra=extra)
    else:  # slirp's fixed network, not the node's 169.254.0.21/30 (that needs a netns + tap)
        cmdline = kernel_cmdline(image, ip="10.0.2.15/24", gw="10.0.2.2", debug=debug, extra=extra)
    argv = [
        "qemu-system-x86_64",
        "-machine",
        "microvm,memory-backend=mem",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-m",
        f"{mem_mb}M",
        "-nodefaults",
        "-no-reboot",
        "-display",
        "none",
        "-serial",
        f"file:{log}",
        "-object",
        f"memory-backend-file,id=mem,size={mem_mb}M,mem-path={shm / 'ram'},share=on",
        "-kernel",
        str(image.kernel),
        "-initrd",
        str(image.initrd),
        "-append",
        cmdline,
        "-drive",
        f"id=root,file={overlay},format=qcow2,if=none",
        "-device",
        "virtio-blk-device,drive=root",
        "-drive",
        f"id=rt,file={runtime.path},format=raw,if=none,readonly=on",
        "-device",
        "virtio-blk-device,drive=rt",
    ]
    if forward_port is not None:
        argv += [
            "-netdev",
            f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{forward_port}-:{ENVD_PORT}",
            "-device",
            f"virtio-net-device,netdev=n0,mac={GUEST_MAC}",
        ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    vm = BootedVM(proc, log)
    try:
        yield vm
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
