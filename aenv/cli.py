"""The `aenv` command line. Exit codes: 0 ok, 1 the command failed in the sandbox, 2 usage,
3 server or network error, 124 a command's `exec -t` passed — each with a one-line message
(`--debug` shows tracebacks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from typer.exceptions import TyperException

from aenv.commands import register as register_sandbox_commands
from aenv.commands.config import config_app
from aenv.ops import register as register_operator_commands
from aenv.ops.eventlog import log_app
from aenv.ops.health import stack_problems
from aenv.ops.stack import pid_alive as _pid_alive
from aenv.ops.stack import running_stack
from aenv.ops.stack import stack_info as _stack_info
from aenv.version import version

app = typer.Typer(
    help="aenv: E2B-compatible microVM sandboxes for agentic RL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
projections_app = typer.Typer(help="Postgres read models.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")
app.add_typer(config_app, name="config")
register_sandbox_commands(app)  # auth, start, cn, exec, …, snapshot (issue 6)
register_operator_commands(app)  # events, keys
app.add_typer(log_app, name="log")  # backup, restore of the event log (issue 30)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"aenv {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """aenv: E2B-compatible microVM sandboxes for agentic RL."""


DEFAULT_DATA = Path(os.environ.get("AENV_DATA_DIR", "/var/lib/aenv"))
DataDir = Annotated[Path, typer.Option("--data-dir", help="Where the stack keeps its state.")]


def fail(msg: str, code: int = 3) -> NoReturn:
    typer.echo(f"aenv: {msg}", err=True)
    raise typer.Exit(code)


@app.command()
def up(
    data_dir: DataDir = DEFAULT_DATA,
    port: Annotated[int, typer.Option(help="Port of the API and sandbox proxy.")] = 3000,
    tls_port: Annotated[
        int,
        typer.Option(
            help="Port of the same over HTTPS, for https://api.{domain} and "
            "{port}-{sandboxId}.{domain} (AENV_SANDBOX_DOMAIN, else aenv.localhost: a local CA "
            "signs its certificate); 0: no HTTPS.",
            envvar="AENV_TLS_PORT",
        ),
    ] = 8443,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the stack.")] = 900,
    code_interpreter: Annotated[
        bool,
        typer.Option(
            "--code-interpreter",
            help="Also serve E2B's code-interpreter-v1 template (e2b-code-interpreter's "
            "default; built on first use, a few minutes, then cached).",
        ),
    ] = False,
) -> None:
    """Start aenv in the background (embedded NATS, Postgres and S3 unless AENV_NATS_URL,
    AENV_DATABASE_URL, AENV_S3_ENDPOINT point elsewhere), build the default template if it is
    missing, and print the E2B_* settings to use it."""
    if (info := _stack_info(data_dir)) is not None:
        _print_env(info, data_dir)
        typer.echo(f"# aenv is already running (pid {info['pid']})", err=True)
        return
    from aenv.stack.records import stop_leftovers, supervisor_alive  # only when it runs

    if supervisor_alive(data_dir):  # starting (no stack.json yet) or stopping
        fail(
            f"an aenv supervisor is starting or stopping under {data_dir}; "
            "wait for it, or aenv down"
        )
    if left := stop_leftovers(data_dir, 30):  # its supervisor was SIGKILLed: start clean
        typer.echo(f"# stopped what a dead aenv left running: {', '.join(left)}", err=True)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = data_dir / "aenv.log"  # the stack's own log: it may hold secrets, like stack.json
    env = {
        **os.environ,
        "AENV_DATA_DIR": str(data_dir),
        "AENV_PORT": str(port),
        "AENV_TLS_PORT": str(tls_port),
        "AENV_HOST": host,
        "AENV_LOG_FILE": str(log),
    }
    if code_interpreter:
        env["AENV_CODE_INTERPRETER"] = "1"
    with open(log, "ab") as out:
        os.fchmod(out.fileno(), 0o600)
        start = out.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.serve"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    (data_dir / "aenv.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    seen = start
    while True:
        if log.stat().st_size < seen:  # rotated (`AENV_LOG_MAX_MB`): the new file from its start
            seen = 0
        with open(log, "rb") as f:
            f.seek(seen)
            chunk = f.read()
        chunk = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only: the last may be half written
        seen += len(chunk)
        for line in chunk.decode(errors="replace").splitlines():
            shown = _progress(line)
            if shown is None:
                continue  # structured logs stay in the log file
            if shown.startswith("AENV-READY"):
                info = _stack_info(data_dir)
                if info is None:
                    fail("the stack said it was ready but left no stack.json")
                _print_env(info, data_dir)
                return
            typer.echo(f"# {shown}", err=True)
        if proc.poll() is not None:
            fail(f"aenv exited during start-up (code {proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            proc.terminate()
            fail(f"aenv not ready after {timeout:.0f}s; see {log}")
        time.sleep(0.2)


def _progress(line: str) -> str | None:
    """What `aenv up` shows of a line of the stack's log: a progress record's message, or a
    line that is no record at all (a supervisor that died before its log was set up)."""
    from aenv.logformat import PROGRESS, message_of

    logger, msg = message_of(line)
    return msg or None if logger in (PROGRESS, None) else None


def read_exports(printed: str) -> dict[str, str]:
    """The `export K=V` lines `aenv up` prints (`_print_env`), read back: tests and benches
    point the SDK at the stack they started with them."""
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in printed.splitlines()
        if line.startswith("export ")
    )


def _print_env(info: dict[str, object], data_dir: Path) -> None:
    # E2B's volume content API (`Volume.read_file` …) is this API too: its SDKs go to
    # E2B_VOLUME_API_URL (a stack.json of an older aenv has none: the API's URL it is)
    info = {"E2B_VOLUME_API_URL": info["E2B_API_URL"], **info}
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY"):
        typer.echo(f"export {k}={info[k]}")
    # HTTPS by name (`aenv.tls`): what clients that never set the URLs above need
    tls = [k for k in ("E2B_DOMAIN", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS") if k in info]
    for k in tls:
        typer.echo(f"export {k}={info[k]}")
    if tls:
        typer.echo(
            f"# over HTTPS: https://api.{info['E2B_DOMAIN']} and sandboxes by name "
            "(unset E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL to use only that)",
            err=True,
        )


@app.command()
def down(data_dir: DataDir = DEFAULT_DATA, timeout: float = 60) -> None:
    """Stop the stack started by `aenv up` (sandboxes are stopped with it), or what is left
    of it when its supervisor died."""
    from aenv.stack.records import stop_leftovers  # the server's package: only when it runs

    info = _stack_info(data_dir)
    if info is None:
        left = stop_leftovers(data_dir, timeout)
        (data_dir / "stack.json").unlink(missing_ok=True)
        typer.echo(
            f"aenv's supervisor was gone; stopped {', '.join(left)}"
            if left
            else "aenv is not running"
        )
        return
    pid = int(str(info["pid"]))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    stop_leftovers(data_dir, 10)  # a SIGKILLed supervisor's roles and servers
    (data_dir / "stack.json").unlink(missing_ok=True)
    typer.echo("aenv stopped")


@app.command()
def status(data_dir: DataDir = DEFAULT_DATA) -> None:
    """The stack and its fleet: the nodes, their room, accelerator and sandboxes (from the
    nodes bucket), and — for a stack `aenv up` started — its roles and the API's readiness.
    On a fleet machine (no stack.json) AENV_NATS_URL says where the bus is. Exits 1 when
    nothing runs, 3 when something is down (named on stderr)."""
    import asyncio

    from aenv.ops.fleet import fleet_view, read_beats

    info = _stack_info(data_dir)
    nats_url = str(info["nats_url"]) if info is not None else os.environ.get("AENV_NATS_URL")
    if info is None and not nats_url:
        typer.echo("aenv is not running")
        raise typer.Exit(1)
    try:
        fleet = fleet_view(asyncio.run(read_beats(str(nats_url))), time.time())
    except Exception as e:  # the bus is down: say so, with the rest
        fleet = {"error": f"cannot read the nodes bucket: {type(e).__name__}: {e}"}
    problems: list[str] = [str(fleet["error"])] if "error" in fleet else []
    if not fleet.get("beating", 1):
        problems.append("no node is beating")
    problems += [
        f"node {n['node']} is gone (last beat {n['last_beat_s']} s ago)"
        for n in fleet.get("nodes", [])
        if n["state"] == "gone"
    ]
    if info is None:
        typer.echo(json.dumps({"fleet": fleet}, indent=2))
    else:
        ready = _readiness(str(info["E2B_API_URL"]))
        shown = {k: v for k, v in info.items() if k not in ("E2B_API_KEY", "metrics_token")}
        typer.echo(json.dumps({**shown, "ready": ready, "fleet": fleet}, indent=2))
        problems = stack_problems(info, ready) + problems
    if problems:
        fail("; ".join(dict.fromkeys(problems)))


def _readiness(api_url: str) -> dict[str, object]:
    """The API's `/health/ready` answer (its checks), or why there is none."""
    import httpx

    try:
        r = httpx.get(f"{api_url}/health/ready", timeout=5)
        body: dict[str, object] = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return {"code": 503, "message": f"the API does not answer ({type(e).__name__})"}
    return body


