"""Template tags: each build of a template is a capture of its own, a tag names one build,
`default` the latest; a capture no tag names is released (and dropped later), never
before."""

from __future__ import annotations

import pytest

from domain import Conflict, Invalid, NotFound
from domain import tags as tg
from domain import template as tp
from tests.unit.domain.builders import (
    TPL,
    at,
    build_id,
    built,
    capture,
    legacy,
    publish,
    tstep,
)


def _assign(target: str, *tags: str, seconds: float = 1000) -> tp.AssignTemplateTags:
    return tp.AssignTemplateTags(template_id=TPL, target_tag=target, tags=tags, at=at(seconds))


def _remove(*tags: str) -> tp.RemoveTemplateTags:
    return tp.RemoveTemplateTags(template_id=TPL, tags=tags, at=at(2000))


def test_a_first_build_is_default_and_takes_its_tags() -> None:
    s = built(("v1",))
    assert s.capture_for("default") == s.capture_for("v1") == capture(1)
    assert s.tagged("v1") == tg.TaggedBuild(build_id=build_id(1), capture_id=capture(1), at=at(100))
    assert s.capture_for("v2") is None
    assert s.released == {} and s.alias == TPL and s.cpu_count == 1


def test_a_rebuild_moves_default_and_keeps_the_tagged_build() -> None:
    s = built(("v1",), ("v2",))
    assert s.capture_for("default") == s.capture_for("v2") == capture(2)
    assert s.capture_for("v1") == capture(1)  # still startable as app:v1
    assert s.released == {}  # v1 still names the first capture


def test_a_rebuild_releases_the_capture_no_tag_names_any_more() -> None:
    s = built((), ())
    event = tp.decide_template(built(()), publish(2))[0]
    assert isinstance(event, tp.TemplateBuildPublished)
    assert event.tags == ("default",) and event.released == (capture(1),)
    assert s.capture_for("default") == capture(2)
    assert s.released == {capture(1): at(200)}


def test_a_redelivered_publish_decides_nothing() -> None:
    s = built(("v1",))
    assert tp.decide_template(s, publish(1, "v1")) == []
    assert tp.decide_template(s, publish(1, "V1", "default")) == []  # normalised the same


def test_tags_of_a_build_are_normalised_and_checked() -> None:
    s = built((" V1 ", "v1", "stable"))
    assert set(s.tags) == {"v1", "stable", "default"}
    for bad in ("bad tag", "", "3f1b9e2a-8a4f-4c1e-9d0b-2f6e1a7c5b3d", "ä"):
        with pytest.raises(Invalid):
            tp.decide_template(None, publish(1, bad))


def test_assign_points_tags_at_the_build_a_tag_names() -> None:
    s = built(("v1",), ())
    s = tstep(s, _assign("v1", "stable", "prod"))
    assert s.capture_for("stable") == s.capture_for("prod") == capture(1)
    assert s.tagged("stable") == tg.TaggedBuild(
        build_id=build_id(1), capture_id=capture(1), at=at(1000)
    )
    assert s.capture_for("default") == capture(2)
    assert tp.decide_template(s, _assign("v1", "stable")) == []  # already there


def test_assigning_default_rolls_back_and_releases_what_is_left_untagged() -> None:
    s = built(("v1",), ())
    events = tp.decide_template(s, _assign("v1", "default"))
    assert isinstance(events[0], tp.TemplateTagsAssigned)
    assert events[0].released == (capture(2),)
    s = tp.fold_template(events, s)
    assert s is not None and s.capture_for("default") == capture(1)
    assert s.released == {capture(2): at(1000)}


def test_assign_refusals() -> None:
    s = built(("v1",))
    with pytest.raises(NotFound):  # no such tag to tag from
        tp.decide_template(s, _assign("v9", "stable"))
    with pytest.raises(Invalid):
        tp.decide_template(s, _assign("v1"))
    with pytest.raises(Invalid):
        tp.decide_template(s, _assign("v1", "Not A Tag"))
    with pytest.raises(NotFound):
        tp.decide_template(None, _assign("default", "x"))
    gone = tstep(s, tp.DeleteTemplate(template_id=TPL, at=at(500)))
    with pytest.raises(NotFound):
        tp.decide_template(gone, _assign("default", "x"))
    with pytest.raises(Conflict):  # a build publishing under another alias
        tp.decide_template(s, publish(2).model_copy(update={"alias": "other"}))


def test_remove_takes_tags_but_never_default() -> None:
    s = built(("v1", "stable"), ())
    with pytest.raises(Invalid):
        tp.decide_template(s, _remove("default"))
    with pytest.raises(Invalid):
        tp.decide_template(s, _remove())
    assert tp.decide_template(s, _remove("nope")) == []  # tags it does not have: no error
    s = tstep(s, _remove("v1", "nope"))
    assert s.capture_for("v1") is None and s.released == {}  # stable still names build 1
    events = tp.decide_template(s, _remove("stable"))
    assert isinstance(events[0], tp.TemplateTagsRemoved) and events[0].tags == ("stable",)
    s = tp.fold_template(events, s)
    assert s is not None and s.released == {capture(1): at(2000)}
    assert set(s.tags) == {"default"}


