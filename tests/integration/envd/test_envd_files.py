"""/files and filesystem.Filesystem through `sandbox.files`."""

from __future__ import annotations

import hashlib
import io
import os
import pwd
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, FileNotFoundException, InvalidArgumentException, Sandbox
from e2b.sandbox.filesystem.filesystem import FileType

from tests.integration.envd.conftest import Envd
from tests.support import eventually_sync

pytestmark = pytest.mark.timeout(30)


def test_write_and_read_text_bytes_gzip(sandbox: Sandbox, workdir: str, test_user: str) -> None:
    path = f"{workdir}/hello.txt"
    info = sandbox.files.write(path, "hello world")
    assert info.path == path
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.read(path) == "hello world"
    assert sandbox.files.read(path, format="bytes") == bytearray(b"hello world")
    assert sandbox.files.read(path, gzip=True) == "hello world"
    assert b"".join(sandbox.files.read(path, format="stream")) == b"hello world"
    st = os.stat(path)
    assert pwd.getpwuid(st.st_uid).pw_name == test_user


def test_relative_paths_resolve_in_home(sandbox: Sandbox, home: str) -> None:
    info = sandbox.files.write("rel-test.txt", "r")
    try:
        assert info.path == os.path.join(home, "rel-test.txt")
        assert sandbox.commands.run("cat rel-test.txt").stdout == "r"
    finally:
        sandbox.files.remove("rel-test.txt")


def test_write_files_multi_with_paths_in_filenames(sandbox: Sandbox, workdir: str) -> None:
    infos = sandbox.files.write_files(
        [
            {"path": f"{workdir}/d/a.txt", "data": "A"},
            {"path": f"{workdir}/d/sub/b.bin", "data": b"\x00\x01"},
        ]
    )
    assert [i.path for i in infos] == [f"{workdir}/d/a.txt", f"{workdir}/d/sub/b.bin"]
    assert sandbox.files.read(f"{workdir}/d/sub/b.bin", format="bytes") == bytearray(b"\0\1")


def test_octet_stream_upload_from_file_like_and_iterable(sandbox: Sandbox, workdir: str) -> None:
    data = os.urandom(100_000)
    sandbox.files.write(f"{workdir}/stream.bin", io.BytesIO(data))
    assert bytes(sandbox.files.read(f"{workdir}/stream.bin", format="bytes")) == data

    def chunks() -> Iterator[bytes]:
        yield b"abc"
        yield b"def"

    sandbox.files.write(f"{workdir}/iter.bin", chunks())
    assert sandbox.files.read(f"{workdir}/iter.bin") == "abcdef"
    sandbox.files.write(f"{workdir}/gz.bin", b"zipped" * 1000, gzip=True)
    assert sandbox.files.read(f"{workdir}/gz.bin") == "zipped" * 1000


