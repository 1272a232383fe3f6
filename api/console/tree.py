"""A fork family drawn as a tree: where each sandbox goes on the page (pure layout; the SVG
itself is the `tree.html` template).

The family comes from the read model (`projections.console.family`: `forked_from` links,
set from each parent's `SandboxForked`). Layout is the classic tidy one: leaves take
successive columns in fork order, a parent sits centred over its children, each generation
one row lower — a 16-way fork is a wide row, a chain of forks a deep column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BOX_H", "BOX_W", "Drawing", "Edge", "Placed", "layout"]

BOX_W, BOX_H = 188, 40
GAP_X, GAP_Y = 16, 44
MARGIN = 8


@dataclass(frozen=True)
class Placed:
    sandbox_id: str
    status: str
    x: int
    y: int
    current: bool
    depth: int


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Drawing:
    width: int
    height: int
    nodes: tuple[Placed, ...]
    edges: tuple[Edge, ...]
    #: the family is larger than what was read (`FAMILY_LIMIT`)
    truncated: bool = False

    @property
    def has_forks(self) -> bool:
        return len(self.nodes) > 1


def layout(rows: Sequence[dict[str, Any]], current: str, *, truncated: bool = False) -> Drawing:
    """Positions of every sandbox of `rows` (ids, statuses, `forked_from`; in fork order).
    A sandbox whose parent is not among the rows is a root (the family's first ancestor,
    or the top of what was read); several roots stand side by side."""
    ids = [r["sandbox_id"] for r in rows]
    known = set(ids)
    status = {r["sandbox_id"]: r["status"] for r in rows}
    children: dict[str, list[str]] = {sid: [] for sid in ids}
    roots: list[str] = []
    for r in rows:
        parent = r.get("forked_from")
        if isinstance(parent, str) and parent in known and parent != r["sandbox_id"]:
            children[parent].append(r["sandbox_id"])
        else:
            roots.append(r["sandbox_id"])
    column: dict[str, float] = {}
    depth: dict[str, int] = {}
    next_leaf = 0.0

    def place(sid: str, d: int, seen: frozenset[str]) -> float:
        nonlocal next_leaf
        depth[sid] = d
        kids = [c for c in children[sid] if c not in seen]
        if not kids:
            column[sid] = next_leaf
            next_leaf += 1
        else:
            xs = [place(c, d + 1, seen | {c}) for c in kids]
            column[sid] = (xs[0] + xs[-1]) / 2
        return column[sid]

    for root in roots:
        place(root, 0, frozenset({root}))

    def at(sid: str) -> tuple[int, int]:
        return (
            MARGIN + round(column[sid] * (BOX_W + GAP_X)),
            MARGIN + depth[sid] * (BOX_H + GAP_Y),
        )

    nodes = tuple(
        Placed(sid, status[sid], *at(sid), current=sid == current, depth=depth[sid])
        for sid in ids
        if sid in column
    )
    edges: list[Edge] = []
    for parent, kids in children.items():
        if parent not in column:
            continue
        px, py = at(parent)
        for kid in kids:
            if kid in column and depth.get(kid) == depth[parent] + 1:
                kx, ky = at(kid)
                edges.append(Edge(px + BOX_W // 2, py + BOX_H, kx + BOX_W // 2, ky))
    deepest = max(depth.values(), default=0)
    width = 2 * MARGIN + max(1, round(next_leaf)) * (BOX_W + GAP_X) - GAP_X
    height = 2 * MARGIN + (deepest + 1) * (BOX_H + GAP_Y) - GAP_Y
    return Drawing(width, height, nodes, tuple(edges), truncated)
