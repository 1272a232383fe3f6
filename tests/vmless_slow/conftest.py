"""The VM-less stack's slow tests: supervision under kills and crash loops, outages of the
embedded servers and what health says of them, other local users, and the API fuzzed
against its OpenAPI document. The same real stack as `tests/vmless` (whose fixtures these
are), in a tier of its own because each test waits out restarts, drains or thousands of
requests: minutes in all, so `make test-fast` leaves them to `make test`."""

from tests.vmless.conftest import vmless

__all__ = ["vmless"]
