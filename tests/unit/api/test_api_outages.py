"""An outage of the bus or the database is a 503 with Retry-After, not a 500: a JetStream
leader election times requests out for seconds (seen in the fleet test), and the SDK's
callers retry a 503 but report a 500 as our bug."""

import pytest
from litestar import Litestar, get
from litestar.testing import TestClient
from nats.errors import NoServersError
from nats.errors import TimeoutError as NatsTimeout
from sqlalchemy.exc import InterfaceError, ProgrammingError

from api.errors import HANDLERS
from bus.errors import PublishError


def _app(exc: Exception) -> Litestar:
    @get("/boom")
    async def boom() -> None:
        raise exc

    return Litestar([boom], exception_handlers=HANDLERS)


@pytest.mark.parametrize(
    "exc",
    [
        NatsTimeout(),
        NoServersError(),
        PublishError("no stream ack"),
        InterfaceError("select 1", {}, ConnectionResetError("connection was closed")),
        ConnectionRefusedError(111, "refused"),
    ],
    ids=["nats-timeout", "no-servers", "publish", "db-closed", "refused"],
)
def test_an_outage_is_503_with_retry_after(exc: Exception) -> None:
    with TestClient(_app(exc)) as client:
        r = client.get("/boom")
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) > 0
    body = r.json()
    assert body["code"] == 503 and "not answering" in body["message"]


@pytest.mark.parametrize(
    "exc",
    [KeyError("x"), ProgrammingError("select nope", {}, Exception("syntax"))],
    ids=["bug", "bad-sql"],
)
def test_a_bug_is_still_500(exc: Exception) -> None:
    with TestClient(_app(exc)) as client:
        r = client.get("/boom")
    assert r.status_code == 500
    assert r.json()["code"] == 500 and "retry-after" not in r.headers
