"""Which repository manifests describe nothing any more (images-at-scale S11): a killed
sandbox's captures and their volumes, a deleted template's capture (unless the name took
the same key again), and images no capture names once past their grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain import template as tp
from domain.tags import TaggedBuild
from tests.unit.snapshot.test_same_bytes import manifest
from workers.snapshot.leftovers import (
    StoredImage,
    capture_keys,
    dropped_capture_key,
    images_to_forget,
    named_images,
    pause_keys,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def template(key: str | None, *, deleted: bool = False, **kw: object) -> tp.Template:
    return tp.Template(
        template_id="tpl",
        alias=None,
        envd_version="1",
        cpu_count=1,
        memory_mb=512,
        disk_size_mb=1024,
        deleted=deleted,
        capture_key=key,
        **kw,  # type: ignore[arg-type]
    )


def test_pause_keys_are_the_captures_and_their_volumes_only() -> None:
    stored = [
        "p1",
        "p1-v0",
        "p1-v12",
        "p1-vx",  # not a slot
        "p10",  # another capture whose id starts alike
        "p10-v0",
        "p2",
        "vol-abc-1",
        "image-" + "a" * 64,
    ]
    assert pause_keys(["p1", "p2", "p3"], stored) == ["p1", "p1-v0", "p1-v12", "p2"]
    assert pause_keys([], stored) == []


def test_capture_keys_name_one_volume_per_slot_of_each_capture() -> None:
    assert capture_keys(["p2", "p1"], 2) == ["p1", "p1-v0", "p1-v1", "p2", "p2-v0", "p2-v1"]
    assert capture_keys(["p1", "p1"], 0) == ["p1"]


def deleted() -> tp.TemplateDeleted:
    return tp.TemplateDeleted(template_id="tpl", at=T0)


def dropped(capture: str) -> tp.TemplateCaptureDropped:
    return tp.TemplateCaptureDropped(template_id="tpl", capture_id=capture, at=T0)


def test_a_deleted_template_leaves_its_last_uploaded_capture() -> None:
    assert dropped_capture_key(deleted(), "k1", template("k1", deleted=True)) == "k1"
    # registered again (capture_key cleared in the state) and deleted before a new upload
    assert dropped_capture_key(deleted(), "k1", template(None, deleted=True)) == "k1"


def test_nothing_uploaded_nothing_to_delete() -> None:
    assert dropped_capture_key(deleted(), None, template(None, deleted=True)) is None
    assert dropped_capture_key(deleted(), None, None) is None


def test_a_name_registered_again_on_the_same_key_keeps_it() -> None:
    assert dropped_capture_key(deleted(), "k1", template("k1")) is None
    # ... but another key since: the old one describes nothing
    assert dropped_capture_key(deleted(), "k1", template("k2")) == "k1"


def test_a_dropped_build_capture_is_its_own_templates_deletion() -> None:
    assert dropped_capture_key(dropped("tpl-b1"), "k1", template("k1")) is None


def test_a_templates_own_capture_dropped_goes_unless_tagged_again() -> None:
    tagged = {"default": TaggedBuild(build_id="b1", capture_id="tpl-b1")}
    assert dropped_capture_key(dropped("tpl"), "k1", template("k1", tags=tagged)) == "k1"
    retagged = {"default": TaggedBuild(build_id=None, capture_id="tpl")}
    assert dropped_capture_key(dropped("tpl"), "k1", template("k1", tags=retagged)) is None


def test_named_images_are_base_and_runtime_contents() -> None:
    m = manifest(content="1" * 64, runtime="3" * 64)
    old = manifest(content=None, runtime=None)  # a capture from before digests were kept
    assert named_images([m, old]) == {"1" * 64, "3" * 64}


def test_images_no_capture_names_go_after_their_grace() -> None:
    now = T0 + timedelta(days=10)
    named_old = StoredImage("1" * 64, "r1", T0)
    unnamed_old = StoredImage("2" * 64, "r2", T0 + timedelta(days=1))
    unnamed_older = StoredImage("5" * 64, "r5", T0)
    unnamed_young = StoredImage("4" * 64, "r4", now - timedelta(hours=1))
    images = [named_old, unnamed_old, unnamed_young, unnamed_older]
    gone = images_to_forget(images, {"1" * 64}, now=now, grace=timedelta(days=1))
    assert gone == [unnamed_older, unnamed_old]
    assert images_to_forget(images, {"1" * 64}, now=now, grace=timedelta(0)) == [
        unnamed_older,
        unnamed_old,
        unnamed_young,
    ]


def test_a_paused_captures_template_leaves_the_capture_to_its_sandbox() -> None:
    """The template a paused sandbox's fork lent its capture to: deleted, the manifest is
    still the sandbox's (its resume elsewhere needs it; its kill tidies it)."""
    name = tp.paused_capture_template("sbx1-p1234abcd")
    gone = tp.TemplateDeleted(template_id=name, at=T0)
    now = template("sbx1-p1234abcd", deleted=True).model_copy(update={"template_id": name})
    assert dropped_capture_key(gone, "sbx1-p1234abcd", now) is None
