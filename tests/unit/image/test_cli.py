"""The CLI's contract: one error line and exit 1 on failure; cmdline for cached images."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workers.node.image import cache


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.node.image", *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=60,
    )


def test_bad_oci_source_is_one_error_line(tmp_path: Path) -> None:
    p = run("build-oci", str(tmp_path / "missing.tar"), "--name", "x", "--cache", str(tmp_path))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.tar" in lines[0]


def test_bad_size_is_one_error_line(tmp_path: Path) -> None:
    p = run("build-base", "--cache", str(tmp_path), "--free", "huge")
    assert p.returncode == 1 and p.stderr.strip() == "error: bad size 'huge' (use e.g. 2G or 512M)"


def test_cmdline_for_a_cached_image(tmp_path: Path) -> None:
    root = cache.cache_root(tmp_path)
    d = root / "d1"
    d.mkdir()
    for n in ("vmlinux", "initrd.cpio", "root.ext4"):
        (d / n).write_bytes(b"x")
    base = "console=ttyS0 quiet panic=-1 tsc=reliable cryptomgr.notests vmroot=ext4"
    (d / "manifest.json").write_text(json.dumps({"digest": "d1", "kernel_cmdline_base": base}))
    cache.link_name(root, "t", "d1")
    p = run("cmdline", "--cache", str(root), "--image", "t")
    assert p.returncode == 0, p.stderr
    tokens = p.stdout.split()
    assert tokens[:3] == ["console=ttyS0", "quiet", "panic=-1"]
    assert tokens[3].startswith("tsc_early_khz=") and int(tokens[3].split("=")[1]) > 0
    assert tokens[-2:] == ["vmip=169.254.0.21/30", "vmgw=169.254.0.22"]
    p = run("cmdline", "--cache", str(root), "--image", "t", "--no-net", "--debug")
    assert "vmip" not in p.stdout and p.stdout.split()[-1] == "vmdebug=1"
    p = run("cmdline", "--cache", str(root), "--image", "nope")
    assert p.returncode == 1 and "no image 'nope'" in p.stderr
