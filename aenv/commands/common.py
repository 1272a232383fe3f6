"""What every sandbox command shares: connection options, and the one place where SDK and
network errors become exit codes with a one-line message.

Exit codes: 0 ok; 1 the command failed in the sandbox (or the sandbox/file is not there);
2 usage (bad arguments, nothing configured); 3 server or network error; 124 a command's
`--timeout` passed (as `timeout(1)`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from aenv.config import DEFAULT_DATA_DIR, ConfigError, Connection, resolve

__all__ = [
    "DEFAULT_DATA",
    "EXIT_FAILED",
    "EXIT_SERVER",
    "EXIT_TIMED_OUT",
    "EXIT_USAGE",
    "ApiKey",
    "ApiUrl",
    "DataDir",
    "SandboxId",
    "api_call",
    "call",
    "connection",
    "die",
    "die_refused",
    "no_such_sandbox",
    "pairs",
    "sdk_errors",
]

EXIT_FAILED, EXIT_USAGE, EXIT_SERVER = 1, 2, 3
#: a guest command ran past its `--timeout` and was killed: timeout(1)'s code, so scripts
#: tell it from the command's own failure and from the server's
EXIT_TIMED_OUT = 124

ApiUrl = Annotated[
    str | None,
    typer.Option(
        "--api-url",
        help="aenv API URL (overrides AENV_API_URL, E2B_API_URL, "
        "the credentials file and the local stack).",
        show_default=False,
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="API key (overrides AENV_API_KEY, E2B_API_KEY, "
        "the credentials file and the local stack).",
        show_default=False,
    ),
]
DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        help="A local stack's state dir: its stack.json is the last fallback for URL and key.",
    ),
]
DEFAULT_DATA = DEFAULT_DATA_DIR
SandboxId = Annotated[str, typer.Argument(help="ID of the sandbox.", show_default=False)]


def die(msg: str, code: int) -> NoReturn:
    """One line on stderr, then the exit code: users and scripts see the same thing."""
    typer.echo(f"aenv: {msg}", err=True)
    raise typer.Exit(code)


def die_refused(path: str, status: int, body: str) -> NoReturn:
    """Exit with the API's own words for a refused call (E2B's `{code, message}` body, or
    the body as it came when it is not that)."""
    import json

    try:
        message = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        message = body
    die(f"{path}: {status} {message}", EXIT_SERVER)


def debug_requested() -> bool:
    """`aenv.cli.main` strips `--debug` from `sys.argv` before Typer parses it, so look at
    the interpreter's original argv (only before `--`: after it, arguments are the guest's)."""
    argv = list(sys.orig_argv)
    head = argv[: argv.index("--")] if "--" in argv else argv
    return "--debug" in head


def connection(api_url: str | None, api_key: str | None, data_dir: Path) -> Connection:
    try:
        return resolve(api_url, api_key, data_dir)
    except ConfigError as e:
        die(str(e), EXIT_USAGE)


def api_call(
    api_url: str | None,
    api_key: str | None,
    data_dir: Path,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = 120,
) -> Any:
    """One call of aenv's own routes (not E2B's: the SDK has none for them)."""
    return call(connection(api_url, api_key, data_dir), method, path, body, timeout=timeout)


def call(
    conn: Connection,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = 120,
) -> Any:
    """The answer's JSON; no answer exits 3, a refusal exits with the API's message."""
    import httpx

    try:
        r = httpx.request(
            method,
            f"{conn.api_url}{path}",
            json=body,
            timeout=timeout,
            headers={"X-API-Key": conn.api_key},
        )
    except httpx.HTTPError as e:
        die(f"{path}: cannot reach {conn.api_url} ({type(e).__name__})", EXIT_SERVER)
    if r.status_code >= 300:
        die_refused(path, r.status_code, r.text)
    return r.json()


def pairs(values: list[str] | None, what: str) -> dict[str, str]:
    """`-m K=V`/`-e K=V` options as a dict; anything else is a usage error."""
    out: dict[str, str] = {}
    for v in values or []:
        k, sep, x = v.partition("=")
        if not sep or not k:
            die(f"{what} must be KEY=VALUE, got {v!r}", EXIT_USAGE)
        out[k] = x
    return out


def no_such_sandbox(sandbox_id: str) -> str:
    """The one wording of an unknown sandbox, whatever the SDK's call said ("Paused sandbox
    X not found" from a connect, "sandbox "X" not found" from a fork)."""
    return f"no such sandbox {sandbox_id} (killed, or never there): `aenv ls` lists yours"


@contextmanager
def sdk_errors(what: str = "", sandbox_id: str | None = None) -> Iterator[None]:
    """Map what the e2b SDK and httpx raise to (message, exit code); `--debug` re-raises so
    the traceback is there when it is wanted. With `sandbox_id`, a 404 that is not about a
    file means that sandbox is not there."""
    import httpx
    from e2b import exceptions as ex

    prefix = f"{what}: " if what else ""
    try:
        yield
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as e:
        if debug_requested():
            raise
        if isinstance(e, ex.SandboxNotRunningException):
            die(
                f"{prefix}the sandbox stopped running (killed, or paused by its timeout: "
                "`aenv ls` shows which, `aenv resume` brings a paused one back)",
                EXIT_FAILED,
            )
        status = getattr(e, "status_code", None) if isinstance(e, ex.SandboxException) else None
        if (
            sandbox_id is not None
            and not isinstance(e, ex.FileNotFoundException)
            and (isinstance(e, ex.SandboxNotFoundException) or status == 404)
        ):
            die(no_such_sandbox(sandbox_id), EXIT_FAILED)  # says all: no prefix
        if isinstance(e, ex.NotFoundException):
            die(f"{prefix}{_first_line(e) or 'not found'}", EXIT_FAILED)
        if isinstance(e, ex.InvalidArgumentException):
            die(f"{prefix}{_first_line(e)}", EXIT_USAGE)
        if isinstance(e, ex.AuthenticationException) and "invalid username" in str(e):
            # envd's answer to a user the image lacks, not the API refusing the key
            die(
                f"{prefix}{_first_line(e)}: -u names a user of the sandbox's image (`user` "
                "by default, `root`)",
                EXIT_USAGE,
            )
        if isinstance(e, ex.AuthenticationException):
            die(
                f"{prefix}authentication failed ({_first_line(e)}); check the API key (aenv auth)",
                EXIT_SERVER,
            )
        if status == 409:  # the sandbox's state forbids it (paused, busy), a name is taken
            paused = sandbox_id is not None and "paused" in str(e)
            hint = f"; `aenv resume {sandbox_id}` first" if paused else ""
            die(f"{prefix}{_first_line(e)}{hint}", EXIT_FAILED)
        if status == 404:  # a template, a snapshot: what it names is not there
            die(f"{prefix}{_first_line(e)}", EXIT_FAILED)
        if status == 400:  # the server refused the arguments (e.g. an invalid name)
            die(f"{prefix}{_first_line(e)}", EXIT_USAGE)
        if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout):
            die(f"{prefix}cannot reach the aenv API: {_first_line(e)}", EXIT_SERVER)
        # everything else (API 5xx, timeouts, dropped streams) is the server's side
        die(f"{prefix}{type(e).__name__}: {_first_line(e)}", EXIT_SERVER)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