def test_overwrite_and_read_missing_and_directory(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/f", "long content")
    sandbox.files.write(f"{workdir}/f", "short")
    assert sandbox.files.read(f"{workdir}/f") == "short"
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{workdir}/missing")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(workdir)


def test_metadata_xattrs(sandbox: Sandbox, workdir: str) -> None:
    try:
        os.setxattr(workdir, "user.probe", b"1")
    except OSError:
        pytest.skip("filesystem without user xattrs")
    info = sandbox.files.write(f"{workdir}/m.txt", "x", metadata={"Owner": "alice"})
    assert info.metadata == {"owner": "alice"}
    assert sandbox.files.get_info(f"{workdir}/m.txt").metadata == {"owner": "alice"}


def test_list_with_depth(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write_files(
        [
            {"path": f"{workdir}/l/a.txt", "data": "A"},
            {"path": f"{workdir}/l/sub/b.txt", "data": "BB"},
            {"path": f"{workdir}/l/sub/deep/c.txt", "data": "C"},
        ]
    )
    os.symlink(f"{workdir}/l/a.txt", f"{workdir}/l/link")
    one = sandbox.files.list(f"{workdir}/l")
    assert sorted(e.name for e in one) == ["a.txt", "link", "sub"]
    by_name = {e.name: e for e in one}
    assert by_name["sub"].type == FileType.DIR
    assert by_name["a.txt"].type == FileType.FILE
    assert by_name["a.txt"].size == 1
    assert by_name["a.txt"].permissions == "-rw-r--r--"
    assert by_name["a.txt"].mode == 0o644
    assert by_name["link"].type == FileType.SYMLINK
    assert by_name["link"].symlink_target == f"{workdir}/l/a.txt"
    two = sandbox.files.list(f"{workdir}/l", depth=2)
    assert sorted(e.path for e in two) == sorted(
        [
            f"{workdir}/l/a.txt",
            f"{workdir}/l/link",
            f"{workdir}/l/sub",
            f"{workdir}/l/sub/b.txt",
            f"{workdir}/l/sub/deep",
        ]
    )
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(f"{workdir}/nope")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(f"{workdir}/l/a.txt")


def test_exists_info_mkdir_rename_remove(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/a.txt", "A")
    assert sandbox.files.exists(f"{workdir}/a.txt") is True
    assert sandbox.files.exists(f"{workdir}/nope") is False
    info = sandbox.files.get_info(f"{workdir}/a.txt")
    assert info.name == "a.txt" and info.size == 1 and info.type == FileType.FILE
    assert info.modified_time.year >= 2024
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{workdir}/nope")
    assert sandbox.files.make_dir(f"{workdir}/newdir/x") is True
    assert sandbox.files.make_dir(f"{workdir}/newdir/x") is False
    assert sandbox.files.get_info(f"{workdir}/newdir").permissions == "drwxr-xr-x"
    moved = sandbox.files.rename(f"{workdir}/a.txt", f"{workdir}/sub/c.txt")
    assert moved.path == f"{workdir}/sub/c.txt"
    assert sandbox.files.exists(f"{workdir}/a.txt") is False
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{workdir}/a.txt", f"{workdir}/z.txt")
    sandbox.files.remove(f"{workdir}/sub/c.txt")
    sandbox.files.remove(f"{workdir}/sub/c.txt")  # missing: not an error
    sandbox.files.remove(f"{workdir}/newdir")
    assert sandbox.files.exists(f"{workdir}/newdir") is False


def test_signed_urls(envd: Envd, sandbox: Sandbox, workdir: str) -> None:
    up = sandbox.upload_url(f"{workdir}/signed.txt", use_signature_expiration=60)
    r = httpx.post(up, files={"file": ("signed.txt", b"via-url")})
    assert r.status_code == 200, r.text
    down = sandbox.download_url(f"{workdir}/signed.txt")
    r = httpx.get(down)
    assert r.status_code == 200 and r.content == b"via-url"
    assert httpx.get(down.replace("signature=v1_", "signature=v1_x")).status_code == 401
    bare = f"{envd.url}/files?path={workdir}/signed.txt"
    assert httpx.get(bare).status_code == 401
    expired = sandbox.download_url(f"{workdir}/signed.txt", use_signature_expiration=-10)
    r = httpx.get(expired)
    assert (r.status_code, r.json()) == (
        401,
        {"code": 401, "message": "signature is already expired"},
    )
    # what envd's generated router says of an expiry it cannot parse: Go's http.Error
    r = httpx.get(down + "&signature_expiration=soon")
    assert r.status_code == 400
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.text == (
        "Invalid format for parameter signature_expiration: error binding string parameter: "
        'strconv.ParseInt: parsing "soon": invalid syntax\n'
    )


def test_a_form_posted_to_an_upload_url_writes_only_its_file(
    sandbox: Sandbox, workdir: str
) -> None:
    """A browser's form has fields beside its `file`: E2B's envd writes the `file` part
    alone (a field must not overwrite the file the URL names) and answers `[]` for a form
    with no file at all."""
    up = sandbox.upload_url(f"{workdir}/form.txt")
    body = (
        b'--b\r\nContent-Disposition: form-data; name="before"\r\n\r\nfield one\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nthe file\r\n'
        b'--b\r\nContent-Disposition: form-data; name="after"\r\n\r\nfield two\r\n--b--\r\n'
    )
    form = {"Content-Type": "multipart/form-data; boundary=b"}
    r = httpx.post(up, content=body, headers=form)
    assert r.status_code == 200, r.text
    assert r.json() == [{"path": f"{workdir}/form.txt", "name": "form.txt", "type": "file"}]
    assert sandbox.files.read(f"{workdir}/form.txt") == "the file"
    r = httpx.post(up, files={"note": (None, "only a field")})
    assert (r.status_code, r.json()) == (200, [])
    assert sandbox.files.read(f"{workdir}/form.txt") == "the file"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_100mib_round_trip_with_checksum(sandbox: Sandbox, envd: Envd, workdir: str) -> None:
    size = 100 * 1024 * 1024
    block = os.urandom(1024 * 1024)
    src = hashlib.sha256()

    def chunks() -> Iterator[bytes]:
        for i in range(size // len(block)):
            piece = block[i:] + block[:i]
            src.update(piece)
            yield piece

    sandbox.files.write(f"{workdir}/big.bin", chunks())
    assert os.path.getsize(f"{workdir}/big.bin") == size
    dst = hashlib.sha256()
    got = 0
    with sandbox.files.read(f"{workdir}/big.bin", format="stream") as stream:
        for chunk in stream:
            dst.update(chunk)
            got += len(chunk)
    assert got == size
    assert dst.hexdigest() == src.hexdigest()
    # multipart upload of a file object goes through the streaming parser too
    with open(f"{workdir}/big.bin", "rb") as f:
        sandbox.files.write_files(
            [{"path": f"{workdir}/big2.bin", "data": f}], use_octet_stream=False
        )
    with open(f"{workdir}/big2.bin", "rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == src.hexdigest()
    # streamed both ways: envd's peak memory stays far below the file size
    with open(f"/proc/{envd.proc.pid}/status") as st:
        peak_kib = next(int(x.split()[1]) for x in st if x.startswith("VmHWM:"))
    assert peak_kib < 80 * 1024, f"envd peak RSS {peak_kib} KiB"


def test_read_file_without_a_size(sandbox: Sandbox) -> None:
    """procfs files report size 0; their content must still arrive. (`self` is envd, also
    for what runs in a forked child: one that is gone cannot be read.)"""
    for _ in range(10):
        text = sandbox.files.read("/proc/self/status")
        assert "Name:" in text


async def test_async_files(async_sandbox: AsyncSandbox, workdir: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"async-"
        yield b"chunks"

    await async_sandbox.files.write(f"{workdir}/a.bin", chunks())
    assert await async_sandbox.files.read(f"{workdir}/a.bin") == "async-chunks"
    info = await async_sandbox.files.write(f"{workdir}/b.txt", "plain")
    assert info.path == f"{workdir}/b.txt"
    entries = await async_sandbox.files.list(workdir)
    assert sorted(e.name for e in entries) == ["a.bin", "b.txt"]
    assert await async_sandbox.files.read(f"{workdir}/b.txt", gzip=True) == "plain"


def test_reading_a_file_that_is_being_rewritten_never_hangs(sandbox: Sandbox, workdir: str) -> None:
    """A file truncated and rewritten all the time (a counter a guest process keeps
    writing): every read answers at once, with a version or the part of one a racing write
    had put there (never a length it no longer has). envd used to
    announce the size it saw, then send what was left after a truncation: the client waited
    for the missing bytes until its read timeout (seen in the pause e2e test)."""
    path = f"{workdir}/rewritten.txt"
    versions = [str(n).encode() * 20_000 for n in range(10)]
    rewrite = (
        "import sys\n"
        "vs = [str(n).encode() * 20_000 for n in range(10)]\n"
        "n = 0\n"
        "while True:\n"
        "    with open(sys.argv[1], 'wb') as f:\n"
        "        f.write(vs[n % 10])\n"
        "    n += 1\n"
    )
    with open(path, "wb") as f:
        f.write(versions[0])
    writer = subprocess.Popen([sys.executable, "-c", rewrite, path])
    try:
        # the writer has started (a loaded CI host may take a while to schedule it)
        eventually_sync(lambda: Path(path).read_bytes()[:1] not in (b"", b"0"), timeout=60)
        for _ in range(500):
            got = bytes(sandbox.files.read(path, format="bytes", request_timeout=3))
            assert any(v.startswith(got) for v in versions)  # a version, or part of one
    finally:
        writer.kill()
        writer.wait()
