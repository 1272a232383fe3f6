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

from e2b import Sandbox

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
