"""Fork lineage for `aenv events <id>`: the whole family tree a sandbox belongs to, from the
first ancestor down through every fork child (`forked_from` upwards, `SandboxForked`
children downwards), drawn like `tree(1)`.

Pure: `walk` is given the function that looks one sandbox up, so it runs over the event
log in the CLI and over a dict in the unit tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_NODES", "Family", "LineageNode", "render", "walk"]

#: A tree this big is printed cut short: every node costs one read of the event log.
MAX_NODES = 500


@dataclass(frozen=True)
class LineageNode:
    """One sandbox as the lineage needs it: its status, parent, and fork children in the
    order they were forked (a child that failed to start carries its error instead)."""

    sandbox_id: str
    status: str
    parent: str | None = None
    children: tuple[str, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    root: str
    nodes: Mapping[str, LineageNode]
    truncated: bool = False

    @property
    def has_forks(self) -> bool:
        """False for a sandbox that neither was forked nor forked: nothing to draw."""
        return len(self.nodes) > 1 or any(n.errors for n in self.nodes.values())


Lookup = Callable[[str], Awaitable[LineageNode | None]]


async def walk(start: str, lookup: Lookup, max_nodes: int = MAX_NODES) -> Family | None:
    """The family of `start`: climb `parent` links to the first ancestor, then visit every
    descendant breadth-first. None if `start` itself is unknown. Ancestors that cannot be
    found end the climb (the tree is rooted at the highest one known); a cycle, which the
    log should never contain, is cut where it closes."""
    node = await lookup(start)
    if node is None:
        return None
    nodes: dict[str, LineageNode] = {start: node}
    root = node
    while root.parent is not None and root.parent not in nodes and len(nodes) < max_nodes:
        parent = await lookup(root.parent)
        if parent is None:
            break
        nodes[parent.sandbox_id] = root = parent
    queue, truncated = [root.sandbox_id], False
    while queue:
        current = nodes[queue.pop(0)]
        for child in current.children:
            if child in nodes:
                continue
            if len(nodes) >= max_nodes:
                truncated = True
                break
            found = await lookup(child)
            if found is not None:
                nodes[child] = found
                queue.append(child)
    return Family(root.sandbox_id, nodes, truncated)


def render(family: Family, current: str | None = None) -> list[str]:
    """`tree(1)`-style lines: `sandbox  status`, the `current` one marked, failed children
    shown with their error, children in fork order."""
    lines: list[str] = []

    def label(sid: str, error: str | None) -> str:
        node = family.nodes.get(sid)
        text = f"{sid}  {node.status}" if node else f"{sid}  failed: {error or 'unknown'}"
        return f"{text}  <- this sandbox" if sid == current else text

    def visit(sid: str, prefix: str, seen: frozenset[str]) -> None:
        node = family.nodes[sid]
        kids = [c for c in node.children if c in family.nodes or c in node.errors]
        kids = [c for c in kids if c not in seen]
        for i, child in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(
                f"{prefix}{'└── ' if last else '├── '}{label(child, node.errors.get(child))}"
            )
            if child in family.nodes:
                visit(child, prefix + ("    " if last else "│   "), seen | {child})

    lines.append(label(family.root, None))
    visit(family.root, "", frozenset({family.root}))
    if family.truncated:
        lines.append(f"… (cut at {len(family.nodes)} sandboxes)")
    return lines
