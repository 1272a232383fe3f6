"""The fork lineage of `aenv events <id>`: climbing to the first ancestor, visiting every
descendant, and drawing the tree — over a dict standing in for the event log."""

from __future__ import annotations

from aenv.ops.lineage import Family, LineageNode, render, walk


def _log(*nodes: LineageNode) -> dict[str, LineageNode]:
    return {n.sandbox_id: n for n in nodes}


LOG = _log(
    LineageNode("root", "running", None, ("a", "b", "bad")),
    LineageNode("a", "killed", "root", ("c",)),
    LineageNode("b", "paused", "root"),
    LineageNode("c", "running", "a"),
)
LOG["root"] = LineageNode("root", "running", None, ("a", "b", "bad"), {"bad": "no slot"})


async def _walk(start: str, log: dict[str, LineageNode], **kw: int) -> Family | None:
    calls: list[str] = []

    async def lookup(sid: str) -> LineageNode | None:
        calls.append(sid)
        return log.get(sid)

    family = await walk(start, lookup, **kw)
    assert len(calls) == len(set(calls)), f"looked up twice: {calls}"
    return family


async def test_tree_from_a_grandchild_reaches_the_root_and_every_branch() -> None:
    family = await _walk("c", LOG)
    assert family is not None and family.root == "root" and family.has_forks
    assert render(family, current="c") == [
        "root  running",
        "├── a  killed",
        "│   └── c  running  <- this sandbox",
        "├── b  paused",
        "└── bad  failed: no slot",
    ]


async def test_unknown_and_unforked_sandboxes() -> None:
    assert await _walk("nope", LOG) is None
    alone = await _walk("solo", _log(LineageNode("solo", "running")))
    assert alone is not None and not alone.has_forks
    assert render(alone, current="solo") == ["solo  running  <- this sandbox"]


async def test_a_lost_ancestor_roots_the_tree_at_the_highest_one_known() -> None:
    log = _log(LineageNode("x", "running", "gone", ("y",)), LineageNode("y", "running", "x"))
    family = await _walk("y", log)
    assert family is not None and family.root == "x"
    assert render(family) == ["x  running", "└── y  running"]


async def test_a_cycle_is_cut_and_a_huge_family_truncated() -> None:
    cyc = _log(LineageNode("p", "running", "q", ("q",)), LineageNode("q", "running", "p", ("p",)))
    family = await _walk("p", cyc)
    assert family is not None and len(render(family)) == 2

    wide = _log(
        LineageNode("r", "running", None, tuple(f"k{i}" for i in range(10))),
        *(LineageNode(f"k{i}", "running", "r") for i in range(10)),
    )
    family = await _walk("r", wide, max_nodes=4)
    assert family is not None and family.truncated and len(family.nodes) == 4
    assert render(family)[-1] == "… (cut at 4 sandboxes)"
