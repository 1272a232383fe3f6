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

The suite runs the reduced form (8 images, 3 GiB under a 2 GiB budget, ~5 min);
`make test-catalogue` the issue's full form (~40 min); `AENV_CATALOGUE=off` skips it; the
sizes in `tests/catalogue.py`."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import ServiceBusyException

from bench.fleetrig import Fleet, RigError, fleet_rig
from tests.catalogue import Form, Sampler, form_from_env, payload, sizes
from tests.e2e.test_big_images import _forget, _image_dir, _read_layout
from tests.registry import debian_tree, local_registry, push
from tests.support import eventually_sync, session_tag
from workers.node.disk.categories import IMAGES, STATE
from workers.node.disk.usage import scan
from workers.node.image.cache import cache_root
from workers.node.image.oci_write import tar_tree, write_layout

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


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One API and node A (the builder) running; node B, measured, started by the test."""
    if os.geteuid() != 0:
        pytest.skip("the fleet runs microVMs: needs root")
    assert FORM is not None
    root = Path(tmp_path_factory.mktemp("aenv-catalogue"))
    env = {
        "AENV_HEARTBEAT_S": "1",
        "AENV_NODE_LOST_AFTER_S": "15",
        "AENV_WARM_POOL_MIB": "0",
        "AENV_DISK_HEADROOM_BYTES": str(HEADROOM),
    }
    node_env = {
        "fleet-b": {
            "AENV_IMAGE_CACHE": str(root / "fleet-b-images"),
            "AENV_DISK_BUDGET_BYTES": str(FORM.budget),
        }
    }
    try:
        with fleet_rig(
            root, apis=1, nodes=2, env=env, tag=session_tag(), node_env=node_env, started=1
        ) as f:
            yield f
    except RigError as e:
        pytest.fail(str(e))
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _Catalogue:
    """The images made, imported on A: template name → (its layer's dir, SHA256SUMS); and
    what to delete after."""

    def __init__(self) -> None:
        self.sums: dict[str, tuple[str, str]] = {}
        self.cleanup: list[tuple[str, dict[str, object], Path | None]] = []


def _make(fleet: Fleet, form: Form, tmp: Path, cat: _Catalogue) -> None:
    run = uuid.uuid4().hex[:8]
    base = debian_tree(tmp / "base", *PROGRAMS)
    (base / "etc/aenv-test-seed").write_text(run + "\n")  # layers no other image shares
    payload(tmp / "shared", "/catalogue/shared", form.shared, f"{run}/shared")
    layers = [tar_tree(base), tar_tree(tmp / "shared")]
    shutil.rmtree(tmp / "shared")
    sdk = fleet.sdk(0)
    with local_registry(tmp / "registry") as registry:
        for i, size in enumerate(sizes(form, int(run, 16))):
            name = f"cat-{run}-{i:02d}"
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
            cat.sums[name] = (f"/catalogue/{name}", sums)
            print(
                f"{name}: {size / MiB:.0f} MiB own layer, imported in {time.monotonic() - t0:.0f} s"
            )
    for name in cat.sums:
        eventually_sync(lambda n=name: fleet.capture_key(n), timeout=300, interval=1)


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
            time.sleep(5)
            continue
        if time.monotonic() - t0 > 5:
            BUSY.append((name, round(time.monotonic() - t0)))
        return sbx


def _start(fleet: Fleet, name: str, where: str, sums: str) -> None:
    sbx = _create(fleet, name)
    try:
        got = sbx.commands.run(f"cat {where}/SHA256SUMS").stdout
        assert got == sums, name
        check = sbx.commands.run(f"cd {where} && sha256sum -c --quiet SHA256SUMS", timeout=600)
        assert check.exit_code == 0, (name, check.stdout, check.stderr)
    finally:
        sbx.kill()


def _mib(tally: dict[str, int]) -> dict[str, int]:
    return {k: round(v / MiB) for k, v in tally.items() if v}


def _forget_all(fleet: Fleet, cat: _Catalogue) -> None:
    for name in cat.sums:
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


def test_a_catalogue_many_times_the_budget_starts_on_one_node(pair: Fleet, tmp_path: Path) -> None:
    form = FORM
    assert form is not None
    need = form.shared + form.images * form.distinct[1] * 2 + MARGIN
    for p in (tmp_path, cache_root(None)):
        free = shutil.disk_usage(p).free
        if free < need:
            pytest.skip(f"{p}: {free / GiB:.1f} GiB free, the test needs {need / GiB:.1f}")
    a, b = pair.nodes
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
        assert sampler.over == [], f"over the budget: {sampler.over[:10]}"
        assert sampler.du_peak <= form.budget
        assert evicted_first, f"nothing of {names[0]} evicted: {sorted(first)}"
    finally:
        _forget_all(pair, cat)
        for made_here in ("base", "registry"):
            shutil.rmtree(tmp_path / made_here, ignore_errors=True)
