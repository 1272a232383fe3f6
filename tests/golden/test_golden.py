"""Golden histories: the recorded events of real sandboxes' (volume mounts included),
templates' (tags included), builds', API keys', volumes' and leases' lives (`histories/`, recorded
from a running stack by `tests/golden/record.py`, never edited) must decode with today's
code — older schema versions upcast — and fold to the state recorded with them. A change
that cannot read yesterday's log fails here, not in production on replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bus.envelope import EventEnvelope, decode_event, events
from domain import aggregate_of

HISTORIES = Path(__file__).parent / "histories"


def _histories() -> list[Path]:
    return sorted(HISTORIES.glob("*.jsonl"))


@pytest.mark.parametrize("path", _histories(), ids=lambda p: p.stem)
def test_a_recorded_history_decodes_and_folds_to_its_recorded_state(path: Path) -> None:
    expected = json.loads(path.with_suffix("").with_suffix(".state.json").read_text())
    evolve = aggregate_of(expected["kind"]).evolve
    state: Any = None
    for line in path.read_text().splitlines():
        _, event = decode_event(line.encode())
        state = evolve(state, event)
    got = None if state is None else state.model_dump(mode="json")
    if got is not None:
        _drop_added(state, got, expected["state"])
    assert got == expected["state"]


def _drop_added(model: BaseModel, got: dict[str, Any], recorded: dict[str, Any]) -> None:
    """A field added since the recording (fields are added, never deleted) is absent from
    the recorded state, at any depth: an old log must fold to its default, nothing else."""
    added = {k: got.pop(k) for k in set(got) - set(recorded)}
    fresh = type(model).model_construct().model_dump(mode="json", include=set(added))
    assert added == fresh, f"fields added since the recording: {added}"
    for name, value in got.items():
        inner = getattr(model, name, None)
        deeper = isinstance(value, dict) and isinstance(recorded.get(name), dict)
        if isinstance(inner, BaseModel) and deeper:
            _drop_added(inner, value, recorded[name])


def test_an_upcaster_is_exercised() -> None:
    """Some recorded event is of an older schema than today's: decoding it ran an upcaster
    (`SandboxRequested` v1 had the spec's fields flat)."""
    old = [
        env.type
        for path in _histories()
        for env in map(EventEnvelope.model_validate_json, path.read_text().splitlines())
        if env.schema_version < events.version_of(env.type)
    ]
    assert "SandboxRequested" in old


def test_the_histories_cover_every_lifecycle_step() -> None:
    """What the recorded lives went through (so the check above means something)."""
    types = {
        EventEnvelope.model_validate_json(line).type
        for path in _histories()
        for line in path.read_text().splitlines()
    }
    assert {
        "SandboxRequested",
        "SandboxCreated",
        "SandboxFailed",
        "SandboxTimeoutSet",
        "SandboxNetworkUpdated",
        "SandboxPauseRequested",
        "SandboxPaused",
        "SandboxResumeRequested",
        "SandboxResumed",
        "SnapshotRequested",
        "SnapshotTaken",
        "SandboxForkRequested",
        "SandboxForked",
        "SandboxKillRequested",
        "SandboxKilled",
        "TemplateRegistered",
        "TemplateDeleted",
        "ApiKeyCreated",
        "ApiKeyRevoked",
        "TemplateBuildPublished",
        "TemplateTagsAssigned",
        "TemplateTagsRemoved",
        "TemplateCaptureDropped",
        "TemplateBuildRequested",
        "TemplateBuildStarted",
        "TemplateBuildClaimed",
        "TemplateBuilt",
        "VolumeCreated",
        "VolumeAttached",
        "VolumeReleased",
        "VolumeDestroyed",
    } <= types
