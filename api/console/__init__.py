"""The web console at `/console` (docs/console.md): the fleet, every sandbox's life from the
log, fork trees, a live terminal and build logs, in a browser.

Server-rendered (Jinja templates, htmx; vendored, no CDN). Pages are data-free shells; what
they show comes from fragment routes under `/console/f/` that take the same API key as the
REST routes (`X-API-KEY`, which the page's script sends from the tab's session storage) and
read the same read models, log and heartbeats, scoped to the key's team. The console adds
no way to change anything: its buttons call the REST routes themselves.

`api.console.routes.ROUTES` is what the app mounts (this package imports nothing itself).
"""
