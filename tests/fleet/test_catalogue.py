"""Issue 42's catalogue (images-at-scale §4, S14): a catalogue of registry images many times
a node's disk budget, and every image starts a sandbox on that node while its disk use stays
under the budget — eviction makes the room — and an evicted image starts again.

Each image is a Debian layer and a payload layer all of them share, plus a payload layer of
its own (`tests/catalogue.py`: a repeated 4 KiB block per file, a `SHA256SUMS`), made here,
pushed to a `docker-registry` on loopback and deleted after the push. Node A (the machine's
image cache, no budget) imports them all through the unchanged e2b SDK
(`Template.build(from_image)`), then stops. Node B — its own data dir and image cache, its
budget `AENV_DISK_BUDGET_BYTES` — starts and takes one create of each image: the guest checks
its own layer (`sha256sum -c`), while a thread samples B's disk use (`usage.scan` of its state
dir and cache, 10 Hz; `du` every 30 s). Then the first image, evicted meanwhile, starts again.

Two more of the issue's claims ride on the same fleet. Node C — its own data dir and image
cache, a budget with room for what it holds (the base image, runtime disk and kernel: what B
held before any create) and less than any catalogue image asks — runs beside B: every create
lands on B. Image J, whose layers alone fill B's budget, is imported on A like the others: no
node has room for it, and its create is a 503 naming the disk, at once. Last, the templates
are deleted and the fleet's repository GC (`RepositoryGc`, run by C) collects: the S3 store
ends holding no blob that no manifest names — read from the store by the test itself
(`tests/repogc.py`) — the deleted templates' captures and the images under them are gone,
and a `base` sandbox still starts and runs a command.

The suite runs the reduced form (8 images, 3 GiB under a 2 GiB budget, ~6 min);
`make test-catalogue` the issue's full form (~40 min); `AENV_CATALOGUE=off` skips it; the
sizes in `tests/catalogue.py`."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import ServiceBusyException

from aenv.ops.fleet import read_beats
from bench.fleetrig import Fleet, RigError, Role, fleet_rig
from bus.diskroom import template_bytes
from bus.nodes import Heartbeat, is_gone
from tests.catalogue import Form, Sampler, form_from_env, ledger_near, payload, sizes
from tests.e2e.test_big_images import _forget, _image_dir, _read_layout
from tests.registry import debian_tree, local_registry, push
from tests.repogc import Holdings, gc_lines, holdings, images_under
from tests.support import eventually_sync, session_tag
from workers.node.disk.categories import IMAGES, STATE
from workers.node.disk.usage import Tally, scan
from workers.node.image.cache import cache_root
from workers.node.image.oci_write import tar_tree, write_layout
from workers.node.runtime.diskroom import capture_need

FORM = form_from_env()
pytestmark = [
    pytest.mark.vm,
    pytest.mark.slow,
    pytest.mark.fleet,
    pytest.mark.catalogue,
    pytest.mark.timeout(4 * 3600),
    pytest.mark.skipif(FORM is None, reason="AENV_CATALOGUE=off"),
]

MiB = 1 << 20
GiB = 1 << 30
HEADROOM = 128 * MiB
PROGRAMS = ("bash", "sha256sum", "cat", "df", "du")
#: room left on the host beyond what the test makes (the rule for big-image tests)
MARGIN = 20 * 10**9
#: C's budget beyond what B held before any create (base image, runtime disk, kernel; C
#: holds the same) but its capture of `base`, and the headroom: what that capture reserves
#: while it writes at C's start (the base guest's 512 MiB of RAM and device state, 528 MiB,
#: while the booted VM's files hold ~60 MiB more; the capture keeps ~130 MiB), and a
#: little. That leaves C ~520 MiB of room; a catalogue image asks 620 MiB and more (its
#: disk with both payload layers at full size, its capture, the headroom).
SPARE = capture_need(512, 0) + 120 * MiB

#: The fleet's repository GC (`workers/snapshot/gcrun.py`), run by node C only. A round
#: deletes blobs no manifest names once older than `MIN_AGE_S`, then forgets images no
#: uploaded capture names once older than `GRACE_S`. Both are several times what any import
#: of this test takes from its start to its capture's upload (10-40 s each here; J's, the
#: largest, ~30 s), so a round could never take an upload's blobs before its manifest is
#: written, nor forget an image before its template's capture names it —
#: and both are short of the minutes between the last import and the deletes, so the
#: deleted templates' captures and images go as soon as the test asks. Every 10 s: the
#: test waits for about two rounds (a deleted capture's blobs in the first, the image it
#: named is forgotten in it too, and its chunks go in the next).
#: Why C alone (`AENV_REPOSITORY_GC_EVERY_S=0` on A and B): the base image is named by no
#: uploaded capture (every one is of a catalogue image), so once older than the grace a
#: round forgets it, and B and C fetch it from the repository when they start: no round
#: may run before C did. A's rounds would run during the imports (longer than the grace),
#: B's from 10 s after B is ready, racing C's start; C's begin 10 s after it is ready. (The
#: lease's bucket takes its TTL from the first node that opens it: A and B keeping the
#: default, an hour, would also keep C from ever taking it.)
GC_EVERY_S, MIN_AGE_S, GRACE_S = 10, 120, 120


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One API and node A (the builder) running; nodes B (measured) and C (no room for the
    catalogue, the fleet's GC), started by the test."""
    if os.geteuid() != 0:
        pytest.skip("the fleet runs microVMs: needs root")
    assert FORM is not None
    root = Path(tmp_path_factory.mktemp("aenv-catalogue"))
    env = {
        "AENV_HEARTBEAT_S": "1",
        "AENV_NODE_LOST_AFTER_S": "15",
        "AENV_WARM_POOL_MIB": "0",
        "AENV_DISK_HEADROOM_BYTES": str(HEADROOM),
        "AENV_REPOSITORY_GC_EVERY_S": "0",
    }
    node_env = {
        "fleet-b": {
            "AENV_IMAGE_CACHE": str(root / "fleet-b-images"),
            "AENV_DISK_BUDGET_BYTES": str(FORM.budget),
        },
        "fleet-c": {  # its budget set when it starts: what B holds then, and `SPARE`
            "AENV_IMAGE_CACHE": str(root / "fleet-c-images"),
            "AENV_REPOSITORY_GC_EVERY_S": str(GC_EVERY_S),
            "AENV_REPOSITORY_GC_MIN_AGE_S": str(MIN_AGE_S),
            "AENV_REPOSITORY_IMAGE_GRACE_S": str(GRACE_S),
        },
    }
    try:
        with fleet_rig(
            root, apis=1, nodes=3, env=env, tag=session_tag(), node_env=node_env, started=1
        ) as f:
            yield f
    except RigError as e:
        pytest.fail(str(e))
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _Catalogue:
    """The images made, imported on A: template name → (its layer's dir, SHA256SUMS); the
    one no node has room for (J); each template's capture key; and what to delete after."""

    def __init__(self) -> None:
        self.sums: dict[str, tuple[str, str]] = {}
        self.big = ""
        self.keys: dict[str, str] = {}
        self.cleanup: list[tuple[str, dict[str, object], Path | None]] = []
        self.uploaded = 0.0  # monotonic time the last capture was seen uploaded
        self.forgotten = False

    @property
    def templates(self) -> list[str]:
        return [*self.sums, *([self.big] if self.big else [])]


