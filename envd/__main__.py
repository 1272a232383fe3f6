"""`python3 -m envd`: start envd and print `ENVD-READY <port>` once it accepts connections."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from envd import log
from envd.app import App
from envd.httpserver import MAX_HEAD, serve_connection
from envd.state import State
from envd.version import ENVD_VERSION


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="envd", description="E2B-compatible in-sandbox daemon")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=49983, help="0 picks a free port")
    ap.add_argument("--default-user", default="user",
                    help="user for requests that name none (falls back to envd's own user)")
    ap.add_argument("--default-workdir", default=None,
                    help="cwd of processes that name none (default: the user's home)")
    return ap.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    state = State(default_user_name=args.default_user, default_workdir=args.default_workdir)
    app = App(state, loop)
    server = await asyncio.start_server(
        lambda r, w: serve_connection(r, w, app.handle),
        args.host,
        args.port,
        limit=MAX_HEAD,
        reuse_address=True,
        backlog=1024,
    )
    port = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(f"ENVD-READY {port}\n")
    sys.stdout.flush()
    log.info("envd listening", host=args.host, port=port, version=ENVD_VERSION,
             default_user=state.default_user.name)
    try:
        await stop.wait()
    finally:
        server.close()
        app.close()
        log.info("envd stopped")


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
