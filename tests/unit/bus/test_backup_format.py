"""The event log backup's format checks (`bus.backup`): a data file that does not match
its manifest's checksum, or a manifest of another format, is refused before anything is
written; subjects move between bus prefixes without loss."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bus.backup import FORMAT, MANIFEST, BackupError, verify
from bus.backup import _resubject as resubject


def _backup(directory: Path, data: bytes, sha: str | None = None) -> None:
    (directory / "events-000001.jsonl").write_bytes(data)
    manifest = {
        "format": FORMAT,
        "stream": "AENV_EVT",
        "prefix": "",
        "first_seq": 1,
        "last_seq": 1,
        "messages": 1,
        "files": [
            {
                "name": "events-000001.jsonl",
                "messages": 1,
                "first_seq": 1,
                "last_seq": 1,
                "bytes": len(data),
                "sha256": sha or hashlib.sha256(data).hexdigest(),
            }
        ],
    }
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_a_backup_that_matches_its_manifest_verifies(tmp_path: Path) -> None:
    _backup(tmp_path, b'{"seq":1}\n')
    assert verify(tmp_path).messages == 1


def test_a_tampered_backup_is_refused(tmp_path: Path) -> None:
    _backup(tmp_path, b'{"seq":1}\n', sha="0" * 64)
    with pytest.raises(BackupError, match="checksum"):
        verify(tmp_path)


def test_another_format_is_refused(tmp_path: Path) -> None:
    _backup(tmp_path, b"{}\n")
    doc = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps({**doc, "format": "aenv-log-backup/9"}))
    with pytest.raises(BackupError, match="format"):
        verify(tmp_path)


@pytest.mark.parametrize(
    ("subject", "source", "target", "want"),
    [
        ("aenv.evt.sandbox.x", "", "", "aenv.evt.sandbox.x"),
        ("t1.aenv.evt.sandbox.x", "t1", "", "aenv.evt.sandbox.x"),
        ("aenv.evt.sandbox.x", "", "t2", "t2.aenv.evt.sandbox.x"),
        ("t1.aenv.evt.template.a%2Eb", "t1", "t2", "t2.aenv.evt.template.a%2Eb"),
    ],
)
def test_subjects_move_between_prefixes(subject: str, source: str, target: str, want: str) -> None:
    assert resubject(subject, source, target) == want
