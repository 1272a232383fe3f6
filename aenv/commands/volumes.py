"""`aenv volume create|ls|rm` and `aenv volume files ls|get|put|rm`: E2B's persistent
volumes (`Volume.*` of the e2b SDK), which sandboxes mount with `aenv start --volume
NAME:/path` (docs/volumes.md).

A volume is named per team; commands take its name or its ID. Its files are reachable
through the volume's own API while no sandbox mounts it (a mounted one answers exit 1:
read and write its files through that sandbox instead).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    ApiKey,
    ApiUrl,
    DataDir,
    connection,
    die,
    sdk_errors,
)
from aenv.config import Connection
from aenv.output import Format, emit

__all__ = ["volume_app"]

volume_app = typer.Typer(
    help="Persistent volumes: create, list, remove, and their files.",
    no_args_is_help=True,
)
files_app = typer.Typer(help="A volume's files, while no sandbox mounts it.", no_args_is_help=True)
volume_app.add_typer(files_app, name="files")

VolumeRef = Annotated[str, typer.Argument(help="Volume name or ID.", show_default=False)]
Output = Annotated[
    Format,
    typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
]


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """The SDK's volume errors (not `SandboxException`s) as exit codes, the rest as every
    command maps them."""
    from e2b.exceptions import NotFoundException, VolumeException

    with sdk_errors(what):
        try:
            yield
        except NotFoundException:
            raise
        except VolumeException as e:  # refused: in use, a name taken, a bad path
            text = str(e).strip().splitlines()
            die(f"{what}: {text[0] if text else type(e).__name__}", EXIT_FAILED)


def _volume(conn: Connection, ref: str) -> Any:
    """The volume `ref` names (its name, else its ID), connected (its token fetched)."""
    from e2b import Volume

    opts = conn.sdk_opts()
    by_name = {v.name: v.volume_id for v in Volume.list(**opts)}
    volume_id = by_name.get(ref, ref)
    return Volume.connect(volume_id, **opts)


def _content_opts(conn: Connection) -> dict[str, Any]:
    """The volume content API is the API's own URL (E2B's `E2B_VOLUME_API_URL`)."""
    return {"api_url": conn.api_url}


@volume_app.command("create")
def create(
    name: Annotated[
        str, typer.Argument(help="Volume name: letters, digits, '.', '_', '-'.", show_default=False)
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Create an empty volume; print its ID. Mount it with `aenv start --volume NAME:/path`."""
    from e2b import Volume

    conn = connection(api_url, api_key, data_dir)
    with _errors(f"volume create {name}"):
        vol = Volume.create(name, **conn.sdk_opts())
    typer.echo(vol.volume_id)


@volume_app.command("ls")
def ls(
    output: Output = Format.auto,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List the team's volumes. JSON rows: volume_id, name."""
    from e2b import Volume

    conn = connection(api_url, api_key, data_dir)
    with _errors("volume ls"):
        rows = [{"volume_id": v.volume_id, "name": v.name} for v in Volume.list(**conn.sdk_opts())]
    emit(rows, ["volume_id", "name"], output)


@volume_app.command("rm")
def rm(
    volumes: Annotated[
        list[str], typer.Argument(help="Volumes to destroy, by name or ID.", show_default=False)
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Destroy volumes and their content; exit 1 if one is unknown or still mounted."""
    from e2b import Volume

    conn = connection(api_url, api_key, data_dir)
    missing = []
    for ref in volumes:
        with _errors(f"volume rm {ref}"):
            by_name = {v.name: v.volume_id for v in Volume.list(**conn.sdk_opts())}
            if not Volume.destroy(by_name.get(ref, ref), **conn.sdk_opts()):
                missing.append(ref)
    if missing:
        die(f"no such volume: {', '.join(missing)}", EXIT_FAILED)


@files_app.command("ls")
def files_ls(
    volume: VolumeRef,
    path: Annotated[str, typer.Argument(help="Directory in the volume.")] = "/",
    depth: Annotated[
        int, typer.Option("--depth", "-d", min=1, max=16, help="Levels to descend.")
    ] = 1,
    output: Output = Format.auto,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List a directory of a volume. JSON rows: path, type, size, mode, uid, gid, mtime."""
    conn = connection(api_url, api_key, data_dir)
    with _errors(f"volume files ls {volume} {path}"):
        vol = _volume(conn, volume)
        entries = vol.list(path, depth=depth, **_content_opts(conn))
    rows = [
        {
            "path": e.path,
            "type": e.type.value,
            "size": e.size,
            "mode": f"{e.mode:04o}",
            "uid": e.uid,
            "gid": e.gid,
            "mtime": e.mtime.isoformat(),
        }
        for e in entries
    ]
    emit(rows, ["path", "type", "size", "mode", "uid", "gid", "mtime"], output)


@files_app.command("get")
def files_get(
    volume: VolumeRef,
    path: Annotated[str, typer.Argument(help="File in the volume.", show_default=False)],
    dest: Annotated[str, typer.Argument(help="Local file, or - for stdout.")] = "-",
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Copy a file out of a volume."""
    conn = connection(api_url, api_key, data_dir)
    with _errors(f"volume files get {volume} {path}"):
        vol = _volume(conn, volume)
        data = vol.read_file(path, format="bytes", **_content_opts(conn))
    if dest == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(dest).write_bytes(data)


@files_app.command("put")
def files_put(
    volume: VolumeRef,
    source: Annotated[
        Path, typer.Argument(help="Local file.", show_default=False, exists=True, dir_okay=False)
    ],
    path: Annotated[
        str,
        typer.Argument(help="Where in the volume (its directories are made).", show_default=False),
    ],
    mode: Annotated[
        str | None, typer.Option("--mode", help="Octal mode, e.g. 644.", show_default=False)
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Copy a local file into a volume (replacing one there)."""
    conn = connection(api_url, api_key, data_dir)
    bits = int(mode, 8) if mode is not None else None
    with _errors(f"volume files put {volume} {path}"), open(source, "rb") as f:
        vol = _volume(conn, volume)
        vol.write_file(path, f, mode=bits, force=True, **_content_opts(conn))


@files_app.command("rm")
def files_rm(
    volume: VolumeRef,
    path: Annotated[
        str, typer.Argument(help="File or directory (with its content).", show_default=False)
    ],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Remove a file or a directory from a volume."""
    conn = connection(api_url, api_key, data_dir)
    with _errors(f"volume files rm {volume} {path}"):
        _volume(conn, volume).remove(path, **_content_opts(conn))
