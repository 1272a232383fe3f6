"""An import-linter contract type: no two modules of ours import each other, at any distance.

import-linter's own contracts constrain packages against each other; none forbids a circle
between two modules of one package (`workers.node.forks` ⇄ `workers.node.worker`). A circle
means neither module can be read, tested or moved without the other: it is one module in two
files. Imports under `if TYPE_CHECKING:` count too (import-linter builds its graph with them
by default), because a type-only back-reference couples the two as much as a real one — the
way out is a narrow Protocol on the inner side, not a hidden import.

Reported as the strongly connected components of the module graph (Tarjan), each with one
shortest circle through it so the fix is obvious. Registered in pyproject.toml as `acyclic`.
"""

from __future__ import annotations

from collections.abc import Iterable

import grimp
from importlinter import Contract, ContractCheck, fields, output

__all__ = ["AcyclicContract", "circles"]


def circles(modules: Iterable[str], imports_of: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules (each sorted, two or more) that reach each other by imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        # iterative Tarjan: the module graph is deep enough to hit Python's recursion limit
        work: list[tuple[str, list[str]]] = [(root, sorted(imports_of.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(imports_of.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


class AcyclicContract(Contract):
    """Options: `packages` (the top-level packages whose modules must form no circle)."""

    type_name = "acyclic"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        tops = {str(p) for p in self.packages}  # type: ignore[attr-defined]
        ours = {m for m in graph.modules if m.split(".")[0] in tops}
        imports_of = {m: graph.find_modules_directly_imported_by(m) & ours for m in ours}
        groups = circles(ours, imports_of)
        shown = []
        for group in groups:
            first, second = group[0], group[1]
            there = graph.find_shortest_chain(importer=first, imported=second) or ()
            back = graph.find_shortest_chain(importer=second, imported=first) or ()
            shown.append((group, [*there, *back[1:]]))
        return ContractCheck(kept=not groups, metadata={"groups": shown})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group, circle in check.metadata["groups"]:
            output.print_error(f"{len(group)} modules import each other: {', '.join(group)}")
            output.new_line()
            if circle:
                output.print_error("  e.g. " + " -> ".join(circle), bold=False)
                output.new_line()
