"""What the node tells envd about ended processes in each /init (AENV_ENVD_ENDED_KEEP[_S])."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from envd.guest_init import ended_keep
from workers.node.ports import GuestConfig
from workers.node.settings import NodeSettings


def test_the_bounds_ride_in_init_as_envd_reads_them() -> None:
    body = GuestConfig(ended_keep=(8, 30.0)).init_body("sbx1")
    assert (body["aenvEndedKeep"], body["aenvEndedKeepS"]) == (8, 30.0)
    assert ended_keep(body) == (8, 30.0)
    assert "aenvEndedKeep" not in GuestConfig().init_body("sbx1")


def test_the_node_settings_and_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    s = NodeSettings()
    assert (s.envd_ended_keep, s.envd_ended_keep_s) == (64, 600.0)
    monkeypatch.setenv("AENV_ENVD_ENDED_KEEP_S", "-1")
    with pytest.raises(ValidationError):
        NodeSettings()
