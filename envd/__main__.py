"""`python3 -m envd`: start envd and print `ENVD-READY <port>` once it accepts connections.

Start-up is on the critical path of building every template, and guests may run under TCG
emulation, so this module keeps imports lean: no argparse, no TLS (asyncio only imports ssl
opportunistically; envd serves plain HTTP behind the node's proxy).
"""

from __future__ import annotations

import sys

sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]  # asyncio works without it

import asyncio  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from envd import log  # noqa: E402
from envd.app import App  # noqa: E402
from envd.conn import Connection  # noqa: E402
from envd.httpserver import serve_connection  # noqa: E402
from envd.state import State  # noqa: E402
from envd.tails import ENDED_KEEP, ENDED_KEEP_S, EndedTable  # noqa: E402
from envd.version import ENVD_VERSION  # noqa: E402

USAGE = (
    "usage: python3 -m envd [--host ADDR] [--port N] [--default-user NAME]"
    " [--default-workdir DIR] [--ended-keep N] [--ended-keep-s S]\n"
    "  --host             listen address (default 0.0.0.0)\n"
    "  --port             listen port, 0 picks a free one (default 49983)\n"
    "  --default-user     user of requests that name none (default 'user';\n"
    "                     envd's own user when that one does not exist)\n"
    "  --default-workdir  cwd of processes that name none (default: the user's home)\n"
    f"  --ended-keep       ended processes whose exit and output tail `commands.connect(pid)`\n"
    f"                     still answers, the most recent ones (default {ENDED_KEEP})\n"
    f"  --ended-keep-s     seconds each stays after its end (default {ENDED_KEEP_S:g})\n"
)


@dataclass
class Options:
    host: str = "0.0.0.0"
    port: int = 49983
    default_user: str = "user"
    default_workdir: str | None = None
    ended_keep: int = ENDED_KEEP
    ended_keep_s: float = ENDED_KEEP_S


def _number(name: str, value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        n = -1.0
    if not n >= 0:
        sys.stderr.write(f"envd: invalid {name} {value!r}\n")
        raise SystemExit(2)
    return n


def parse_args(argv: list[str]) -> Options:
    """`--flag value` and `--flag=value`; exits with usage on anything else."""
    opts = Options()
    names = {
        "--host",
        "--port",
        "--default-user",
        "--default-workdir",
        "--ended-keep",
        "--ended-keep-s",
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        name, eq, value = arg.partition("=")
        if name not in names:
            sys.stderr.write(f"envd: unknown argument {arg!r}\n{USAGE}")
            raise SystemExit(2)
        if not eq:
            i += 1
            if i >= len(argv):
                sys.stderr.write(f"envd: {name} needs a value\n{USAGE}")
                raise SystemExit(2)
            value = argv[i]
        if name == "--host":
            opts.host = value
        elif name == "--port":
            if not value.isdigit():
                sys.stderr.write(f"envd: invalid port {value!r}\n")
                raise SystemExit(2)
            opts.port = int(value)
        elif name == "--default-user":
            opts.default_user = value
        elif name == "--ended-keep":
            opts.ended_keep = int(_number(name, value))
        elif name == "--ended-keep-s":
            opts.ended_keep_s = _number(name, value)
        else:
            opts.default_workdir = value
        i += 1
    return opts


def listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves, synchronously: asyncio would resolve the host on
    a thread-pool thread, and envd stays single-threaded (its PTY children are forked with
    a preexec hook, which is only safe without other threads)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(opts: Options) -> None:
    loop = asyncio.get_running_loop()
    state = State(
        default_user_name=opts.default_user,
        default_workdir=opts.default_workdir,
        ended=EndedTable(opts.ended_keep, opts.ended_keep_s),
    )
    app = App(state, loop)

    async def serve_one(conn: Connection) -> None:
        await serve_connection(conn, app.handle)

    sock = listen(opts.host, opts.port)
    server = await loop.create_server(lambda: Connection(serve_one), sock=sock)
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(f"ENVD-READY {port}\n")
    sys.stdout.flush()
    state.preload.start(then=app.process.warm)
    log.info(
        "envd listening",
        host=opts.host,
        port=port,
        version=ENVD_VERSION,
        default_user=state.default_user.name,
    )
    try:
        await stop.wait()
    finally:
        server.close()
        app.close()
        log.info("envd stopped")


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
