import struct
from pathlib import Path

import pytest

from workers.node.runtime.qcow2 import CLUSTER, Qcow2Error, create_overlay, virtual_size


def test_overlay_header_names_backing_and_size(tmp_path: Path) -> None:
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(5 << 30)
    top = tmp_path / "top.qcow2"
    create_overlay(top, base, "raw")
    raw = top.read_bytes()
    assert raw[:4] == b"QFI\xfb" and struct.unpack(">I", raw[4:8])[0] == 3
    off, length = struct.unpack(">QI", raw[8:20])
    assert raw[off : off + length].decode() == str(base)
    assert virtual_size(top, "qcow2") == 5 << 30
    assert len(raw) % CLUSTER == 0
    child = tmp_path / "child.qcow2"
    create_overlay(child, top, "qcow2")
    assert virtual_size(child, "qcow2") == 5 << 30


def test_bad_backing_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "x"
    bogus.write_bytes(b"not a qcow2 header at all, definitely")
    with pytest.raises(Qcow2Error):
        create_overlay(tmp_path / "t.qcow2", bogus, "qcow2")
    with pytest.raises(Qcow2Error):
        create_overlay(tmp_path / "t.qcow2", bogus, "vmdk")
