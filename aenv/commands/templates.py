"""Templates from the command line: `aenv build` (a Dockerfile), `aenv pull` (a local OCI
image), `aenv template ls|rm`.

`build` uses E2B's template routes exactly as `e2b.Template.build()` does (request, upload
the COPY files, start, follow the status), so what works here works from the SDK and the
other way round. Progress goes to stderr, the template's name to stdout on success.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from aenv.commands.common import (
    DEFAULT_DATA,
    EXIT_FAILED,
    EXIT_SERVER,
    EXIT_USAGE,
    ApiKey,
    ApiUrl,
    DataDir,
    connection,
    die,
)
from aenv.output import Format, emit

if TYPE_CHECKING:
    from aenv.build_client import BuildClient, BuildResult

__all__ = ["register"]

template_app = typer.Typer(help="List and remove templates.", no_args_is_help=True)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _client(api_url: str | None, api_key: str | None, data_dir: Path) -> BuildClient:
    from aenv.build_client import BuildClient

    conn = connection(api_url, api_key, data_dir)
    return BuildClient(conn.api_url, conn.api_key)


class _Errors:
    """HTTP and build errors → one line and an exit code (1: the build failed; 3: server)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, _tb: Any
    ) -> Literal[False]:
        import httpx

        from aenv.build_client import BuildError, NoBuilds
        from aenv.commands.common import debug_requested
        from aenv.dockerfile import DockerfileError

        if e is None or isinstance(e, typer.Exit | KeyboardInterrupt) or debug_requested():
            return False
        if isinstance(e, NoBuilds):
            die(str(e), EXIT_FAILED)
        if isinstance(e, BuildError):
            at = f" at step {e.step}" if e.step else ""
            die(f"{self.what} failed{at}: {e}", EXIT_FAILED)
        if isinstance(e, DockerfileError):
            die(f"{self.what}: {e}", EXIT_FAILED)
        if isinstance(e, httpx.HTTPStatusError):
            code = e.response.status_code
            die(f"{self.what}: {e}", EXIT_FAILED if code in (400, 404, 409) else EXIT_SERVER)
        if isinstance(e, httpx.TransportError):
            die(f"{self.what}: cannot reach the aenv API: {e}", EXIT_SERVER)
        return False


def _pairs(values: list[str] | None) -> dict[str, str]:
    out = {}
    for v in values or []:
        k, sep, x = v.partition("=")
        if not sep or not k:
            die(f"--build-arg must be KEY=VALUE, got {v!r}", EXIT_USAGE)
        out[k] = x
    return out


def _image_path(base: str, context: Path) -> str | None:
    """FROM naming a local OCI layout or archive: its absolute path (else None: a template
    name, or a registry reference the server will refuse with a clear reason)."""
    for root in (context, Path.cwd()):
        p = (root / base).resolve()
        if p.exists():
            return str(p)
    return None