def _make(fleet: Fleet, form: Form, tmp: Path, cat: _Catalogue) -> None:
    run = uuid.uuid4().hex[:8]
    base = debian_tree(tmp / "base", *PROGRAMS)
    (base / "etc/aenv-test-seed").write_text(run + "\n")  # layers no other image shares
    payload(tmp / "shared", "/catalogue/shared", form.shared, f"{run}/shared")
    layers = [tar_tree(base), tar_tree(tmp / "shared")]
    shutil.rmtree(tmp / "shared")
    sdk = fleet.sdk(0)
    # J: its two payload layers alone fill the budget less the headroom (no node's room is
    # more), so no node has room for its disk and capture plus the headroom
    big = form.budget - form.shared - HEADROOM
    with local_registry(tmp / "registry") as registry:
        for i, size in enumerate([*sizes(form, int(run, 16)), big]):
            name = f"cat-{run}-{i:02d}" if i < form.images else f"cat-{run}-big"
            sums = payload(tmp / "own", f"/catalogue/{name}", size, f"{run}/{i}")
            out = tmp / "layout"
            write_layout(out, [*layers, tar_tree(tmp / "own")])
            shutil.rmtree(tmp / "own")
            layout = _read_layout(out)
            ref = push(out, registry, f"catalogue/{name}", "1")
            shutil.rmtree(out)
            logs: list[str] = []
            cat.cleanup.append((ref, layout, None))
            t0 = time.monotonic()
            Template.build(
                Template().from_image(ref),
                name,
                on_build_logs=lambda e, logs=logs: logs.append(e.message),
                **sdk,
            )
            cat.cleanup[-1] = (ref, layout, _image_dir(logs))
            if i < form.images:
                cat.sums[name] = (f"/catalogue/{name}", sums)
            else:
                cat.big = name
            print(
                f"{name}: {size / MiB:.0f} MiB own layer, imported in {time.monotonic() - t0:.0f} s"
            )
    for name in cat.templates:
        t0 = time.monotonic()
        cat.keys[name] = eventually_sync(
            lambda n=name: fleet.capture_key(n), timeout=300, interval=1
        )
        if time.monotonic() - t0 > 1:
            print(f"{name}: capture uploaded {time.monotonic() - t0:.0f} s after its import")
    cat.uploaded = time.monotonic()


