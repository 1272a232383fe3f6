"""Passwords the embedded servers are set up with: random, minted once per data dir and
kept in a 0600 file next to the server's data, so a restart (or `aenv up` after a reboot)
finds the same ones the server already holds."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

__all__ = ["load_or_mint", "write_private_file"]


def write_private_file(path: Path, text: str) -> None:
    """`text` in a file only its owner may read. The mode is set on the open descriptor,
    not only at creation: a file an older version left 0644 becomes 0600 as well."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), stat.S_IRUSR | stat.S_IWUSR)
        f.write(text)


def load_or_mint(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The secrets `names` saved in `path`, any missing one minted (hex: it goes into
    config files and SQL literals without quoting trouble) and the file rewritten."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    if not isinstance(saved, dict):
        saved = {}
    out = {n: v for n, v in saved.items() if isinstance(v, str) and _is_hex(v)}
    missing = [n for n in names if n not in out]
    for name in missing:
        out[name] = secrets.token_hex(24)
    if missing or stat.S_IMODE(path.stat().st_mode) != 0o600:
        write_private_file(path, json.dumps(out))
    return out


def _is_hex(value: str) -> bool:
    return bool(value) and all(c in "0123456789abcdef" for c in value)
