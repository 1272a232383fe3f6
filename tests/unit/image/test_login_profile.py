"""The base images' /etc/profile asks bash for the uid instead of forking `id`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workers.node.image.rootfs import tune_login_profile

DEBIAN_PROFILE = """\
if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH
"""


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    cached = tmp_path / "cache" / "etc" / "profile"
    cached.parent.mkdir(parents=True)
    cached.write_text(DEBIAN_PROFILE)
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    os.link(cached, tree / "etc" / "profile")  # as `cp -al` of the cached tree leaves it
    return tree, cached


def test_the_uid_comes_from_bash_and_the_cached_tree_is_untouched(tmp_path: Path) -> None:
    tree, cached = _tree(tmp_path)
    assert tune_login_profile(tree)
    text = (tree / "etc" / "profile").read_text()
    assert "$(id -u)" not in text.replace("${EUID:-$(id -u)}", "")
    assert cached.read_text() == DEBIAN_PROFILE  # a hard link into the cache: not edited
    assert not tune_login_profile(tree)  # done once


def test_the_tuned_profile_means_the_same_to_bash_and_to_dash(tmp_path: Path) -> None:
    tree, _ = _tree(tmp_path)
    tune_login_profile(tree)
    tuned = (tree / "etc" / "profile").read_text()
    for shell in ("bash", "sh"):
        old, new = (
            subprocess.run(
                [shell, "-c", text + 'echo "$PATH"'], capture_output=True, text=True, env={}
            )
            for text in (DEBIAN_PROFILE, tuned)
        )
        assert old.returncode == new.returncode == 0, (old.stderr, new.stderr)
        assert old.stdout == new.stdout, shell


def test_a_tree_without_a_profile_is_left_alone(tmp_path: Path) -> None:
    assert not tune_login_profile(tmp_path)