#: 503s a create met (template, seconds waited): a node's room is "free now + what it could
#: evict as of its last disk walk" (`NodeDisk.room`, refreshed each minute), so right after
#: a kill the sandbox's disk still counts as pinned and the API turns the next create away
BUSY: list[tuple[str, float]] = []
#: how long a create is retried on 503 (the SDK's "please retry"): past one disk walk
RETRY_S = 150


def _create(fleet: Fleet, name: str) -> Sandbox:
    t0 = time.monotonic()
    while True:
        try:
            sbx = Sandbox.create(name, timeout=600, **fleet.sdk(0))
        except ServiceBusyException:
            if time.monotonic() - t0 > RETRY_S:
                raise
            time.sleep(1)
            continue
        if time.monotonic() - t0 > 5:
            BUSY.append((name, round(time.monotonic() - t0)))
        return sbx


def _node_of(fleet: Fleet, sandbox_id: str) -> str:
    """The node a sandbox runs on, as the API says (`GET /sandboxes/{id}`)."""
    r = httpx.get(
        f"{fleet.api_url(0)}/sandboxes/{sandbox_id}",
        headers={"X-API-KEY": fleet.api_key},
        timeout=30,
    )
    r.raise_for_status()
    return str(r.json()["nodeID"])


def _start(fleet: Fleet, name: str, where: str, sums: str) -> None:
    sbx = _create(fleet, name)
    try:
        on = _node_of(fleet, sbx.sandbox_id)
        assert on == "fleet-b", f"{name} started on {on}, which has no room for it"
        got = sbx.commands.run(f"cat {where}/SHA256SUMS").stdout
        assert got == sums, name
        check = sbx.commands.run(f"cd {where} && sha256sum -c --quiet SHA256SUMS", timeout=600)
        assert check.exit_code == 0, (name, check.stdout, check.stderr)
    finally:
        sbx.kill()


def _mib(tally: dict[str, int]) -> dict[str, int]:
    return {k: round(v / MiB) for k, v in tally.items() if v}


def _forget_all(fleet: Fleet, cat: _Catalogue) -> None:
    if cat.forgotten:
        return
    cat.forgotten = True
    for name in cat.templates:
        try:
            Sandbox.delete_snapshot(name, api_key=fleet.api_key, api_url=fleet.api_url(0))
        except Exception as e:  # cleanup goes on: the stack is dropped after anyway
            print(f"delete {name}: {e}")
    cache = cache_root(None)
    for ref, layout, image in cat.cleanup:
        if image is not None:  # `_forget` drops the names, not the recipes, linking to it
            for link in (cache / "recipes").iterdir():
                if link.is_symlink() and link.resolve() == image.resolve():
                    link.unlink()
        _forget(cache, ref, layout, image)


def _beat(fleet: Fleet, node: str) -> Heartbeat | None:
    """`node`'s heartbeat once it has walked its disk (its room known), else None."""
    for b in asyncio.run(read_beats(fleet.nats.url)):
        if b.node_id == node and b.disk_room is not None and b.disk_used is not None:
            return b
    return None


