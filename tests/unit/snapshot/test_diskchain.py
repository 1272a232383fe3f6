"""qcow2 header parsing against files written by the node's in-process qcow2 writer."""

from pathlib import Path

import pytest

from workers.node.runtime.qcow2 import create_overlay
from workers.snapshot import LayoutError
from workers.snapshot.diskchain import check_chain, read_backing, walk_chain


def chain(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    base = tmp_path / "base.raw"
    with open(base, "wb") as f:
        f.truncate(8 << 20)
    layers: list[Path] = []
    for i in range(n):
        layer = tmp_path / f"l{i}.qcow2"
        below, fmt = (base, "raw") if not layers else (layers[-1], "qcow2")
        create_overlay(layer, below, fmt)
        layers.append(layer)
    return base, layers


def test_read_backing(tmp_path: Path) -> None:
    _, layers = chain(tmp_path, 2)
    b = read_backing(layers[1])
    assert b.path == layers[0] and b.format == "qcow2"
    assert read_backing(layers[0]).format == "raw"


def test_walk_and_check_chain(tmp_path: Path) -> None:
    base, layers = chain(tmp_path, 3)
    assert walk_chain(layers[-1]) == (layers, base)
    assert check_chain(layers) == base


def test_broken_chains_are_refused(tmp_path: Path) -> None:
    base, layers = chain(tmp_path, 3)
    with pytest.raises(LayoutError, match="backed by"):
        check_chain([layers[0], layers[2]])
    with pytest.raises(LayoutError, match="raw base"):
        check_chain(layers[1:])
    with pytest.raises(LayoutError, match="not a qcow2"):
        read_backing(base)


def test_a_missing_layer_is_a_layout_error(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="unreadable"):
        walk_chain(tmp_path / "gone.qcow2")


def test_a_lazy_base_s_stub_is_the_base_never_a_layer(tmp_path: Path) -> None:
    """Issue 29: a chain over a lazy base ends at its stub (a qcow2 over an NBD spec): the
    stub is what a capture's upload skips and what its size is read from."""
    from shared.lazybase import base_format, base_size, chain_to_base, is_lazy_base, nbd_backing
    from workers.node.runtime.qcow2 import write_overlay

    stub = tmp_path / "root.lazy.qcow2"
    write_overlay(stub, nbd_backing(tmp_path / "blocks.sock", "ab" * 32), "raw", 9 << 30)
    layers = [tmp_path / "l0.qcow2", tmp_path / "l1.qcow2"]
    create_overlay(layers[0], stub, "qcow2")
    create_overlay(layers[1], layers[0], "qcow2")
    assert is_lazy_base(stub) and not is_lazy_base(layers[0])
    assert base_size(stub) == 9 << 30 and base_format(stub) == "qcow2"
    assert walk_chain(layers[-1]) == (layers, stub)
    assert check_chain(layers) == stub
    assert chain_to_base(layers[-1]) == [layers[1], layers[0], stub]
    (tmp_path / "raw").mkdir()
    base, raw_layers = chain(tmp_path / "raw", 1)
    assert base_format(base) == "raw" and base_size(base) == 8 << 20
    assert chain_to_base(raw_layers[0]) == [raw_layers[0], base]
