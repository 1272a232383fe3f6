"""HTML of the console: Jinja templates (`api/console/templates/`) rendered to a response.

One environment for the process, autoescaping everything (metadata, failure reasons and
template names are the users' text), with the few filters the pages share: how long ago,
how long, which colour a state is. Rendering is pure — data in, HTML out — so the unit
tests render every template without a server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from litestar import Response
from litestar.enums import MediaType

__all__ = ["TONES", "ago", "duration", "html", "render", "tone"]

TEMPLATES = Path(__file__).parent / "templates"

#: The colour class of each sandbox status (and build status): settled states in their own
#: colour, every transition (…ing) in one, since they pass in a moment.
TONES = {
    "running": "ok",
    "ready": "ok",
    "beating": "ok",
    "paused": "paused",
    "killed": "off",
    "gone": "off",
    "failed": "bad",
    "error": "bad",
}


def tone(status: str | None) -> str:
    return TONES.get(status or "", "busy")


def duration(seconds: float | None) -> str:
    """`1 h 02 min`, `4 min 05 s`, `12.3 s`, `85 ms` — a length of time at a glance."""
    if seconds is None:
        return "—"
    s = max(0.0, float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def ago(at: datetime | float | None, now: datetime | None = None) -> str:
    """How long before `now` (a datetime, or a Unix time as heartbeats carry it)."""
    if at is None:
        return "—"
    now = now or datetime.now(UTC)
    when = datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else at
    return f"{duration((now - when).total_seconds())} ago"


def _iso(at: datetime | None) -> str:
    return at.astimezone(UTC).isoformat() if at is not None else ""


def _clock(at: datetime | None) -> str:
    """Time of day in UTC with milliseconds: events of one command are milliseconds apart."""
    return at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3] if at is not None else "—"


def _day(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at is not None else "—"


_ENV = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,  # a misspelt name fails the render (and its test), not blank
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(tone=tone, duration=duration, ago=ago, iso=_iso, clock=_clock, day=_day)


def render(name: str, **context: Any) -> str:
    return _ENV.get_template(name).render(**context)


#: The pages run our script and the vendored ones, nothing inline and no eval (htmx is told
#: so too): the API key sits in the tab's session storage, where an injected script could
#: read it. Styles may be inline (the bars' widths; xterm.js writes its own); no framing
#: (a Kill button must not be clickable through someone else's page).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)


def html(name: str, status_code: int = 200, **context: Any) -> Response[str]:
    """A rendered template as the response; never cached (the pages are live views)."""
    return Response(
        render(name, **context),
        media_type=MediaType.HTML,
        status_code=status_code,
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
        },
    )
