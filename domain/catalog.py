"""The closed sets of command and event types, by wire name.

The bus's registry is built from these; a message type that is not listed here cannot be
published or read. Names are the class names and never change (add a new type instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from domain import apikey, build, template, volume
from domain.messages import Command, CommandRejected, Event, Message
from domain.sandbox import commands as sc
from domain.sandbox import events as se
from domain.sandbox import spec

__all__ = ["COMMAND_TYPES", "EVENT_TYPES", "EVENT_UPCASTERS"]

M = TypeVar("M", bound=Message)


def _by_name(*classes: type[M]) -> dict[str, type[M]]:
    return {cls.__name__: cls for cls in classes}


COMMAND_TYPES: dict[str, type[Command]] = _by_name(
    sc.CreateSandbox,
    sc.PauseSandbox,
    sc.ResumeSandbox,
    sc.KillSandbox,
    sc.SetSandboxTimeout,
    sc.ForkSandbox,
    sc.SnapshotSandbox,
    sc.CompleteCreate,
    sc.CompletePause,
    sc.CompleteResume,
    sc.CompleteKill,
    sc.CompleteFork,
    sc.CompleteSnapshot,
    sc.RecordUpload,
    template.RegisterTemplate,
    template.DeleteTemplate,
    template.ImportTemplateImage,
    template.RecordTemplateUpload,
    template.PublishTemplateBuild,
    template.AssignTemplateTags,
    template.RemoveTemplateTags,
    template.DropTemplateCapture,
    apikey.CreateApiKey,
    apikey.RevokeApiKey,
    build.RequestTemplateBuild,
    build.StartTemplateBuild,
    build.LogTemplateBuild,
    build.CompleteTemplateBuild,
    build.ClaimTemplateBuild,
    volume.CreateVolume,
    volume.DestroyVolume,
    volume.AttachVolume,
    volume.ReleaseVolume,
)

EVENT_TYPES: dict[str, type[Event]] = _by_name(
    se.SandboxRequested,
    se.SandboxCreated,
    se.SandboxFailed,
    se.SandboxPauseRequested,
    se.SandboxPaused,
    se.SandboxResumeRequested,
    se.SandboxResumed,
    se.SandboxResumeFailed,
    se.SandboxKillRequested,
    se.SandboxKilled,
    se.SandboxTimeoutSet,
    se.SandboxForkRequested,
    se.SandboxForked,
    se.SnapshotRequested,
    se.SnapshotTaken,
    se.SnapshotFailed,
    se.SnapshotUploaded,
    template.TemplateRegistered,
    template.TemplateDeleted,
    template.TemplateImported,
    template.TemplateUploaded,
    template.TemplateBuildPublished,
    template.TemplateTagsAssigned,
    template.TemplateTagsRemoved,
    template.TemplateCaptureDropped,
    apikey.ApiKeyCreated,
    apikey.ApiKeyRevoked,
    build.TemplateBuildRequested,
    build.TemplateBuildStarted,
    build.TemplateBuildLogged,
    build.TemplateBuilt,
    build.TemplateBuildFailed,
    build.TemplateBuildClaimed,
    volume.VolumeCreated,
    volume.VolumeDestroyed,
    volume.VolumeAttached,
    volume.VolumeReleased,
    CommandRejected,
)

#: Pure payload upgrades, one schema version step each: (type, from version) → function. The
#: bus runs them when it reads an older event (fields are moved, never lost).
EVENT_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("SandboxRequested", 1): spec.upcast_requested_v1,
}
