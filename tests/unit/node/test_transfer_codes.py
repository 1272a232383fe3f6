"""What a template's fetch refuses keeps its code (`transfer.py`): a full disk budget's
`NoRoom` and bytes that are nowhere are `unavailable` — another node may take the create,
and if none can the API answers 503 — never a bare failure (a 500)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.node.disk.budget import NoRoom
from workers.node.ports import HostError
from workers.node.transfer import Transfers


class _FullDisk:
    async def get_manifest(self, key: str) -> Any:
        raise NoRoom("node disk budget: need 2048 MiB, 0 MiB evictable, 0 MiB free")


def _transfers(repository: Any) -> Transfers:
    return Transfers(runtime=None, templates=None, repository=repository)  # type: ignore[arg-type]


async def test_a_fetch_the_disk_budget_refuses_stays_unavailable() -> None:
    with pytest.raises(HostError) as refused:
        await _transfers(_FullDisk()).fetch("k", Path("/nonexistent"), Path("/x"), "the capture")
    assert refused.value.code == "unavailable"
    assert "could not be fetched: node disk budget" in str(refused.value)


async def test_a_template_captured_nowhere_to_fetch_from_is_unavailable() -> None:
    transfers = _transfers(None)
    transfers.locate = None
    with pytest.raises(HostError) as refused:
        await transfers._fetch_template("gone")
    assert refused.value.code == "unavailable"
    assert "is not on this node and its capture is not in" in str(refused.value)
