"""envd's side of volumes: what /init accepts, and finding a slot's disk by its serial."""

from __future__ import annotations

from pathlib import Path

import pytest

from envd import volumes


def test_init_mounts_are_parsed_and_normalised() -> None:
    got = volumes.parse_mounts([{"name": "data", "path": "/mnt/data/", "serial": "aenv-vol0"}])
    assert got == [volumes.Mount("data", "/mnt/data", "aenv-vol0")]
    assert volumes.parse_mounts(None) == []


@pytest.mark.parametrize(
    "raw",
    [
        {"name": "x"},
        [1],
        [{"name": "d", "path": "rel", "serial": "s"}],
        [{"name": "d", "path": "/p"}],
        [{"name": "", "path": "/p", "serial": "s"}],
    ],
)
def test_malformed_mounts_are_refused(raw: object) -> None:
    with pytest.raises(ValueError):
        volumes.parse_mounts(raw)


def test_a_slot_is_found_by_its_serial_not_its_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for disk, serial in (("vda", ""), ("vdb", ""), ("vdc", "aenv-vol1"), ("vdd", "aenv-vol0")):
        (tmp_path / disk).mkdir()
        (tmp_path / disk / "serial").write_text(serial + "\n")
    monkeypatch.setattr(volumes, "SYS_BLOCK", tmp_path)
    assert volumes.device_of("aenv-vol0") == "/dev/vdd"
    assert volumes.device_of("aenv-vol1") == "/dev/vdc"
    with pytest.raises(volumes.VolumeError, match="no disk"):
        volumes.device_of("aenv-vol3")


def test_nothing_is_mounted_at_a_path_that_is_not_a_mount_point(tmp_path: Path) -> None:
    assert volumes.mounted_from(str(tmp_path / "nowhere")) is None
    assert volumes.mounted_from("/") is not None
