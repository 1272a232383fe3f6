"""Image-first creates against the live API and the in-memory host (which "imports" a
registry reference without pulling it): a reference where a template goes, or under
`aenv.image` in the metadata, is imported once and answered with the reference as the
sandbox's `templateID`; 16 concurrent first uses of one reference are one import in the log
and one on the node's counter. The e2e tier does the same with real images and VMs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.imagefirst import builds_counted, imports_in_log
from tests.vmless.conftest import METRICS_TOKEN, VmlessStack, vmless_stack

NODE = "vmless"


def _imports(stack: VmlessStack, image: str) -> int:
    return imports_in_log(stack.bus_settings, image)


def _builds(stack: VmlessStack) -> float:
    return builds_counted(stack.bus_settings, NODE, METRICS_TOKEN)


def _create(c: httpx.Client, template: str, **extra: object) -> httpx.Response:
    return c.post("/v2/sandboxes", json={"templateID": template, "timeout": 60, **extra})


def test_an_image_where_a_template_goes(vmless: VmlessStack) -> None:
    tag = uuid.uuid4().hex[:8]
    port_ref = f"127.0.0.1:5999/cat/a:{tag}"
    meta_ref = f"docker.io/library/imgfirst:{tag}"
    with vmless.client(timeout=60) as c:
        for attempt in range(2):  # imported, then as any template
            r = _create(c, port_ref)
            assert r.status_code == 201, (attempt, r.text)
            assert r.json()["templateID"] == port_ref
            got = c.get(f"/sandboxes/{r.json()['sandboxID']}")
            assert got.status_code == 200 and got.json()["templateID"] == port_ref
        r = _create(c, "base", metadata={"aenv.image": meta_ref})
        assert r.status_code == 201, r.text
        assert r.json()["templateID"] == meta_ref
    assert _imports(vmless, port_ref) == 1 and _imports(vmless, meta_ref) == 1


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmlessStack]:
    """A stack whose host takes 2 s per operation: the first use's import is still running
    when all 16 creates of it have looked at the log, as a real import (a minute) is."""
    with vmless_stack(tmp_path_factory.mktemp("aenv-slow"), AENV_MEMORY_HOST_DELAY_S="2") as st:
        yield st


def test_concurrent_first_uses_of_one_reference_are_one_import(slow: VmlessStack) -> None:
    ref = f"registry.example:5000/many/img:{uuid.uuid4().hex[:8]}"
    before = _builds(slow)

    def first_use(_: int) -> httpx.Response:
        with slow.client(timeout=60) as c:
            return _create(c, ref)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(first_use, range(16)))
    assert [a.status_code for a in answers] == [201] * 16, [a.text for a in answers]
    assert len({a.json()["sandboxID"] for a in answers}) == 16
    assert _imports(slow, ref) == 1
    assert _builds(slow) == before + 1