def build(
    dockerfile: Annotated[Path, typer.Argument(help="The Dockerfile.")] = Path("Dockerfile"),
    name: Annotated[
        str,
        typer.Option(
            "--name",
            "-n",
            help="Template name (a-z, 0-9, . _ -); "
            "sandboxes start from it with `aenv start NAME` or "
            'Sandbox.create("NAME"). Building a name again replaces it.',
            show_default=False,
        ),
    ] = "",
    context: Annotated[
        Path | None,
        typer.Option(
            "--context",
            "-c",
            help="Build context for COPY/ADD (default: the Dockerfile's directory).",
            show_default=False,
        ),
    ] = None,
    build_arg: Annotated[
        list[str] | None, typer.Option("--build-arg", help="KEY=VALUE for an ARG, repeatable.")
    ] = None,
    cpu: Annotated[
        int | None,
        typer.Option(
            "--cpu",
            help="vCPUs of the template's sandboxes (recorded; the base template's shape is kept).",
        ),
    ] = None,
    memory: Annotated[
        int | None,
        typer.Option(
            "--memory", help="Memory in MiB (recorded; the base template's shape is kept)."
        ),
    ] = None,
    disk: Annotated[
        int | None,
        typer.Option(
            "--disk",
            help="Free disk in MiB the sandboxes' root keeps beyond a FROM image "
            "(default: the node's, 8 GiB); a FROM template keeps its own disk.",
        ),
    ] = None,
    start_cmd: Annotated[
        str | None,
        typer.Option(
            "--start-cmd",
            help="Command started in "
            "the background before the snapshot; it keeps running in every "
            "sandbox (default: the Dockerfile's ENTRYPOINT/CMD).",
        ),
    ] = None,
    ready_cmd: Annotated[
        str | None,
        typer.Option(
            "--ready-cmd",
            help="Command that must succeed (retried up to 120 s) before the snapshot is taken.",
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Build template NAME from a Dockerfile: FROM a template (e.g. base) or a local OCI
    image; RUN, COPY/ADD (from the context), ENV, ARG, WORKDIR, USER. The steps run in a
    build sandbox, which is then snapshotted. Exits 1 if the build fails (reason printed)."""
    from aenv.dockerfile import parse

    if not name:
        die("a template needs a name: --name NAME", EXIT_USAGE)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,127}", name):
        die(f"invalid template name {name!r}: use a-z, 0-9, '.', '_', '-'", EXIT_USAGE)
    try:
        text = dockerfile.read_text()
    except OSError as e:
        die(f"cannot read {dockerfile}: {e.strerror}", EXIT_USAGE)
    ctx_dir = (context or dockerfile.parent).resolve()
    client = _client(api_url, api_key, data_dir)
    with _Errors(f"build {name}"):
        df = parse(text, _pairs(build_arg))
        for w in df.warnings:
            _progress(f"warning: {w}")
        image = _image_path(df.base, ctx_dir) if df.base != "base" else None
        if image is None and re.search(r"[:/@]", df.base):
            image = df.base  # a registry reference: the server says why it cannot pull it
        _progress(f"building {name} FROM {df.base} ({len(df.steps)} steps)")
        _ready(
            client.build(
                df,
                name,
                ctx_dir,
                progress=_progress,
                from_image=image,
                cpu=cpu,
                memory_mb=memory,
                disk_mb=disk,
                start_cmd=start_cmd,
                ready_cmd=ready_cmd,
            )
        )
    client.close()


def _ready(result: BuildResult) -> None:
    """A finished build: its time on stderr, the template id alone on stdout (scripts)."""
    _progress(f"template {result.template_id} ready in {result.seconds:.1f}s")
    print(result.template_id)


def pull(
    image: Annotated[
        str,
        typer.Argument(
            help="A registry reference (busybox, "
            "ghcr.io/org/img:tag, 127.0.0.1:5000/x:1), or a local OCI image layout "
            "(directory) or OCI archive (.tar).",
            show_default=False,
        ),
    ],
    name: Annotated[
        str,
        typer.Option(
            "--name",
            "-n",
            help="Template name (default: from the image's name).",
            show_default=False,
        ),
    ] = "",
    username: Annotated[
        str,
        typer.Option(
            "--username",
            "-u",
            help="Login of a private registry; the password is read from $AENV_REGISTRY_PASSWORD.",
            show_default=False,
        ),
    ] = "",
    disk: Annotated[
        int | None,
        typer.Option(
            "--disk",
            help="Free disk in MiB the sandboxes' root keeps beyond the image "
            "(default: the node's, 8 GiB).",
            min=1,
        ),
    ] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Make a template from an image: pulled from its registry (Docker Hub names as Docker
    reads them) or read from a local OCI layout/archive, converted to a guest image, booted
    once, snapshotted. envd runs on its own runtime: the image needs no Python or shell."""
    from aenv.dockerfile import Dockerfile

    path = Path(image)
    local = path.exists() or image.startswith((".", "/"))
    if local and not path.exists():
        die(f"{image}: no such file or directory", EXIT_USAGE)
    login = None
    if username:
        password = os.environ.get("AENV_REGISTRY_PASSWORD")
        if password is None:
            die("--username needs the password in $AENV_REGISTRY_PASSWORD", EXIT_USAGE)
        login = {"type": "registry", "username": username, "password": password}
    source = str(path.resolve()) if local else image
    stem = path.resolve().name.split(".")[0] if local else image.split("@")[0].rsplit("/", 1)[-1]
    stem = stem.split(":")[0].lower()
    name = name or re.sub(r"[^a-z0-9._-]", "-", stem).strip("-.") or "image"
    client = _client(api_url, api_key, data_dir)
    with _Errors(f"pull {image}"):
        _progress(f"importing {source} as template {name}")
        _ready(
            client.build(
                Dockerfile(base=source),
                name,
                Path.cwd(),
                progress=_progress,
                from_image=source,
                from_image_registry=login,
                disk_mb=disk,
            )
        )
    client.close()


@template_app.command("ls")
def template_ls(
    output: Annotated[
        Format,
        typer.Option("--output", "-o", help="table on a terminal, json when piped; or force one."),
    ] = Format.auto,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """List templates: `base` and the ones you built, with their last build's status."""
    client = _client(api_url, api_key, data_dir)
    with _Errors("template ls"):
        rows = [_row(t) for t in client.list()]
    client.close()
    emit(
        rows,
        ["name", "status", "cpu_count", "memory_mb", "builds", "updated_at", "failure"],
        output,
    )


def _row(t: dict[str, Any]) -> dict[str, Any]:
    reason, step = t.get("buildReason"), t.get("buildStep")
    failure = f"step {step}: {reason}" if reason and step else reason
    return {
        "name": t["templateID"],
        "template_id": t["templateID"],
        "status": t["buildStatus"],
        "cpu_count": t["cpuCount"],
        "memory_mb": t["memoryMB"],
        "builds": t["buildCount"],
        "build_id": t["buildID"],
        "updated_at": t["updatedAt"],
        "failure": failure or "",
    }


@template_app.command("logs")
def template_logs(
    name: Annotated[
        str, typer.Argument(help="Template whose build log to print.", show_default=False)
    ],
    build_id: Annotated[
        str,
        typer.Option("--build", help="A build of it (default: the latest).", show_default=False),
    ] = "",
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Print a build's log (running or finished): time, level, step, message per line."""
    client = _client(api_url, api_key, data_dir)
    with _Errors(f"template logs {name}"):
        entries, status = client.logs(name, build_id or None)
    client.close()
    for e in entries:
        step = f" [{e['step']}]" if e.get("step") else ""
        print(f"{e['timestamp']} {e['level']:5}{step} {e['message']}")
    if status.get("status") == "error":
        _progress(f"build failed: {status.get('reason', {}).get('message', '')}")
        raise typer.Exit(EXIT_FAILED)


@template_app.command("rm")
def template_rm(
    names: Annotated[list[str], typer.Argument(help="Templates to delete.", show_default=False)],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Delete templates (sandboxes already started from them keep running)."""
    client = _client(api_url, api_key, data_dir)
    for n in names:
        with _Errors(f"template rm {n}"):
            client.delete(n)
    client.close()


def register(app: typer.Typer) -> None:
    app.command()(build)
    app.command()(pull)
    app.add_typer(template_app, name="template")
