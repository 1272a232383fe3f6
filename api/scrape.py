"""Who may read `/metrics`: a caller with an API key, or Prometheus with the metrics token.

Prometheus sends `Authorization: Bearer <credentials>` (its `authorization` scrape
option); that may be the stack's `AENV_METRICS_TOKEN` or an API key, and an API key may
also come as `X-API-KEY` like on every other route. The metrics name every route and
its traffic, so they are not for anyone who can reach the port.
"""

from __future__ import annotations

import hmac

from api.context import ApiContext
from api.errors import ApiError

MISSING = ("missing credentials: send X-API-KEY: <api key>, or Authorization: Bearer "
           "<AENV_METRICS_TOKEN or api key>")  # fmt: skip


def bearer(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer …` header, else None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


def is_metrics_token(given: str, configured: str | None) -> bool:
    return configured is not None and hmac.compare_digest(given.encode(), configured.encode())


async def authorize_scrape(ctx: ApiContext, api_key: str | None, authorization: str | None) -> None:
    """Returns when the request may read the metrics; else raises a 401 `ApiError`."""
    token = bearer(authorization)
    secret = ctx.settings.metrics_token
    configured = secret.get_secret_value() if secret is not None else None
    if token is not None and is_metrics_token(token, configured):
        return
    key = api_key or token
    if not key:
        raise ApiError(401, MISSING)
    await ctx.keys.caller(key)  # 401 "invalid API key" unless it is one
