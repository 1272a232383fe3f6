"""One registry image, never seen, imported on two nodes at once (issue 41: "two nodes
racing to create from one never-built recipe: one build in the log, both run"). Each node
has its own data dir and image cache; the image is pushed under two tags, so two
image-first templates of one manifest — one recipe. Each node takes one import (sent to
its own command queue, as a pipeline may: placement would leave who imports to chance).
The log holds one claim and one publish for the recipe, one node pulled and converted it,
the other fetched its bytes without a layer, and `Sandbox.create(<ref>)` runs on both."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path

import pytest
from e2b import Sandbox

from bus import Bus, BusSettings, MessageContext
from domain import image as im
from domain import template as tp
from shared.images import image_template_id
from tests.e2e.conftest import Stack
from tests.e2e.test_same_bytes import _own_image_cache
from tests.e2e.test_two_nodes import _node_of, _second_node
from tests.registry import busybox_tree, layout, local_registry, push
from tests.series import node_url, scrape
from tests.support import eventually_sync

pytestmark = pytest.mark.vm

A, B = "e2e", "e2e-two"
#: an import pulls (or fetches), converts and boots the image once under TCG
IMPORT_S = 600


def _image(tmp: Path, mark: str) -> Path:
    top = tmp / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc/mark").write_text(mark)
    return layout(tmp / "layout", busybox_tree(tmp / "base"), top)


async def _import_on_each(nats_url: str, on: dict[str, str]) -> dict[str, str]:
    """`ImportTemplateImage` of each reference on its node, at once; the image digest
    (recipe) each `TemplateImported` names."""
    bus = await Bus.connect(BusSettings(nats_url=nats_url), setup=False)
    try:

        async def one(node: str, ref: str) -> str:
            tid = image_template_id(ref)
            _, version = await bus.templates.load(tid)
            cmd = tp.ImportTemplateImage(template_id=tid, image_ref=ref)
            waiter = asyncio.create_task(
                bus.templates.wait_for_outcome(
                    tid, cmd.command_id, version.seq, (tp.TemplateImported,), IMPORT_S
                )
            )
            await asyncio.sleep(0)  # watching before the node can answer
            await bus.commands.to_node(node, cmd, context=MessageContext(actor="test"))
            rec = await waiter
            assert rec is not None, f"{ref} was not imported on {node} in {IMPORT_S} s"
            assert isinstance(rec.event, tp.TemplateImported), rec.event
            assert rec.event.node_id == node
            return rec.event.image_digest

        digests = await asyncio.gather(*(one(n, r) for n, r in on.items()))
        return dict(zip(on, digests, strict=True))
    finally:
        await bus.close()


async def _log(nats_url: str, recipe: str, refs: list[str]) -> tuple[list[str], list[int]]:
    """The recipe's image events, and each template's number of `TemplateImported`."""
    bus = await Bus.connect(BusSettings(nats_url=nats_url), setup=False)
    try:
        images = [
            type(r.event).__name__ for r in await bus.images.read(im.image_aggregate_id(recipe))
        ]
        imported = [
            sum(isinstance(r.event, tp.TemplateImported) for r in await bus.templates.read(t))
            for t in map(image_template_id, refs)
        ]
        return images, imported
    finally:
        await bus.close()


def _holds(stack: Stack, node: str, ref: str) -> bool:
    """Whether `node`'s heartbeat lists the capture of `ref`'s template."""
    from aenv.ops.fleet import read_beats

    beats = asyncio.run(read_beats(stack.nats_url))
    return any(b.node_id == node and image_template_id(ref) in b.templates for b in beats)


def _counters(stack: Stack, node: str) -> tuple[float, float]:
    """The node's fleet builds of imports and its image fetches."""
    token = json.loads((stack.data_dir / "stack.json").read_text())["metrics_token"]
    samples = scrape(node_url(BusSettings(nats_url=stack.nats_url), node), token)
    built = samples.get(
        ("aenv_image_fleet_builds_total", frozenset({("node", node), ("image", "import")})), 0.0
    )
    return built, samples.get(("aenv_image_fetches_total", frozenset({("node", node)})), 0.0)


def test_racing_imports_of_one_image_on_two_nodes_build_it_once(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from workers.node.image.cache import cache_root
    from workers.node.image.registry import parse_reference, resolve

    shared = cache_root()
    cache, _ = _own_image_cache(shared, tmp_path_factory.mktemp("images-b"), other_bytes=False)
    data = tmp_path_factory.mktemp("node-b")
    mark = uuid.uuid4().hex
    tmp = tmp_path_factory.mktemp("fleet-imports")
    try:
        with (
            local_registry(tmp / "reg") as reg,
            _second_node(
                stack, data, AENV_HEARTBEAT_S="0.5", AENV_IMAGE_CACHE=str(cache),
                AENV_CODE_INTERPRETER="0",
            ),
        ):  # fmt: skip
            image = _image(tmp / "img", mark)
            refs = {A: push(image, reg, "race/one", "a"), B: push(image, reg, "race/one", "b")}
            before = {n: _counters(stack, n) for n in (A, B)}

            recipes = asyncio.run(_import_on_each(stack.nats_url, refs))

            assert recipes[A] == recipes[B]  # one manifest, one recipe
            images, imported = asyncio.run(_log(stack.nats_url, recipes[A], list(refs.values())))
            assert images == ["ImageBuildClaimed", "ImagePublished"]
            assert imported == [1, 1]  # a template each: its own capture on its node
            after = {n: _counters(stack, n) for n in (A, B)}
            built = {n: after[n][0] - before[n][0] for n in (A, B)}
            fetched = {n: after[n][1] - before[n][1] for n in (A, B)}
            assert sorted(built.values()) == [0, 1], built
            builder = A if built[A] else B
            fetcher = B if builder == A else A
            assert fetched[fetcher] == 1 and fetched[builder] == 0, fetched
            # the fetcher pulled no layer, and the builder's finished import dropped its own
            # top layer's blob (`leftovers.finished`): neither holds it
            own = resolve(parse_reference(refs[A]), progress=lambda _: None).layers[-1]
            for blobs in (shared / "blobs", cache / "blobs"):
                assert not (blobs / own.replace(":", "/", 1)).exists(), blobs

            # a capture not uploaded yet is found by the heartbeats that list it: a create
            # before its node's next beat may go to a node that has neither it nor a copy
            # in the repository (the API has no other record of where an import lives)
            for node, ref in refs.items():
                eventually_sync(lambda n=node, r=ref: _holds(stack, n, r), timeout=60)
            for node, ref in refs.items():  # an image-first create of each: both nodes run
                sbx = Sandbox.create(ref, timeout=300, request_timeout=IMPORT_S)
                try:
                    assert sbx.commands.run("cat /etc/mark").stdout == mark
                    assert _node_of(stack, sbx.sandbox_id) == node, (ref, node)
                finally:
                    sbx.kill()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
