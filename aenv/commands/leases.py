"""`aenv lease create|renew|ls|rm`: leases over sandboxes (`api/leases.py`, docs/leases.md).

A training job opens a lease, creates its sandboxes with the metadata `aenv.lease=<id>`
and renews the lease while it runs; if it stops renewing, its sandboxes are killed (or
paused) when the TTL runs out. `aenv lease rm` ends one now and kills its sandboxes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from aenv.commands.common import DEFAULT_DATA, ApiKey, ApiUrl, DataDir, api_call

if TYPE_CHECKING:
    pass

__all__ = ["lease_app"]

lease_app = typer.Typer(
    help="Leases: one renewal keeps all their sandboxes alive; no renewal in time ends them.",
    no_args_is_help=True,
)
LeaseId = Annotated[str, typer.Argument(help="The lease's id (`aenv lease ls`).")]


@lease_app.command()
def create(
    ttl: Annotated[float, typer.Option(help="Seconds the lease lives unless renewed.")] = 300,
    on_expiry: Annotated[
        str, typer.Option(help="What its expiry does to its sandboxes: kill or pause.")
    ] = "kill",
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Open a lease and print its id (create sandboxes with `-m aenv.lease=<id>`)."""
    got = api_call(
        api_url, api_key, data_dir, "POST", "/leases", {"ttl": ttl, "onExpiry": on_expiry}
    )
    typer.echo(got["leaseID"])


@lease_app.command()
def renew(
    lease_id: LeaseId,
    ttl: Annotated[
        float | None, typer.Option(help="A new TTL from now on (default: the lease's).")
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Push the lease's deadline to now + its TTL; print the new deadline."""
    body = {"ttl": ttl} if ttl is not None else None
    got = api_call(api_url, api_key, data_dir, "POST", f"/leases/{lease_id}/renew", body)
    typer.echo(f"lease {lease_id} expires at {got['expiresAt']}")


@lease_app.command("ls")
def list_(
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List your leases, newest first: id, state, TTL, on expiry, sandboxes, deadline."""
    rows = api_call(api_url, api_key, data_dir, "GET", "/leases")
    typer.echo(f"{'LEASE':<24} {'STATE':<8} {'TTL':>8} {'ON EXPIRY':<9} {'SANDBOXES':>9}  EXPIRES")
    for r in rows:
        typer.echo(
            f"{r['leaseID']:<24} {r['state']:<8} {r['ttl']:>8g} {r['onExpiry']:<9} "
            f"{r['sandboxes']:>9}  {r['expiresAt']}"
        )


@lease_app.command("rm")
def rm(
    lease_id: LeaseId,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """End the lease now and kill its sandboxes; print how many."""
    got = api_call(api_url, api_key, data_dir, "DELETE", f"/leases/{lease_id}")
    n = got["count"]
    typer.echo(f"lease {lease_id} ended: killed {n} sandbox{'' if n == 1 else 'es'}")
