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


def test_modules_import_each_other_without_cycles():
    """One node per file; imports inside functions count, imports under ``if TYPE_CHECKING:`` do not."""
    pg = _graph_module()
    graph = pg.module_graph()
    assert {"teamrl.config.schema", "teamrl.domains.math.arith", "teamrl.engines.cpu.attention"} <= set(graph)
    assert pg.cycles(graph) == []


def test_the_module_graph_sees_function_local_imports_and_skips_type_checking_ones():
    pg = _graph_module()
    graph = pg.module_graph()
    assert "teamrl.engines.hf" in graph["teamrl.engines.registry"]  # imported inside _build_hf
    assert "teamrl.config.schema" not in graph["teamrl.engines.registry"]  # under TYPE_CHECKING only
    assert "teamrl.engines.cpu.attention" in graph["teamrl.engines.fast_decoder"]  # from teamrl.engines.cpu import x


def test_each_domain_is_a_package_of_its_own_over_the_core():
    domains = {p.name for p in (ROOT / "teamrl" / "domains").iterdir() if (p / "__init__.py").is_file()}
    assert domains >= {"math", "search", "code", "environments", "catalogues"}
    pg = _graph_module()
    g = pg.graph()
    assert not {d for d in g.get("tasks", set()) | g.get("team", set()) if d.startswith("domains.")}, \
        "the core (tasks/, team/) imports no domain; the registries find them through teamrl.domains"


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
