import json
from pathlib import Path

import pytest

from workers.node.runtime import Snapshot
from workers.node.vmm import Machine


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = Machine("7.2.22", "tcg", "max", 2, 512, "06:00:ac:10:00:02")
    s = Snapshot("s1", tmp_path, m, tmp_path / "top.qcow2", tmp_path / "base.ext4", "vm9",
                 "2026-01-01T00:00:00+00:00", 1234)  # fmt: skip
    s.write()
    back = Snapshot.read(tmp_path)
    assert back == s
    assert json.loads((tmp_path / "manifest.json").read_text())["fingerprint"] == m.fingerprint()


def test_unknown_manifest_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="unknown snapshot format"):
        Snapshot.read(tmp_path)
