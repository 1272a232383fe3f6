"""An import-linter contract type: no package reaches into another's private names.

import-linter's own contracts see modules, not names: `from domain.sandbox.values import
_b32_id` or `sb.values._b32_id(...)` in the API would pass every layer and private-module
contract while coupling the API to a helper the domain may rename at will. This contract
reads each module of ours and reports, across top-level packages only (inside a package,
underscores are its own business):

- `from a.b import _x` and `import a._b` / `from a._b import x` (private name or module);
- `mod._x` where `mod` was imported from another package (attribute access).

Dunder names (`__all__`, `__version__`) are public. Registered in pyproject.toml as
`private_names`; `lint-imports` (in `make test`) runs it with the other contracts.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass

import grimp
from importlinter import Contract, ContractCheck, fields, output

__all__ = ["PrivateNamesContract", "private_uses"]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _top(module: str) -> str:
    return module.split(".")[0]


@dataclass(frozen=True)
class Use:
    importer: str
    line: int
    what: str


def private_uses(importer: str, source: str, packages: set[str]) -> list[Use]:
    """Private names of other packages among `packages` that `importer`'s source uses."""
    home = _top(importer)
    found: list[Use] = []
    foreign: dict[str, str] = {}  # local name -> the foreign module it came from
    tree = ast.parse(source)

    def outside(module: str) -> bool:
        return _top(module) in packages and _top(module) != home

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not outside(alias.name):
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(Use(importer, node.lineno, f"import {alias.name}"))
                foreign[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not outside(node.module):
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append(Use(importer, node.lineno, f"from {node.module} import ..."))
            for alias in node.names:
                if _private(alias.name):
                    found.append(
                        Use(importer, node.lineno, f"from {node.module} import {alias.name}")
                    )
                foreign[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                what = f"{ast.unparse(node)} ({root.id} is {foreign[root.id]})"
                found.append(Use(importer, node.lineno, what))
    return found


class PrivateNamesContract(Contract):
    """Options: `packages` (the top-level packages whose privacy is checked)."""

    type_name = "private_names"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        packages = {str(p) for p in self.packages}  # type: ignore[attr-defined]
        uses: list[Use] = []
        for module in sorted(graph.modules):
            if _top(module) not in packages:
                continue
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
                continue
            with open(spec.origin, encoding="utf-8") as f:
                uses += private_uses(module, f.read(), packages)
        return ContractCheck(kept=not uses, metadata={"uses": uses})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for use in check.metadata["uses"]:
            output.print_error(f"{use.importer}:{use.line}: {use.what}", bold=False)
            output.new_line()