@projections_app.command("rebuild")
def projections_rebuild(data_dir: DataDir = DEFAULT_DATA) -> None:
    """Refold every read model from sequence 0, compare with the live tables, swap."""
    import asyncio

    from bus import Bus, BusSettings
    from projections import all_projections, create_engine, rebuild

    info = running_stack(data_dir)

    async def run() -> bool:
        settings = BusSettings(nats_url=str(info["nats_url"]))
        bus = await Bus.connect(settings, setup=False, retry=False)
        engine = create_engine(str(info["database_url"]))
        ok = True
        try:
            for p in all_projections():
                r = await rebuild(engine, bus.js, settings, p)
                ok = ok and r.identical
                typer.echo(
                    f"{r.projection}: {sum(r.rows.values())} rows at seq {r.seq}, "
                    f"{'identical' if r.identical else f'DIFFERS {r.differences}'}, "
                    f"{r.seconds:.2f}s"
                )
        finally:
            await engine.dispose()
            await bus.close()
        return ok

    if not asyncio.run(run()):
        raise typer.Exit(1)


@app.command()
def serve(
    role: Annotated[
        str,
        typer.Option(
            help="What this machine runs: `api` (HTTP API, envd "
            "proxy, projections, timer, builds), `node` (microVMs), "
            "or `all` (a whole stack, supervised, as aenv up)."
        ),
    ] = "all",
    data_dir: DataDir = DEFAULT_DATA,
) -> None:
    """Run one role in the foreground until SIGTERM, for a service manager (systemd,
    Kubernetes). Every connection comes from the environment: AENV_NATS_URL (several
    servers: comma-separated), AENV_DATABASE_URL, AENV_S3_ENDPOINT… (docs/deploy.md)."""
    from aenv.serve import ROLES
    from aenv.serve import main as serve_main

    if role not in ROLES:
        fail(f"--role must be one of {', '.join(ROLES)}, not {role!r}", 2)
    os.environ["AENV_DATA_DIR"] = str(data_dir)
    serve_main(role)


