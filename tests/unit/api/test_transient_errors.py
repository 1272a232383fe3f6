"""Which errors of ours the API calls an outage (503 with Retry-After) rather than a bug
(500): found by killing the embedded Postgres under a VM-less stack, whose first read after
the restart hit "the database system is in recovery mode" and answered 500."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from api.errors import _transient


class _Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


@pytest.mark.parametrize("sqlstate", ["57P03", "57P01", "57P02", "08006", "08003"])
def test_a_database_down_or_recovering_is_an_outage(sqlstate: str) -> None:
    exc = DBAPIError("SELECT 1", None, _Orig(sqlstate))
    assert _transient(exc) == "the read-model database"


@pytest.mark.parametrize("sqlstate", ["42P01", "23505", "22P02", None])
def test_a_bad_query_or_constraint_is_not(sqlstate: str | None) -> None:
    exc = DBAPIError("SELECT 1", None, _Orig(sqlstate))
    assert _transient(exc) is None
