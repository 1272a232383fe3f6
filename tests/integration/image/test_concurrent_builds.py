"""Two builders of the same cache entry at once (here envd's runtime disk, which a changed
envd makes new): one builds, the other waits and reuses it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import drop_image
from workers.node.image import GuestImage
from workers.node.image.build import default_envd_src
from workers.node.image.cache import cache_root, entry_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BUILDER = """
import sys
from pathlib import Path
from workers.node.image import build_runtime
rt = build_runtime(envd_src=Path(sys.argv[1]), progress=lambda m: print(m, flush=True))
print("DIGEST", rt.digest)
"""


def test_concurrent_builders_share_one_build(base_image: GuestImage, tmp_path: Path) -> None:
    envd = tmp_path / "envd"
    shutil.copytree(default_envd_src(), envd, ignore=shutil.ignore_patterns("__pycache__"))
    (envd / "_aenv_race_marker.py").write_text(f"# {tmp_path}\n")  # a digest of its own
    repo = Path(__file__).resolve().parents[3]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILDER, str(envd)],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    digests = {
        line.split()[1] for out in outs for line in out.splitlines() if line.startswith("DIGEST")
    }
    assert len(digests) == 1, outs
    builds = sum("envd runtime" in out and "ready" in out for out in outs)
    assert builds == 1, outs  # the second builder found the first one's result
    key = f"runtime-{digests.pop()}"
    assert entry_dir(cache_root(), key) is not None
    drop_image(key)
