"""COPY: which files of an uploaded build-context archive land where in the guest.

The archive of one COPY step holds the files its source pattern matched, at their paths
relative to the build context (what the E2B SDK's `tar_file_stream` and `aenv build` both
upload). Placement follows Docker's rules:

* a directory source copies its *contents* into the destination;
* a file source goes to `dest/<name>` when `dest` ends in `/` (or several sources matched),
  else to `dest` itself;
* a relative destination is relative to the current WORKDIR.

`plan_copy` is pure (unit-tested); `repack` writes the guest-side archive with the final
absolute paths, so the guest only has to run `tar -x -C /`.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CopyError", "Placement", "plan_copy", "repack"]


class CopyError(Exception):
    """The archive does not hold what the COPY step names (message is user-facing)."""


@dataclass(frozen=True)
class Placement:
    member: str  # path in the uploaded archive
    target: str  # absolute path in the guest


def _norm(p: str) -> str:
    """Archive and pattern paths compared alike: no `./` or `/` prefix, normalised."""
    while p.startswith("./"):
        p = p[2:]
    return posixpath.normpath(p.lstrip("/")) if p.strip("/") else "."


def plan_copy(members: list[str], src: str, dest: str, workdir: str = "/") -> list[Placement]:
    """Where each archive member goes for `COPY src dest` (members are archive paths)."""
    names = sorted({_norm(m) for m in members if _norm(m) != "."})
    base = posixpath.join(workdir or "/", dest) if not dest.startswith("/") else dest
    into_dir = dest.endswith("/") or dest in (".", "")
    base = posixpath.normpath(base)
    pattern = _norm(src)
    if any(c in pattern for c in "*?["):
        roots = sorted({n for n in names if fnmatch.fnmatchcase(n, pattern)})
        into_dir = True
    elif pattern == ".":
        roots = ["."]
    else:
        present = pattern in names or any(n.startswith(pattern + "/") for n in names)
        roots = [pattern] if present else []
    if not roots:
        raise CopyError(f"COPY {src}: no such file or directory in the build context")
    if len(roots) > 1:
        into_dir = True
    out: list[Placement] = []
    for root in roots:
        children = [n for n in names if root == "." or n.startswith(root + "/")]
        if root != "." and not children:  # a file (or an empty directory)
            target = posixpath.join(base, posixpath.basename(root)) if into_dir else base
            out.append(Placement(root, target))
            continue
        for n in children:  # a directory: its contents, not itself
            rel = n if root == "." else n[len(root) + 1 :]
            out.append(Placement(n, posixpath.join(base, rel)))
    return out


def repack(
    archive: Path, src: str, dest: str, workdir: str, *, owner: str = "", mode: int | None = None
) -> tuple[bytes, int]:
    """An uncompressed tar with the planned members at their guest paths (relative to `/`),
    owned by `owner` (`user[:group]`, by name: tar extracting as root applies it) or root,
    with `mode` on every entry if given; and the number of entries."""
    user, _, group = owner.partition(":")
    try:
        with tarfile.open(archive, "r:*") as tin:
            members = {_norm(m.name): m for m in tin.getmembers()}
            plan = plan_copy(list(members), src, dest, workdir)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tout:
                for p in plan:
                    m = members[p.member]
                    entry = tarfile.TarInfo(p.target.lstrip("/"))
                    for attr in ("size", "mode", "type", "linkname", "mtime"):
                        setattr(entry, attr, getattr(m, attr))
                    entry.uid = entry.gid = 0
                    entry.uname, entry.gname = (user or "root"), (group or user or "root")
                    if mode is not None:
                        entry.mode = mode
                    tout.addfile(entry, tin.extractfile(m) if m.isreg() else None)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CopyError(f"COPY {src}: unreadable build-context archive ({e})") from e
    return buf.getvalue(), len(plan)
