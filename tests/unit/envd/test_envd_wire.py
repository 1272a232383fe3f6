"""Pure protobuf-JSON mapping helpers of envd (no processes, no sockets)."""

from __future__ import annotations

import os
import stat

import pytest

from envd import wire


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (stat.S_IFREG | 0o644, "-rw-r--r--"),
        (stat.S_IFDIR | 0o755, "drwxr-xr-x"),
        (stat.S_IFLNK | 0o777, "Lrwxrwxrwx"),
        (stat.S_IFDIR | stat.S_ISVTX | 0o777, "dtrwxrwxrwx"),
        (stat.S_IFREG | stat.S_ISUID | 0o755, "urwxr-xr-x"),
        (stat.S_IFREG | stat.S_ISGID | 0o2755 & 0o777, "grwxr-xr-x"),
        (stat.S_IFCHR | 0o666, "Dcrw-rw-rw-"),
        (stat.S_IFBLK | 0o660, "Drw-rw----"),
        (stat.S_IFIFO | 0o600, "prw-------"),
        (stat.S_IFSOCK | 0o755, "Srwxr-xr-x"),
        (stat.S_IFREG, "----------"),
    ],
)
def test_go_mode_string(mode: int, expected: str) -> None:
    assert wire.go_mode_string(mode) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0, {"exited": True, "status": "exit status 0"}),
        (
            3 << 8,
            {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"},
        ),
        (9, {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}),
        (15, {"exitCode": -1, "status": "signal: terminated", "error": "signal: terminated"}),
        (
            11 | 0x80,
            {
                "exitCode": -1,
                "status": "signal: segmentation fault (core dumped)",
                "error": "signal: segmentation fault (core dumped)",
            },
        ),
        (
            255 << 8,
            {
                "exitCode": 255,
                "exited": True,
                "status": "exit status 255",
                "error": "exit status 255",
            },
        ),
    ],
)
def test_end_event_matches_go_process_state(status: int, expected: dict[str, object]) -> None:
    assert wire.end_event(status) == expected


def test_base64_round_trip_and_lenient_decode() -> None:
    data = bytes(range(256))
    enc = wire.b64(data)
    assert enc.endswith("=") is (len(data) % 3 != 0)
    assert wire.unb64(enc) == data
    assert wire.unb64(enc.rstrip("=")) == data
    assert wire.unb64(enc.replace("+", "-").replace("/", "_")) == data
    assert wire.unb64("YWJjCg==") == b"abc\n"
    assert wire.unb64(None) == b""
    with pytest.raises(ValueError):
        wire.unb64("a")


def test_timestamp_like_go_protojson() -> None:
    assert wire.timestamp(0) == "1970-01-01T00:00:00Z"
    assert wire.timestamp(1_700_000_000, 500_000_000) == "2023-11-14T22:13:20.500Z"
    assert wire.timestamp(1_700_000_000, 1_000) == "2023-11-14T22:13:20.000001Z"
    assert wire.timestamp(1_700_000_000, 7) == "2023-11-14T22:13:20.000000007Z"


def test_field_reads_camel_or_snake() -> None:
    assert wire.field({"watcherId": "a"}, "watcherId", "watcher_id") == "a"
    assert wire.field({"watcher_id": "b"}, "watcherId", "watcher_id") == "b"
    assert wire.field({}, "watcherId", "watcher_id") is None


def test_entry_info_file_dir_symlink(tmp_path: object) -> None:
    base = str(tmp_path)
    f = os.path.join(base, "f.txt")
    with open(f, "w") as fh:
        fh.write("hello")
    os.chmod(f, 0o640)
    os.symlink(f, os.path.join(base, "ln"))
    os.symlink(os.path.join(base, "gone"), os.path.join(base, "dangling"))
    e = wire.entry_info(f)
    assert e["name"] == "f.txt" and e["path"] == f
    assert e["type"] == "FILE_TYPE_FILE"
    assert e["size"] == "5"  # int64 as a JSON string, like protojson
    assert e["mode"] == 0o640 and e["permissions"] == "-rw-r-----"
    assert e["modifiedTime"].endswith("Z")
    d = wire.entry_info(base)
    assert d["type"] == "FILE_TYPE_DIRECTORY" and d["permissions"].startswith("d")
    ln = wire.entry_info(os.path.join(base, "ln"))
    assert ln["isSymlink"] is True and ln["type"] == "FILE_TYPE_FILE"
    assert ln["symlinkTarget"] == f
    dang = wire.entry_info(os.path.join(base, "dangling"))
    assert dang["type"] == "FILE_TYPE_SYMLINK"
    empty = os.path.join(base, "empty")
    open(empty, "w").close()
    assert "size" not in wire.entry_info(empty)  # zero values are omitted
    with pytest.raises(FileNotFoundError):
        wire.entry_info(os.path.join(base, "nope"))


def test_entry_info_decodes_with_the_sdk(tmp_path: object) -> None:
    """What we emit parses with the SDK's own generated message class."""
    import json

    from e2b.envd.filesystem import filesystem_pb

    entry = wire.entry_info(str(tmp_path))
    msg = filesystem_pb.EntryInfo.from_json(json.dumps(entry))
    assert msg.path == str(tmp_path)
    assert msg.type == filesystem_pb.FileType.DIRECTORY