def _needs(fleet: Fleet, names: list[str]) -> dict[str, int]:
    """What a create of each template asks of a node's disk, by the API's own rule: the
    template row it restores (`api.reads.template_for`), its recorded capture and image
    bytes, and the headroom."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from api.reads import template_for

    async def read() -> dict[str, int]:
        engine = create_async_engine(fleet.database_url)
        try:
            out: dict[str, int] = {}
            for name in names:
                row = await template_for(engine, name)
                assert row is not None, name
                sizes = (row.get("capture_bytes"), row.get("image_bytes"))
                assert None not in sizes, (name, sizes)
                out[name] = HEADROOM + template_bytes(*sizes)
            return out
        finally:
            await engine.dispose()

    return asyncio.run(read())


def _gone(fleet: Fleet, node: str) -> bool:
    beats = {b.node_id: b for b in asyncio.run(read_beats(fleet.nats.url))}
    return is_gone(beats.get(node), time.time())


def _start_c(fleet: Fleet, c: Role, held: Tally, least: int) -> None:
    """Node C, with a budget for what B held before any create and `SPARE`: room for what
    it holds, none for a catalogue image (the least of them asks `least`)."""
    c.env["AENV_DISK_BUDGET_BYTES"] = str(
        held.total - held.bytes.get("capture", 0) + HEADROOM + SPARE
    )
    t0 = time.monotonic()
    c.start()
    c.wait_ready()
    beat = eventually_sync(lambda: _beat(fleet, c.name), timeout=120, interval=0.5)
    assert beat.disk_budget is not None and beat.disk_used is not None
    assert beat.disk_room is not None
    print(
        f"C ready in {time.monotonic() - t0:.0f} s: budget {beat.disk_budget / MiB:.0f} MiB, "
        f"holds {beat.disk_used / MiB:.0f} MiB, room {beat.disk_room / MiB:.0f} MiB; "
        f"a catalogue image asks at least {least / MiB:.0f} MiB"
    )
    assert beat.disk_used + HEADROOM <= beat.disk_budget, "C's budget is short of what it holds"
    assert beat.disk_room < least, "C has room for a catalogue image"


def _refused(fleet: Fleet, name: str) -> None:
    """A create of `name`, which no node has room for, is answered 503 naming the disk
    within seconds: by the API (its body E2B's `{code, message}`) and to the unchanged SDK."""

    def create() -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        r = httpx.post(
            f"{fleet.api_url(0)}/v2/sandboxes",
            json={"templateID": name, "timeout": 60},
            headers={"X-API-KEY": fleet.api_key},
            timeout=120,
        )
        return r, time.monotonic() - t0

    r, took = create()
    print(f"{name}: {r.status_code} in {took:.1f} s: {r.text}")
    assert r.status_code == 503, r.text
    assert took < 5, f"answered after {took:.1f} s"
    body = r.json()
    assert body["code"] == 503, body
    # it names the template's capture: the row a create of `name` restores
    assert "no node has disk room for template" in body["message"], body
    # the SDK tries a 503 again as its Retry-After (5 s) says, three times, then raises
    t0 = time.monotonic()
    with pytest.raises(ServiceBusyException, match="disk room"):
        Sandbox.create(name, timeout=60, **fleet.sdk(0))
    assert time.monotonic() - t0 < 30


def _collected(fleet: Fleet, gc: Role, cat: _Catalogue, gone: set[str]) -> Holdings:
    """Until the store holds no blob that no manifest names and none of the manifests in
    `gone` (the deleted templates' captures, the images under them), as the test reads the
    store; bounded by a few GC rounds past the age the youngest upload must reach."""
    young = max(0.0, max(MIN_AGE_S, GRACE_S) - (time.monotonic() - cat.uploaded))
    deadline = time.monotonic() + young + 3 * GC_EVERY_S + 60
    t0 = time.monotonic()
    while True:
        h = holdings(gc.env)
        left = gone & h.manifests.keys()
        if not h.orphans and not left:
            print(f"collected {time.monotonic() - t0:.0f} s after the deletes: {h.describe()}")
            return h
        if time.monotonic() > deadline:
            pytest.fail(
                f"not collected in {time.monotonic() - t0:.0f} s: {h.describe()}; "
                f"manifests left that should be gone: {sorted(left)}\n"
                + "\n".join(gc_lines(gc.tail(4000)))
            )
        time.sleep(2)


def _base_restores(fleet: Fleet, node: str) -> None:
    """A `base` sandbox starts on `node` and runs a command."""
    t0 = time.monotonic()
    sbx = _create(fleet, "base")
    try:
        assert _node_of(fleet, sbx.sandbox_id) == node
        out = sbx.commands.run("echo the base restores")
        assert out.stdout.strip() == "the base restores", out
        print(f"base: a sandbox on {node} in {time.monotonic() - t0:.0f} s ran a command")
    finally:
        sbx.kill()


def _gc_after_deletes(fleet: Fleet, gc: Role, cat: _Catalogue) -> None:
    """Delete every template (their sandboxes were killed) and forget their images here;
    the GC leaves the store holding only what a manifest names, and the base restores."""
    env = gc.env
    before = holdings(env)
    captures = set(cat.keys.values())
    assert captures <= before.manifests.keys(), sorted(captures - before.manifests.keys())
    images = set().union(*images_under(env, sorted(captures)).values())
    gone = captures | (images & before.manifests.keys())
    print(
        f"\nS3 before the deletes: {before.describe()}; to go: {len(captures)} captures, "
        f"{len(gone) - len(captures)} images (not stored: {sorted(images - gone)})"
    )
    _forget_all(fleet, cat)
    after = _collected(fleet, gc, cat, gone)
    print(
        f"GC on {gc.name}: {len(before.blobs) - len(after.blobs)} blobs "
        f"({(sum(before.blobs.values()) - sum(after.blobs.values())) / MiB:.0f} MiB) and "
        f"{len(before.manifests) - len(after.manifests)} manifests gone; left: "
        f"{sorted(after.manifests)}\n" + "\n".join(gc_lines(gc.tail(4000)))
    )
    # the base restores on B, the catalogue's node, whatever its budget evicted meanwhile
    # and whatever the GC forgot (no uploaded capture names the base image): C, which
    # holds `base` too, stops first
    gc.stop()
    eventually_sync(lambda: _gone(fleet, gc.name), timeout=60, interval=0.5)
    _base_restores(fleet, "fleet-b")


def test_a_catalogue_many_times_the_budget_starts_on_one_node(pair: Fleet, tmp_path: Path) -> None:
    form = FORM
    assert form is not None
    big = form.budget - form.shared - HEADROOM
    need = form.shared + form.images * form.distinct[1] * 2 + 2 * big + MARGIN
    for p in (tmp_path, cache_root(None)):
        free = shutil.disk_usage(p).free
        if free < need:
            pytest.skip(f"{p}: {free / GiB:.1f} GiB free, the test needs {need / GiB:.1f}")
    a, b, c = pair.nodes
    cat = _Catalogue()
    t0 = time.monotonic()
    try:
        _make(pair, form, tmp_path, cat)
        made = time.monotonic() - t0
        a.stop()  # B alone takes the creates: the catalogue must pass through its budget
        b.start()
        b.wait_ready()
        sampler = Sampler(b.data_dir / "node", pair.root / "fleet-b-images", budget=form.budget)
        # what B holds before any create (base image, runtime disk, kernel): the images
        # share what is left of the budget
        held = scan([(STATE, sampler.state), (IMAGES, sampler.cache)])
        print(f"\nB holds {held.total / MiB:.0f} MiB before any create: {_mib(held.bytes)}")
        needs = _needs(pair, cat.templates)
        print(f"a create's disk need (MiB): { {n: v // MiB for n, v in needs.items()} }")
        _start_c(pair, c, held, min(needs[n] for n in cat.sums))
        _refused(pair, cat.big)
        names = list(cat.sums)
        first: set[str] = set()
        try:
            with sampler:
                for i, name in enumerate(names):
                    before, t1 = sampler.entries(), time.monotonic()
                    _start(pair, name, *cat.sums[name])
                    print(
                        f"{name} checked on B in {time.monotonic() - t1:.0f} s; peak so far "
                        f"{sampler.peak / MiB:.0f} MiB"
                    )
                    if i == 0:
                        first = sampler.entries() - before
                time.sleep(1.5)  # one more listing of the entries
                evicted_first = first & sampler.gone
                _start(pair, names[0], *cat.sums[names[0]])  # evicted: fetched again
        finally:
            print(
                f"\ncatalogue: {form.images} images, shared {form.shared / MiB:.0f} MiB, "
                f"{form.catalogue / GiB:.2f} GiB ({form.catalogue / form.budget:.1f}x the "
                f"{form.budget / GiB:.2f} GiB budget); made+imported in {made:.0f} s, "
                f"all in {time.monotonic() - t0:.0f} s; peak {sampler.peak / MiB:.0f} MiB "
                f"{sampler.peak_mib} over {sampler.samples} samples, "
                f"du peak {sampler.du_peak / MiB:.0f} MiB over "
                f"{sampler.du_runs} runs; {len(sampler.gone)} entries evicted "
                f"({len(first & sampler.gone)} of the first image's {len(first)}); "
                f"over the budget: {sampler.over[:5]}; creates that met 503s first: {BUSY}"
            )
            print("\n".join(ln for ln in b.tail(4000).splitlines() if "evict" in ln)[-3000:])
        assert form.catalogue > 2 * (form.budget - held.total), "not a catalogue test"
        assert sampler.over == [], (
            f"over the budget: {sampler.over[:10]}\n{sampler.over_dump}\n"
            f"B's log around it:\n{ledger_near(b.tail(10_000_000), sampler.over_at)}"
        )
        assert sampler.du_peak <= form.budget
        assert evicted_first, f"nothing of {names[0]} evicted: {sorted(first)}"
        t1 = time.monotonic()
        _gc_after_deletes(pair, c, cat)
        print(f"deletes, GC and the base's create: {time.monotonic() - t1:.0f} s")
    finally:
        _forget_all(pair, cat)
        for made_here in ("base", "registry"):
            shutil.rmtree(tmp_path / made_here, ignore_errors=True)
