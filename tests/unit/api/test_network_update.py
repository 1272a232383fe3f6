"""The body of `PUT /sandboxes/{id}/network` as the real e2b SDK builds it, parsed into the
command the route sends: E2B's "a field left out is cleared", and what aenv ignores."""

from __future__ import annotations

from typing import Any

import pytest
from e2b.sandbox.sandbox_api import build_network_update_body

from api import wire
from api.network import network_command
from domain import Invalid
from domain import sandbox as sb


def command(update: Any) -> sb.UpdateSandboxNetwork:
    body = build_network_update_body(update).to_dict()
    return network_command("sbx1", wire.NetworkUpdate.model_validate(body))


def test_deny_all() -> None:
    cmd = command({"deny_out": ["0.0.0.0/0"]})
    assert (cmd.allow_internet_access, cmd.allow_out, cmd.deny_out) == (True, (), ("0.0.0.0/0",))


def test_allow_internet_access_comes_in_snake_case() -> None:
    body = build_network_update_body({"allow_internet_access": False}).to_dict()
    assert body == {"allow_internet_access": False}
    cmd = network_command("sbx1", wire.NetworkUpdate.model_validate(body))
    assert cmd.allow_internet_access is False
    camel = wire.NetworkUpdate.model_validate({"allowInternetAccess": False})
    assert camel.allow_internet_access is False


def test_an_empty_update_clears_everything() -> None:
    cmd = command({})
    assert (cmd.allow_internet_access, cmd.allow_out, cmd.deny_out) == (True, (), ())


def test_fields_aenv_does_not_enforce_are_ignored_as_in_a_create() -> None:
    body = {
        "allowOut": ["198.51.100.10"],
        "dnsServers": ["1.1.1.1"],
        "rules": {"api.example.com": [{"transform": {"headers": {"X": "y"}}}]},
        "egressProxy": None,
        "maskRequestHost": "x",
    }
    cmd = network_command("sbx1", wire.NetworkUpdate.model_validate(body))
    assert cmd.allow_out == ("198.51.100.10",)


@pytest.mark.parametrize("bad", [["example.com"], ["10.0.0.0/40"], ["fe80::1"]])
def test_a_bad_entry_is_invalid(bad: list[str]) -> None:
    with pytest.raises(Invalid):
        command({"allow_out": bad})


def test_a_wrongly_typed_field_fails_validation() -> None:
    with pytest.raises(ValueError):
        wire.NetworkUpdate.model_validate({"allowOut": "1.1.1.1"})
