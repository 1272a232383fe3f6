"""An OCI image's config becomes its template's defaults (pure: a tree on disk, no VM)."""

from __future__ import annotations

from pathlib import Path

from workers.node.image.oci import image_defaults


def _tree(tmp: Path, passwd: str) -> Path:
    (tmp / "etc").mkdir(parents=True)
    (tmp / "etc/passwd").write_text(passwd)
    return tmp


def test_config_becomes_defaults(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t", "root:x:0:0::/root:/bin/sh\napp:x:1500:1500::/srv:/bin/sh\n")
    cfg = {
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "GREETING=hi=there", "EMPTY="],
            "User": "1500:1500",
            "WorkingDir": "/srv/app",
            "Entrypoint": ["/never/run"],
        }
    }
    assert image_defaults(cfg, tree) == {
        "env": {"PATH": "/usr/bin:/bin", "GREETING": "hi=there", "EMPTY": ""},
        "user": "app",
        "workdir": "/srv/app",
    }


def test_an_unknown_user_or_missing_config_leaves_the_e2b_defaults(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t", "root:x:0:0::/root:/bin/sh\n")
    assert image_defaults({"config": {"User": "nobody"}}, tree)["user"] is None
    assert image_defaults({}, tree) == {"env": {}, "user": None, "workdir": None}


def test_the_images_passwd_is_read_inside_the_tree(tmp_path: Path) -> None:
    """An untrusted image's /etc/passwd may be a symlink out of the tree: it resolves
    inside the tree (where nothing is), never to the host's file."""
    tree = tmp_path / "t"
    (tree / "etc").mkdir(parents=True)
    (tree / "aenv-test-users").write_text("app:x:1500:1500::/srv:/bin/sh\n")
    (tree / "etc/passwd").symlink_to("/aenv-test-users")  # absolute: the guest's root
    assert image_defaults({"config": {"User": "1500"}}, tree)["user"] == "app"
    (tree / "etc/passwd").unlink()
    (tree / "etc/passwd").symlink_to("/etc/passwd")  # a loop inside the tree, not the host's
    assert image_defaults({"config": {"User": "root"}}, tree)["user"] is None