@app.command()
def schema() -> None:
    """JSON Schema of every command and event, for pipelines that publish to NATS."""
    from bus import export_json_schema

    typer.echo(json.dumps(export_json_schema(), indent=2))


def _usage(e: TyperException) -> str:
    """A usage error (Typer's click's UsageError: bad or missing arguments, an unknown
    command) as one line naming the command and where its help is — Typer's own is the usage
    text and a box of several lines."""
    ctx = getattr(e, "ctx", None)
    sub = ctx.command_path[len(ctx.find_root().command_path) :].strip() if ctx else ""
    text = " ".join(e.format_message().split())
    if ctx is None:  # not a usage error: no command to send the user to
        return f"aenv: {text}"
    return f"aenv: {sub + ': ' if sub else ''}{text} (see `{f'aenv {sub}'.strip()} --help`)"


def main() -> None:
    head = sys.argv[: sys.argv.index("--")] if "--" in sys.argv else sys.argv
    debug = "--debug" in head  # after `--`, arguments belong to the guest (aenv exec)
    if debug:
        sys.argv.remove("--debug")
    try:
        # not standalone: usage errors come here to be said in one line; an Exit (ours,
        # --help, Ctrl-C's 130) comes back as its code
        code = app(standalone_mode=False)
    except TyperException as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.exit(e.exit_code)  # the help is out already
        typer.echo(_usage(e), err=True)
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aenv: aborted", err=True)
        sys.exit(1)
    except SystemExit:
        raise
    except Exception as e:
        if debug:
            raise
        # outside Typer's own handling now: a typer.Exit would surface as a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        typer.echo(f"aenv: {type(e).__name__}: {first}", err=True)
        sys.exit(3)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
