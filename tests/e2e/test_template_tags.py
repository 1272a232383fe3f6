"""Template tags on real microVMs, through the e2b SDK: `Sandbox.create("name:v1")` runs
v1's content after `name` was rebuilt as v2 — the node keeps each build's capture while a
tag names it — `default` follows the latest build and can be pointed back at v1, and
deleting the template frees every build's capture on the node."""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox, Template

from tests.e2e.conftest import Stack
from tests.support import eventually_sync

pytestmark = pytest.mark.vm


def _content(ref: str) -> str:
    sbx = Sandbox.create(ref)
    try:
        assert sbx.get_info().template_id == ref.split(":", 1)[0]
        return sbx.commands.run("cat /opt/which").stdout.strip()
    finally:
        sbx.kill()


def test_a_tag_starts_its_build_after_the_name_is_rebuilt(stack: Stack) -> None:
    name = f"tagged-{uuid.uuid4().hex[:8]}"
    records = stack.data_dir / "node" / "snapshot-templates"
    v1 = Template.build(
        Template().from_template("base").run_cmd("echo one > /opt/which"), f"{name}:v1"
    )
    v2 = Template.build(Template().from_template("base").run_cmd("echo two > /opt/which"), name)
    try:
        assert {t.tag: t.build_id for t in Template.get_tags(name)} == {
            "v1": v1.build_id,
            "default": v2.build_id,
        }
        # both builds' captures are on the node, each under a name of its own
        assert len(list(records.glob(f"{name}_*.json"))) == 2
        assert _content(f"{name}:v1") == "one"
        assert _content(name) == "two"
        assert _content(f"{name}:default") == "two"

        # a rollback: `default` back at v1's build; v2's is left to no tag (released)
        info = Template.assign_tags(f"{name}:v1", "default")
        assert info.build_id == v1.build_id
        assert _content(name) == "one"
        # a build FROM a tag starts from that build
        v3 = Template.build(
            Template()
            .from_template(f"{name}:v1")
            .run_cmd("cat /opt/which > /opt/from; echo three > /opt/which"),
            f"{name}-child",
        )
        assert v3.template_id == f"{name}-child"
        sbx = Sandbox.create(f"{name}-child")
        try:
            assert sbx.commands.run("cat /opt/from /opt/which").stdout == "one\nthree\n"
        finally:
            sbx.kill()
    finally:
        assert Sandbox.delete_snapshot(name)  # DELETE /templates/{id}: every tag goes
        Sandbox.delete_snapshot(f"{name}-child")
    assert not Template.exists(name)
    # the node frees every build's capture of the deleted template
    eventually_sync(lambda: not any(records.glob(f"{name}_*.json")), timeout=30)
