"""The small aggregates: templates and API keys."""

from __future__ import annotations

import pytest

from domain import Conflict, CorruptHistory, NotFound
from domain import apikey as ak
from domain import template as tp
from tests.unit.domain.builders import T0


def test_register_update_delete_template() -> None:
    reg = tp.RegisterTemplate(template_id="base", alias="base", at=T0)
    s = tp.fold_template(tp.decide_template(None, reg))
    assert s is not None and s.alias == "base" and not s.deleted
    assert tp.decide_template(s, reg) == []  # unchanged: no event
    bigger = reg.model_copy(update={"memory_mb": 1024})
    s = tp.fold_template(tp.decide_template(s, bigger), s)
    assert s is not None and s.memory_mb == 1024
    with pytest.raises(Conflict):
        tp.decide_template(s, reg.model_copy(update={"alias": "other"}))
    s = tp.fold_template(tp.decide_template(s, tp.DeleteTemplate(template_id="base")), s)
    assert s is not None and s.deleted
    with pytest.raises(NotFound):
        tp.decide_template(s, tp.DeleteTemplate(template_id="base"))
    with pytest.raises(NotFound):
        tp.decide_template(None, tp.DeleteTemplate(template_id="x"))
    with pytest.raises(CorruptHistory):
        tp.evolve_template(None, tp.TemplateDeleted(template_id="x", at=T0))


def test_a_snapshot_templates_upload_is_recorded_once_per_capture() -> None:
    reg = tp.RegisterTemplate(template_id="snap", at=T0)
    s = tp.fold_template(tp.decide_template(None, reg))
    up = tp.RecordTemplateUpload(template_id="snap", key="cap-1", source_sandbox_id="sbx1")
    s = tp.fold_template(tp.decide_template(s, up), s)
    assert s is not None and (s.capture_key, s.capture_of) == ("cap-1", "sbx1")
    assert tp.decide_template(s, up) == []  # the same capture again: nothing new
    assert tp.decide_template(s, reg) == []  # its durability is no change of defaults
    newer = up.model_copy(update={"key": "cap-2"})
    s = tp.fold_template(tp.decide_template(s, newer), s)
    assert s is not None and s.capture_key == "cap-2"
    # registered again with new defaults: a new capture, not durable until its upload
    s = tp.fold_template(tp.decide_template(s, reg.model_copy(update={"memory_mb": 1024})), s)
    assert s is not None and s.capture_key is None
    gone = tp.fold_template(tp.decide_template(s, tp.DeleteTemplate(template_id="snap")), s)
    assert tp.decide_template(gone, up) == [] and tp.decide_template(None, up) == []


def test_a_snapshot_taken_again_under_its_name_is_not_durable_until_its_own_upload() -> None:
    """Same name, same resources, new capture: the repository still holds the old capture,
    so the name must not count as durable (another node would start it from the old
    state), and the old capture's upload finishing late must not make it so either."""
    first = tp.RegisterTemplate(template_id="snap", capture_id="cap-1", at=T0)
    s = tp.fold_template(tp.decide_template(None, first))
    up1 = tp.RecordTemplateUpload(template_id="snap", key="cap-1", source_sandbox_id="sbx1")
    s = tp.fold_template(tp.decide_template(s, up1), s)
    assert s is not None and s.capture_key == "cap-1"
    assert tp.decide_template(s, first) == []  # the same capture registered again
    again = first.model_copy(update={"capture_id": "cap-2"})
    s = tp.fold_template(tp.decide_template(s, again), s)
    assert s is not None and (s.capture_id, s.capture_key, s.capture_of) == ("cap-2", None, None)
    late = up1.model_copy(update={"source_sandbox_id": "sbx9"})  # cap-1's upload, retried
    assert tp.decide_template(s, late) == []
    up2 = tp.RecordTemplateUpload(template_id="snap", key="cap-2", source_sandbox_id="sbx2")
    s = tp.fold_template(tp.decide_template(s, up2), s)
    assert s is not None and (s.capture_key, s.capture_of) == ("cap-2", "sbx2")


