"""`aenv upload ID - PATH` (issue 16 #11): what comes down a pipe all reaches the file.

The CLI's sending half (`send_stream`) against a real envd, fed by a real pipe from a
`cat` process — what `cat f | aenv upload ID - PATH` hands it as stdin. (The whole command
through the control plane is in tests/e2e_cli, which needs VMs.)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import typer
from e2b import Sandbox

from aenv.commands.common import sdk_errors
from aenv.commands.exec import send_stream


def test_a_piped_upload_sends_every_byte(sandbox: Sandbox, workdir: str, tmp_path: Path) -> None:
    # larger than any pipe or read buffer, so it must be streamed, not read in one go
    blob = os.urandom(24 * 1024 * 1024 + 123)
    src = tmp_path / "blob"
    src.write_bytes(blob)
    target = f"{workdir}/piped.bin"
    with subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE) as cat:
        assert cat.stdout is not None
        sent = send_stream(sandbox, cat.stdout, target)
        got = Path(target).read_bytes()
    assert (len(got), hashlib.sha256(got).digest()) == (len(blob), hashlib.sha256(blob).digest())
    assert sent == len(blob)
    assert cat.returncode == 0


def test_an_empty_pipe_makes_an_empty_file(sandbox: Sandbox, workdir: str) -> None:
    target = f"{workdir}/empty.bin"
    with subprocess.Popen(["true"], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert send_stream(sandbox, proc.stdout, target) == 0
    assert Path(target).read_bytes() == b""


@pytest.mark.parametrize("size", [5, 16 * 1024 * 1024])
def test_a_refused_upload_exits_nonzero_with_the_reason(
    sandbox: Sandbox, workdir: str, capsys: pytest.CaptureFixture[str], size: int
) -> None:
    """envd refuses before reading the body (a parent of the path is a file): what the CLI
    prints is that reason, on one line, and its exit code is not 0 — also when the refusal
    comes while a large body is still being sent."""
    Path(workdir, "plain").write_text("a file, not a directory")
    target = f"{workdir}/plain/refused.bin"
    with subprocess.Popen(["head", "-c", str(size), "/dev/zero"], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        with pytest.raises(typer.Exit) as exit_, sdk_errors(f"upload {target}"):
            send_stream(sandbox, p.stdout, target)
        p.stdout.close()
    assert exit_.value.exit_code != 0
    err = capsys.readouterr().err
    assert "path is a file" in err.lower() and err.count("\n") == 1, err
    assert Path(workdir, "plain").read_text() == "a file, not a directory"
