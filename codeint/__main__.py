"""`python3 -m codeint`: start the default Python kernel (warmed), then listen on 49999.

It listens only once that kernel answers, so "port 49999 answers /health" means "the first
`run_code` needs no kernel start": what the template's capture waits for. Prints
`CODEINT-READY <port>` then (the guest console's marker).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import signal
import sys
import time
from pathlib import Path

from codeint.base import RunAs
from codeint.contexts import Contexts
from codeint.httpd import serve_connection
from codeint.pykernel import PythonContext
from codeint.sandbox_env import SandboxEnv
from codeint.server import Server

#: Imported in the default kernel before the template is captured (those installed).
DEFAULT_WARM = "numpy,pandas,matplotlib,matplotlib.pyplot"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="codeint", description=__doc__)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--user", default="user", help="account kernels run as (when root)")
    p.add_argument("--cwd", default=None, help="default working directory (the user's home)")
    p.add_argument("--rundir", default="/run/codeint", help="connection files, scripts")
    p.add_argument("--python", default=sys.executable, help="interpreter of Python kernels")
    p.add_argument("--warm", default=DEFAULT_WARM, help="modules the default kernel imports")
    p.add_argument(
        "--envd",
        default="127.0.0.1:49983",
        help="envd, whose GET /envs has the sandbox's env vars ('': none)",
    )
    return p.parse_args(argv)


async def run(opts: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    runas = RunAs.lookup(opts.user)
    cwd = opts.cwd or (runas.home if runas else str(Path.cwd()))
    contexts = Contexts(cwd=cwd, runas=runas, rundir=Path(opts.rundir), python=opts.python)
    t0 = time.monotonic()
    ctx = await contexts.default("python")
    assert isinstance(ctx, PythonContext)
    if opts.warm:
        await ctx.warm([m for m in opts.warm.split(",") if m])
    await contexts.default("bash")
    envd = None
    if opts.envd:
        host, _, port = opts.envd.rpartition(":")
        envd = SandboxEnv((host, int(port)))
    server = Server(contexts, envd)
    listener = await asyncio.start_server(
        functools.partial(serve_connection, server.handle),
        opts.host,
        opts.port,
        limit=1 << 20,
    )
    port = listener.sockets[0].getsockname()[1]
    print(f"CODEINT-READY {port} {time.monotonic() - t0:.1f}s", flush=True)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        listener.close()
        await contexts.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="codeint %(levelname)s %(message)s"
    )
    asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
