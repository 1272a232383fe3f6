"""`aenv config check FILE` and `aenv config reference`: the settings registry
(`aenv.settings`) put to an operator's use before a role starts with a wrong env file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aenv.commands.common import EXIT_FAILED, EXIT_USAGE

__all__ = ["config_app"]

config_app = typer.Typer(
    help="Check an env file against the AENV_* settings aenv reads; print their reference.",
    no_args_is_help=True,
)


@config_app.command("check")
def check(
    file: Annotated[
        Path, typer.Argument(help="An env file: systemd EnvironmentFile= or compose .env.")
    ],
) -> None:
    """Report unknown AENV_* names (with the closest known one), values of the wrong type
    or out of range, and lines that are not NAME=value. Exit 1 on any error, 0 otherwise
    (warnings: a name set twice)."""
    from aenv.settings.check import check_assignments, parse
    from aenv.settings.validate import class_findings  # every role's settings: slow import

    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        typer.echo(f"aenv: config check: cannot read {file}: {e}", err=True)
        raise typer.Exit(EXIT_USAGE) from e
    assignments, findings = parse(text)
    findings += check_assignments(assignments)
    judged = frozenset(f.name for f in findings if f.error)
    findings += class_findings(assignments, skip=judged)
    findings.sort(key=lambda f: f.line)
    for finding in findings:
        typer.echo(finding.render(str(file)))
    errors = sum(f.error for f in findings)
    warnings = len(findings) - errors
    checked = sum(a.name.startswith("AENV_") for a in assignments)
    typer.echo(f"{file}: {checked} AENV_* settings, {errors} errors, {warnings} warnings")
    if errors:
        raise typer.Exit(EXIT_FAILED)


@config_app.command("reference")
def reference() -> None:
    """Print the settings reference (docs/settings.md) as markdown."""
    from aenv.settings.reference import render

    typer.echo(render(), nl=False)
