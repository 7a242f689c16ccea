"""Print teamrl's package dependency graph (who imports whom, counting imports inside functions too).

    python scripts/package_graph.py            # edges with import counts, then any cycles
    python scripts/package_graph.py --dot      # Graphviz source
    python scripts/package_graph.py --modules  # the same, one node per module (file)

A package is a folder under teamrl/ (teamrl.train, teamrl.engines, ...); a top-level module
(teamrl/hardware.py) counts as its own node. Imports under ``if TYPE_CHECKING:`` (annotations only)
are not dependencies; imports inside functions are. tests/test_layering.py keeps both graphs
acyclic: packages, and modules (``teamrl.engines.hf`` -> ``teamrl.engines.base``, where an import
names the module it loads: ``from teamrl.engines import hf`` is an edge to ``teamrl.engines.hf``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "teamrl"


SPLIT = ("config", "domains", "engines")
"""Packages that are folders of layers: each of their sub-packages is a node of its own (``domains.math``,
``config.tools``, ``engines.cpu``), so a domain may not import a domain that imports it back, and the generic
config tools, the CPU kernels may not import what sits above them."""


def node_of(module: str) -> str | None:
    """The graph node of a dotted module name inside teamrl (``teamrl.train.trainer`` -> ``train``,
    ``teamrl.domains.math.arith`` -> ``domains.math``)."""
    parts = module.split(".")
    if parts[0] != "teamrl" or len(parts) < 2:
        return None
    head = parts[1]
    if head in SPLIT and len(parts) > 2 and (ROOT / head / parts[2]).is_dir():
        return f"{head}.{parts[2]}"
    return head if (ROOT / head).is_dir() else head.removesuffix(".py")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: no run-time dependency)."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            skip |= {id(m) for stmt in n.body for m in ast.walk(stmt)}
    return skip


def _imported(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    is_pkg = path.name == "__init__.py"
    skip = _type_checking_only(tree)
    out = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:  # relative: resolve against this module's package
                base = me.split(".")[: len(me.split(".")) - n.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in n.names]  # `from teamrl import hardware` names a module
    return out


def edges() -> Counter[tuple[str, str]]:
    """(importer node, imported node) -> number of importing files, teamrl-internal only."""
    count: Counter[tuple[str, str]] = Counter()
    for path in sorted(ROOT.rglob("*.py")):
        src = node_of(_module_name(path))
        dsts = {node_of(mod) for mod in _imported(path)}
        for dst in dsts:
            if src and dst and dst != src and ((ROOT / dst.replace(".", "/")).is_dir() or (ROOT / f"{dst}.py").is_file()):
                count[(src, dst)] += 1
    return count


def _module_exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _imported_modules(path: Path) -> set[str]:
    """The teamrl modules one file imports: for ``from pkg import name``, ``pkg.name`` when that is a module,
    else ``pkg`` (whose ``__init__`` defines the name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    is_pkg = path.name == "__init__.py"
    skip = _type_checking_only(tree)
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = me.split(".")[: len(me.split(".")) - n.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            for a in n.names:
                out.add(f"{mod}.{a.name}" if _module_exists(f"{mod}.{a.name}") else mod)
    return {m for m in out if m.split(".")[0] == "teamrl" and m != me and _module_exists(m)}


def module_graph() -> dict[str, set[str]]:
    """Module -> the teamrl modules it imports (at module level or inside a function)."""
    g: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        g[_module_name(path)] = _imported_modules(path)
    return g


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for (a, b) in edges():
        g.setdefault(a, set()).add(b)
        g.setdefault(b, set())
    return g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dot", action="store_true", help="print Graphviz source")
    ap.add_argument("--modules", action="store_true", help="one node per module instead of per package")
    args = ap.parse_args(argv)
    if args.modules:
        g = module_graph()
        e = Counter({(a, b): 1 for a, dsts in g.items() for b in dsts})
        if not args.dot:
            found = cycles(g)
            print(f"{len(g)} modules, {len(e)} imports")
            print("cycles:", "none" if not found else "; ".join(" <-> ".join(c) for c in found))
            return 0
    else:
        e = edges()
    if args.dot:
        print("digraph teamrl {\n  rankdir=LR;")
        for (a, b), n in sorted(e.items()):
            print(f'  "{a}" -> "{b}" [label={n}];')
        print("}")
        return 0
    for (a, b), n in sorted(e.items()):
        print(f"{a:>12} -> {b:<12} {n} file(s)")
    found = cycles(graph())
    module_found = cycles(module_graph())
    print("module cycles:", "none" if not module_found else "; ".join(" <-> ".join(c) for c in module_found))
    print("cycles:", "none" if not found else "; ".join(" <-> ".join(c) for c in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
