"""Disk layer chains with the real qemu-img (no VM needed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from workers.node.runtime import LayerStore


async def _store_over_a_base(tmp_path: Path) -> tuple[LayerStore, Path, Path]:
    """A layer store with one qcow2 layer over a raw base: (store, base, that layer)."""
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(16 << 20)
    store = LayerStore(tmp_path / "layers")
    return store, base, await store.create_top(base, backing_raw=True)


async def test_chain_and_collect_keep_what_live_tops_need(tmp_path: Path) -> None:
    store, base, l0 = await _store_over_a_base(tmp_path)
    l1 = await store.create_top(l0)
    l2 = await store.create_top(l1)
    other = await store.create_top(l0)
    assert await store.chain(l2) == [l2, l1, l0, base]
    assert store.lineage(l2) == [l2, l1, l0, base]

    assert await store.collect({l2}) == []  # all of them are too young to touch
    fresh = LayerStore(store.root)  # a restarted node: no chains in memory
    dead = await fresh.collect({l2}, min_age_s=0)
    assert dead == [other]
    assert all(p.exists() for p in (l0, l1, l2)) and not other.exists()
    assert await fresh.collect(set(), min_age_s=0) and not l0.exists() and base.exists()


async def test_collect_keeps_what_a_process_holds_open(tmp_path: Path) -> None:
    """A layer no root names but a process has open — a QEMU whose restore has not yet
    made it a VM of the runtime — stays; once that process is gone it is collected."""
    import subprocess

    store, _, l0 = await _store_over_a_base(tmp_path)
    top = await store.create_top(l0)
    holder = subprocess.Popen(["sh", "-c", 'exec 3<"$0" 4<"$1"; exec sleep 60', str(top), str(l0)])
    try:
        for _ in range(100):  # until the shell has opened both
            if {str(top), str(l0)} <= {
                str(p.resolve()) for p in Path(f"/proc/{holder.pid}/fd").iterdir()
            }:
                break
            time.sleep(0.02)
        assert await store.collect(set(), min_age_s=0) == []
        assert top.exists() and l0.exists()
    finally:
        holder.kill()
        holder.wait()
    assert sorted(await store.collect(set(), min_age_s=0)) == sorted([top, l0])


async def test_compact_flattens_a_chain_over_the_base(tmp_path: Path) -> None:
    """The flat layer reads as the chain did: what every layer wrote, not only the top's
    (`qemu-img convert -B` kept the top's alone: a cold boot after a compacted pause read
    zeros where the files were), and the base where no layer wrote."""
    import subprocess

    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(16 << 20)
        f.seek(8 << 20)
        f.write(b"\x5a" * 65536)
    store = LayerStore(tmp_path / "layers")

    def io(cmd: str, image: Path) -> str:
        return subprocess.run(
            ["qemu-io", "-c", cmd, str(image)], capture_output=True, text=True, check=True
        ).stdout

    l0 = await store.create_top(base, backing_raw=True)
    io("write -P 0x61 0 64k", l0)  # under the top: what was lost
    l1 = await store.create_top(l0)
    io("write -P 0x62 1M 64k", l1)
    top = await store.create_top(l1)
    io("write -P 0x63 2M 4k", top)
    io("write -P 0x64 0 4k", top)  # over a lower layer's write
    flat = await store.compact(top)
    assert await store.chain(flat) == [flat, base]
    for cmd in (
        "read -P 0x64 0 4k",
        "read -P 0x61 4k 60k",
        "read -P 0x62 1M 64k",
        "read -P 0x63 2M 4k",
        f"read -P 0x5a {8 << 20} 64k",
        "read -P 0 4M 64k",
    ):
        assert "Pattern verification failed" not in io(cmd, flat), cmd


async def test_in_process_overlays_are_valid_qcow2(tmp_path: Path) -> None:
    """Our overlay writer against the real qemu-img: clean check, right size and backing,
    and data written through QEMU's block layer reads back over the backing file."""
    import subprocess

    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(3 << 30)
        f.seek(5 << 20)
        f.write(b"\x5a" * 4096)
    store = LayerStore(tmp_path / "layers")
    top = await store.create_top(await store.create_top(base, backing_raw=True))

    def run(*args: str) -> str:
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout

    assert "No errors were found" in run("qemu-img", "check", str(top))
    info = json.loads(run("qemu-img", "info", "--output=json", str(top)))
    assert info["virtual-size"] == 3 << 30 and info["backing-filename-format"] == "qcow2"
    run("qemu-io", "-c", "write -P 0xab 0 1M", str(top))
    out = run("qemu-io", "-c", "read -P 0xab 0 1M", "-c", f"read -P 0x5a {5 << 20} 4k", str(top))
    assert "Pattern verification failed" not in out and out.count("read ") == 2
    assert "No errors were found" in run("qemu-img", "check", str(top))
