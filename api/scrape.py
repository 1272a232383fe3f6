"""Who may read `/metrics`: a caller with an API key, or Prometheus with the metrics token.

Prometheus sends `Authorization: Bearer <credentials>` (its `authorization` scrape
option); that may be the stack's `AENV_METRICS_TOKEN` or an API key, and an API key may
also come as `X-API-KEY` like on every other route. The metrics name every route and
its traffic, so they are not for anyone who can reach the port (`shared.metrics`: the
rule every role's `/metrics` keeps).
"""

from __future__ import annotations

from api.context import ApiContext
from api.errors import ApiError
from shared.metrics import bearer, is_token

__all__ = ["MISSING", "authorize_scrape", "bearer"]

MISSING = (
    "missing credentials: send X-API-KEY: <api key>, or Authorization: Bearer "
    "<AENV_METRICS_TOKEN or api key>"
)


async def authorize_scrape(ctx: ApiContext, api_key: str | None, authorization: str | None) -> None:
    """Returns when the request may read the metrics; else raises a 401 `ApiError`."""
    token = bearer(authorization)
    secret = ctx.settings.metrics_token
    if is_token(token, secret.get_secret_value() if secret is not None else None):
        return
    key = api_key or token
    if not key:
        raise ApiError(401, MISSING)
    await ctx.keys.caller(key)  # 401 "invalid API key" unless it is one