def test_a_dropped_capture_is_no_longer_waiting() -> None:
    s = built((), ())
    drop = tp.DropTemplateCapture(template_id=TPL, capture_id=capture(1), at=at(900))
    s = tstep(s, drop)
    assert s.released == {}
    assert tp.decide_template(s, drop) == []  # dropped already (another API's sweep)
    assert tp.decide_template(s, drop.model_copy(update={"capture_id": capture(2)})) == []


def test_delete_releases_every_capture_and_a_new_build_starts_afresh() -> None:
    s = built(("v1",), ("v2",))
    events = tp.decide_template(s, tp.DeleteTemplate(template_id=TPL, at=at(500)))
    assert isinstance(events[0], tp.TemplateDeleted)
    assert events[0].released == (capture(1), capture(2))
    s = tp.fold_template(events, s)
    assert s is not None and s.deleted and s.tags == {} and s.capture_for("default") is None
    assert set(s.released) == {capture(1), capture(2)}
    again = tstep(s, publish(3, seconds=600))
    assert not again.deleted and set(again.tags) == {"default"}
    assert again.capture_for("v1") is None and again.capture_for("default") == capture(3)
    assert set(again.released) == {capture(1), capture(2)}  # still to be dropped


def test_a_template_from_before_tags_is_its_own_default() -> None:
    s = legacy()
    assert s.tags == {} and s.capture_for("default") == TPL and s.capture_for("v1") is None
    tagged = tstep(s, _assign("default", "stable"))  # `default` materialised, as itself
    assert tagged.capture_for("stable") == tagged.capture_for("default") == TPL
    assert tagged.tagged("default") == tg.TaggedBuild(build_id=None, capture_id=TPL)
    # its first build with tags moves `default`; `stable` keeps the old capture
    s2 = tstep(tagged, publish(1))
    assert s2.capture_for("default") == capture(1) and s2.capture_for("stable") == TPL
    assert s2.released == {}
    # without another tag on it, the old capture is released (its own id: the sweeper
    # drops it from the nodes, never the template)
    s3 = tstep(legacy(), publish(1))
    assert s3.released == {TPL: at(100)}


def test_register_keeps_tags_and_releases() -> None:
    s = built((), ())
    again = tp.RegisterTemplate(template_id=TPL, alias=TPL, memory_mb=1024, at=at(300))
    s = tstep(s, again)
    assert s.memory_mb == 1024 and s.capture_for("default") == capture(2)
    assert set(s.released) == {capture(1)}
    unchanged = again.model_copy(update={"at": at(301)})
    assert tp.decide_template(s, unchanged) == []


def test_a_capture_a_tag_names_is_never_waiting_to_be_dropped() -> None:
    """Whatever the log says: a fold keeps a named capture out of `released`."""
    s = built(("v1",))
    odd = tp.TemplateTagsAssigned(
        template_id=TPL,
        build_id=build_id(1),
        capture_id=capture(1),
        tags=("x",),
        released=(capture(1),),
        at=at(5),
    )
    s2 = tp.fold_template([odd], s)
    assert s2 is not None and s2.released == {}


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("app", [("app", "default")]),
        ("app:v1", [("app:v1", "default"), ("app", "v1")]),
        ("app:", [("app:", "default")]),
        # a registry's port is no tag: the reference is looked up whole
        ("127.0.0.1:5000/cat/a:1", [("127.0.0.1:5000/cat/a:1", "default")]),
        ("localhost:5000/a", [("localhost:5000/a", "default")]),
    ],
)
def test_a_reference_is_tried_as_an_id_then_as_name_and_tag(
    ref: str, expected: list[tuple[str, str]]
) -> None:
    assert tg.candidates(ref) == expected


def test_capture_ids_name_their_template() -> None:
    cid = tg.build_capture_id("app", build_id(7))
    assert tg.split_capture_id(cid) == ("app", build_id(7))
    assert tg.shown_template(cid) == "app"
    for other in ("app", "snap:v1", ":" + build_id(7), "app:not-a-uuid"):
        assert tg.split_capture_id(other) is None
        assert tg.shown_template(other) == other
    assert tg.normalize_tags(["B", "a", "b"]) == ("b", "a")
    assert tg.valid_tag("v1.2_rc-3") and not tg.valid_tag(build_id(1))


def test_a_sandbox_of_an_image_shows_the_reference_it_was_created_by() -> None:
    ref = "127.0.0.1:5000/cat/a:1"
    assert tg.shown_template("img-0123456789abcdef", ref) == ref
    assert tg.shown_template("img-0123456789abcdef") == "img-0123456789abcdef"
    assert tg.shown_template("app", "other") == "app"  # a template's alias is no image
    assert tg.shown_template(tg.build_capture_id("app", build_id(7)), "app") == "app"