def test_an_imported_images_upload_names_no_source_sandbox() -> None:
    """An import's capture (`aenv pull`, a build FROM an image) is uploaded like a
    snapshot's; its guest holds no sandbox's token, so none is recorded."""
    reg = tp.RegisterTemplate(template_id="img-a3697db92aaa76c4", at=T0)
    s = tp.fold_template(tp.decide_template(None, reg))
    up = tp.RecordTemplateUpload(template_id="img-a3697db92aaa76c4", key="tpl-img-1")
    s = tp.fold_template(tp.decide_template(s, up), s)
    assert s is not None and (s.capture_key, s.capture_of) == ("tpl-img-1", None)
    assert tp.decide_template(s, up) == []


def test_an_upload_records_what_a_node_without_the_template_stores() -> None:
    """Placement by disk reads the sizes from the log: the capture's and the disks'
    bytes ride on the upload; an upload recorded before sizes were folds to None; a new
    capture under the name (registered again) is not sized until its own upload."""
    reg = tp.RegisterTemplate(template_id="snap", capture_id="cap-1", at=T0)
    s = tp.fold_template(tp.decide_template(None, reg))
    up = tp.RecordTemplateUpload(
        template_id="snap", key="cap-1", capture_bytes=300 << 20, image_bytes=2 << 30
    )
    events = tp.decide_template(s, up)
    assert [(e.capture_bytes, e.image_bytes) for e in events] == [(300 << 20, 2 << 30)]  # type: ignore[attr-defined]
    s = tp.fold_template(events, s)
    assert s is not None and (s.capture_bytes, s.image_bytes) == (300 << 20, 2 << 30)
    old = tp.TemplateUploaded.model_validate(
        {"template_id": "snap", "key": "cap-1", "at": T0.isoformat()}
    )
    before = tp.fold_template([old], tp.fold_template(tp.decide_template(None, reg)))
    assert before is not None and (before.capture_bytes, before.image_bytes) == (None, None)
    again = reg.model_copy(update={"capture_id": "cap-2"})
    s = tp.fold_template(tp.decide_template(s, again), s)
    assert s is not None and (s.capture_key, s.capture_bytes, s.image_bytes) == (None, None, None)


def test_api_key_lifecycle() -> None:
    raw = ak.new_api_key()
    assert raw.startswith(ak.KEY_PREFIX)
    create = ak.CreateApiKey(
        key_id="k1",
        team_id="t1",
        prefix=ak.display_prefix(raw),
        key_sha256=ak.hash_api_key(raw),
        at=T0,
    )
    s = ak.fold_api_key(ak.decide_api_key(None, create))
    assert s is not None and s.key_sha256 == ak.hash_api_key(raw) and raw not in repr(s)
    with pytest.raises(Conflict):
        ak.decide_api_key(s, create)
    s = ak.fold_api_key(ak.decide_api_key(s, ak.RevokeApiKey(key_id="k1")), s)
    assert s is not None and s.revoked
    assert ak.decide_api_key(s, ak.RevokeApiKey(key_id="k1")) == []
    with pytest.raises(NotFound):
        ak.decide_api_key(None, ak.RevokeApiKey(key_id="k2"))
    with pytest.raises(CorruptHistory):
        ak.evolve_api_key(None, ak.ApiKeyRevoked(key_id="k", at=T0))


def test_an_imported_template_knows_the_node_its_capture_is_on() -> None:
    """Until its capture is uploaded, a create goes where the import ran (api/holders.py)."""
    reg = tp.RegisterTemplate(template_id="img", at=T0)
    s = tp.fold_template(tp.decide_template(None, reg))
    assert s is not None and s.imported_on is None
    done = tp.CompleteTemplateImport(template_id="img", image_digest="d" * 64, node_id="n2")
    s = tp.fold_template(tp.decide_template(s, done), s)
    assert s is not None and s.imported_on == "n2"
    assert tp.evolve_template(None, tp.TemplateImported(
        template_id="x", image_digest="d", node_id="n", at=T0
    )) is None  # fmt: skip
