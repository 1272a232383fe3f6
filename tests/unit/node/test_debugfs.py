"""The parsers of debugfs' output (`workers/node/volumes/debugfs.py`), on output recorded
from e2fsprogs 1.47, and the paths it may be given."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workers.node.volumes import debugfs as dbg

STAT_FILE = """Inode: 13   Type: regular    Mode:  0640   Flags: 0x80000
Generation: 0    Version: 0x00000000:00000000
User:  1000   Group:     0   Project:     0   Size: 11
File ACL: 0
Links: 1   Blockcount: 8
Fragment:  Address: 0    Number: 0    Size: 0
 ctime: 0x6b0fb813:00000004 -- Wed Dec  2 06:17:55 2026
 atime: 0x6b0fb813:00000000 -- Wed Dec  2 06:17:55 2026
 mtime: 0x6b0fb812:00000000 -- Wed Dec  2 06:17:54 2026
crtime: 0x6b0fb813:00000000 -- Wed Dec  2 06:17:55 2026
Size of extra inode fields: 32
Inode checksum: 0xc101606f
EXTENTS:
(0):4248"""

STAT_LINK = """Inode: 15   Type: symlink    Mode:  0777   Flags: 0x0
Generation: 0    Version: 0x00000000:00000000
User:     0   Group:     0   Project:     0   Size: 8
File ACL: 0
 ctime: 0x6b0fb813:00000000 -- Wed Dec  2 06:17:55 2026
 atime: 0x6b0fb813:00000000 -- Wed Dec  2 06:17:55 2026
 mtime: 0x6b0fb813:00000000 -- Wed Dec  2 06:17:55 2026
Fast link dest: "/d/h.txt\""""

LS = """/12/040755/0/0/.//
/2/040755/0/0/..//
/13/100640/1000/0/h.txt/11/
/14/100644/0/0/big file.bin/3000000/
/15/120777/0/0/link/8/
"""


def test_stat_of_a_file() -> None:
    inode = dbg.parse_stat(STAT_FILE)
    assert (inode.type, inode.mode, inode.uid, inode.gid, inode.size) == (
        "file",
        0o640,
        1000,
        0,
        11,
    )
    assert inode.mtime == datetime.fromtimestamp(0x6B0FB812, UTC)
    # the extra field: nanoseconds << 2 (here 1 ns), epoch bits 0
    assert inode.ctime == datetime.fromtimestamp(0x6B0FB813 + 1e-9, UTC)
    assert inode.target is None


def test_stat_of_a_fast_symlink() -> None:
    inode = dbg.parse_stat(STAT_LINK)
    assert inode.type == "symlink" and inode.target == "/d/h.txt"


def test_stat_of_garbage_is_an_error() -> None:
    with pytest.raises(dbg.DebugfsError):
        dbg.parse_stat("nothing here")


def test_ls_lists_entries_without_dot_and_dotdot() -> None:
    got = dbg.parse_ls(LS)
    assert [(e.name, e.mode, e.uid, e.size) for e in got] == [
        ("h.txt", 0o100640, 1000, 11),
        ("big file.bin", 0o100644, 0, 3000000),
        ("link", 0o120777, 0, 8),
    ]


def test_a_script_output_splits_per_command() -> None:
    out = "debugfs: stat /a\nInode: 1\ndebugfs: stat /b\nInode: 2\nmore\n"
    assert dbg.split_sections(out) == ["Inode: 1", "Inode: 2\nmore"]


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("/", "/"),
        ("a/b", "/a/b"),
        ("/a//b/", "/a/b"),
        ("/with space", "/with space"),
    ],
)
def test_paths_are_normalised(raw: str, want: str) -> None:
    assert dbg.check_path(raw) == want


@pytest.mark.parametrize("raw", ['/a"b', "/a\nb", "/../etc", "/a/./b", "/x\x00"])
def test_paths_debugfs_cannot_take_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        dbg.check_path(raw)
