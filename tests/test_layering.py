"""The package structure stays a picture a newcomer can hold: no import cycles between packages,
the loop does not know the backend, and optional heavy dependencies stay in their one package."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_module():
    spec = importlib.util.spec_from_file_location("package_graph", ROOT / "scripts" / "package_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packages_import_each_other_without_cycles():
    pg = _graph_module()
    assert pg.cycles(pg.graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    pg = _graph_module()
    assert pg.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_training_loop_does_not_know_the_backend():
    assert not {p for p in _importers_of("teamrl.runtime.distributed") if p.startswith("teamrl/train/")}
    assert _importers_of("teamrl.runtime.distributed") <= {  # where the backend is chosen, and the backend itself
        "teamrl/runtime/__init__.py", "teamrl/runtime/distributed/backend.py", "teamrl/runtime/distributed/worker.py"}


def _importers_of(top: str) -> set[str]:
    found = set()
    for path in (ROOT / "teamrl").rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module or "", *(f"{n.module}.{a.name}" for a in n.names)] \
                if isinstance(n, ast.ImportFrom) and not n.level else []
            if any(name == top or name.startswith(top + ".") for name in names):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_optional_backends_are_imported_in_one_place_each():
    assert _importers_of("ray") <= {"teamrl/runtime/distributed/backend.py", "teamrl/runtime/distributed/worker.py",
                                    "teamrl/runtime/distributed/dp.py"}
    assert _importers_of("vllm") == {"teamrl/engines/vllm.py"}
