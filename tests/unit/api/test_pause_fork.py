"""A paused sandbox's fork decided with no services (`api/pausefork.py`): which states
fork from the durable capture (and which are a 409 saying why, with Retry-After), the
template the capture is lent to, and how its children are placed (any node, copy-on-write,
their parent in `forked_from`) while a running sandbox's children start beside it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from api.auth import Caller
from api.context import ApiSettings
from api.errors import ApiError
from api.pausefork import forkable_capture, holds_memory, is_paused
from api.snapfork import FORK_KEY, child_creates
from domain import sandbox as sb
from domain import template as tp
from tests.unit.domain.builders import SID, at, paused, pausing, running, step

CALLER = Caller(key_id="key1", team_id="team1")
TPL: dict[str, Any] = {
    "template_id": tp.paused_capture_template("p1"),
    "alias": None,
    "cpu_count": 1,
    "memory_mb": 512,
    "disk_size_mb": 2048,
    "envd_version": "0.6.13",
}


def _durable() -> sb.Sandbox:
    s = step(paused(), sb.RecordUpload(sandbox_id=SID, snapshot_id="p1", size_bytes=1, at=at(30)))
    assert s is not None and s.resumable_anywhere
    return s


def test_a_paused_sandbox_whose_capture_is_durable_forks_from_it() -> None:
    assert is_paused(_durable()) and forkable_capture(_durable()) == "p1"


@pytest.mark.parametrize("state", [pausing, paused], ids=["pausing", "not-uploaded"])
def test_a_capture_not_durable_yet_is_a_409_that_says_when_to_retry(state) -> None:  # type: ignore[no-untyped-def]
    s = state()
    assert is_paused(s)
    with pytest.raises(ApiError) as e:
        forkable_capture(s)
    assert e.value.status == 409 and "being paused" in e.value.message
    assert e.value.headers["Retry-After"] == "2"


def test_a_running_sandbox_is_not_forked_from_a_capture() -> None:
    assert not is_paused(running())


def test_a_paused_sandbox_with_volumes_is_a_409() -> None:
    mount = sb.VolumeMount(name="data", path="/data", volume_id="vol1")
    s = _durable().model_copy(update={"volume_mounts": (mount,)})
    with pytest.raises(ApiError) as e:
        forkable_capture(s)
    assert e.value.status == 409 and "volumes" in e.value.message


def test_the_capture_template_is_named_by_the_capture() -> None:
    name = tp.paused_capture_template("sbx1-p1234abcd")
    assert tp.is_paused_capture_template(name)
    assert not tp.is_paused_capture_template("sbx1-p1234abcd")
    assert not tp.is_paused_capture_template(tp.PAUSED_CAPTURE_PREFIX)


def test_children_of_a_paused_sandbox_are_placed_and_name_their_parent() -> None:
    fork = uuid.uuid4()
    kids = child_creates(
        TPL,
        CALLER,
        ApiSettings(),
        fork_id=fork,
        count=2,
        timeout=300,
        metadata={"run": "r1"},
        forked_from=SID,
    )
    for k in kids:
        assert k.forked_from == SID and k.copy_on_write
        assert k.metadata == {"run": "r1", FORK_KEY: str(fork)}
        assert not k.beside_parent  # placed as any create, not on the parent's node
    running_child = kids[0].model_copy(update={"copy_on_write": False})
    assert running_child.beside_parent  # a running sandbox's fork child


def test_a_filesystem_only_pause_is_not_forked() -> None:
    def pause(capture: str, memory: bool) -> sb.SandboxPaused:
        return sb.SandboxPaused(
            sandbox_id=SID, at=at(21), remaining_s=30, snapshot_id=capture, memory=memory
        )

    history: list[object] = [pause("p1", True), pause("p2", False)]
    assert holds_memory(history, "p1")
    assert not holds_memory(history, "p2")
    assert holds_memory([], "p3")  # no record of it (a pause before the field): as kept
