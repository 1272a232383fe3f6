"""docs/settings.md is the registry's reference, regenerated: a setting added to the code
without a registry entry fails `test_settings_registry`, one added to the registry without
regenerating the file fails here (`aenv config reference > docs/settings.md`)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from aenv.cli import app
from aenv.settings import REGISTRY
from aenv.settings.reference import render

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_docs_settings_md_is_the_generated_reference() -> None:
    assert (DOCS / "settings.md").read_text() == render(), (
        "docs/settings.md is stale: run `aenv config reference > docs/settings.md`"
    )


def test_it_lists_every_setting_and_the_command_prints_it() -> None:
    text = render()
    for name in REGISTRY:
        assert f"| `{name}` |" in text, name
    r = CliRunner().invoke(app, ["config", "reference"])
    assert r.exit_code == 0 and r.output == text


def test_deploy_md_links_it() -> None:
    assert "(settings.md)" in (DOCS / "deploy.md").read_text()
