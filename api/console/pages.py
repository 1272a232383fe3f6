"""The console's pages: shells that hold no data (served to anyone, so that a browser can
load them before it has a key), whose parts the page's script fills from the fragment
routes with the key it keeps in the tab's session storage; the key check; the static files
(ours and the vendored htmx and xterm.js: no CDN, everything served by aenv itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Response, get
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from api.auth import Caller
from api.console.render import html
from api.ids import is_sandbox_id

__all__ = ["ROUTES"]

STATIC = Path(__file__).parent / "static"


@get(["/console", "/console/"], include_in_schema=False)
async def fleet_page() -> Response[str]:
    return html("page.html", page="fleet", title="Fleet", fragment="/console/f/fleet", poll=3)


@get("/console/sandboxes", include_in_schema=False)
async def sandboxes_page() -> Response[str]:
    return html("sandboxes_page.html", page="sandboxes", title="Sandboxes")


@get("/console/sandboxes/{sandbox_id:str}", include_in_schema=False)
async def sandbox_page(sandbox_id: str) -> Response[Any]:
    if not is_sandbox_id(sandbox_id):
        return Redirect("/console/sandboxes")
    return html("sandbox_page.html", page="sandboxes", title=sandbox_id, sid=sandbox_id)


@get("/console/sandboxes/{sandbox_id:str}/terminal", include_in_schema=False)
async def terminal_page(sandbox_id: str) -> Response[Any]:
    if not is_sandbox_id(sandbox_id):
        return Redirect("/console/sandboxes")
    return html(
        "terminal_page.html", page="sandboxes", title=f"{sandbox_id} terminal", sid=sandbox_id
    )


@get("/console/templates", include_in_schema=False)
async def templates_page() -> Response[str]:
    return html(
        "page.html",
        page="templates",
        title="Templates and builds",
        fragment="/console/f/templates",
        poll=5,
    )


@get("/console/builds/{build_id:str}", include_in_schema=False)
async def build_page(build_id: str) -> Response[str]:
    return html("build_page.html", page="templates", title=f"Build {build_id}", bid=build_id)


@get("/console/f/whoami", include_in_schema=False)
async def whoami(caller: Caller) -> dict[str, str]:
    """The key check the sign-in form makes: 401 for a wrong key, else whose it is."""
    return {"team": caller.team_id, "key_id": caller.key_id}


ROUTES = [
    fleet_page,
    sandboxes_page,
    sandbox_page,
    terminal_page,
    templates_page,
    build_page,
    whoami,
    create_static_files_router(
        "/console/static", directories=[STATIC], name="console-static", include_in_schema=False
    ),
]
