"""The scoring component's bars: one place between rollout and update, small signatures, the estimator read in
few files, and a core that names no domain and no serve module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from teamrl.config.schema import load_config
from teamrl.config.sections import AlgoConfig
from teamrl.scoring import STAGES, Context, Scorer, Stage, register_stage
from teamrl.scoring.stages import active_stages

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "teamrl"
CORE = ("algos", "config", "engines", "learner", "metrics", "plan", "runtime", "scoring", "tasks", "team", "train",
        "allocator.py", "hardware.py", "models.py", "plugins.py", "suggest.py", "tokens.py")
"""The core: everything but the domains, the endpoint (serve), the apps over it (cli, study, smoke, export)."""


def _files(*tops: str) -> list[Path]:
    out: list[Path] = []
    for top in tops:
        path = PKG / top
        out += [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
    return out


def _names_and_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Imported module names and string constants of ``tree`` (a logger's name is not an import)."""
    loggers = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "getLogger"
               for a in n.args}
    found: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            found += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and not n.level:
            found.append((n.lineno, n.module or ""))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in loggers:
            found.append((n.lineno, n.value))
    return found


def test_the_core_imports_no_domain_and_no_serve_module_by_name_or_string():
    pattern = re.compile(r"^teamrl\.(domains|serve)(\.|$)")
    found = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _files(*CORE)
             for line, name in _names_and_strings(ast.parse(p.read_text())) if pattern.match(name)]
    assert found == [], "the core finds domains and the endpoint through teamrl.plugins (entry points)"


def test_the_planted_violation_is_seen():
    tree = ast.parse("import importlib\nimportlib.import_module('teamrl.serve.agent_program')\n"
                     "import logging\nlogging.getLogger('teamrl.domains.math.math')\n")
    assert [n for _, n in _names_and_strings(tree) if n.startswith("teamrl.")] == ["teamrl.serve.agent_program"]


def _reads_estimator(tree: ast.AST) -> bool:
    """``<...>.algo.estimator`` / ``algo.estimator`` read or defined, or an ``algo.estimator=`` override written."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "estimator" and (
                isinstance(n.value, ast.Name) and n.value.id == "algo"
                or isinstance(n.value, ast.Attribute) and n.value.attr == "algo"):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "algo.estimator=" in n.value:
            return True
        if isinstance(n, ast.Tuple) and [getattr(e, "value", None) for e in n.elts] == ["algo", "estimator"]:
            return True
        if isinstance(n, ast.ClassDef) and n.name == "AlgoConfig":
            return True
    return False


def test_algo_estimator_is_read_in_at_most_four_files():
    files = sorted(str(p.relative_to(ROOT)) for p in _files(".") if _reads_estimator(ast.parse(p.read_text())))
    assert len(files) <= 4, files
    assert "teamrl/scoring/advantages.py" in files and "teamrl/train/trainer.py" not in files


def test_no_function_between_rollout_and_update_takes_more_than_six_parameters():
    wide = []
    for path in [*_files("scoring"), PKG / "train" / "trainer.py"]:
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                a = n.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + \
                    [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                names = [x for x in names if x not in ("self", "cls")]
                if len(names) > 6:
                    wide.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.name}({', '.join(names)})")
    assert wide == []


def test_each_kind_gets_its_stages_from_the_config():
    algo = AlgoConfig(estimator="rae")
    assert [c.name for c in active_stages("advantages", algo)] == ["running_baseline"]
    assert [c.name for c in active_stages("rewards", AlgoConfig(overlong_buffer=4, format_penalty=0.1))] == \
        ["format_penalty", "overlong_penalty"]
    assert [c.name for c in active_stages("selection", AlgoConfig(group_filter="dapo"))] == ["group_filter"]
    assert [c.name for c in active_stages("credit", AlgoConfig(credit="shapley"))] == ["shapley"]
    scorer = Scorer.build(AlgoConfig(), Context())
    assert (scorer.credit.name, scorer.advantages.name, scorer.selection.name) == ("none", "group", "all")


def test_a_registered_stage_runs_without_any_other_change():
    """A reward term of one's own: registered, it is active when its option says so and applies in its order."""
    from teamrl.scoring import score_steps
    from teamrl.scoring.rewards import RewardTerm
    from teamrl.team.records import Episode, Step

    @register_stage
    class Doubled(RewardTerm):
        name = "test_doubled"
        order = 30

        @classmethod
        def active(cls, algo):
            return algo.eps == 1e-3

        @classmethod
        def build(cls, algo, ctx):
            return cls()

        def apply(self, episodes, steps, rewards):
            return rewards * 2

    try:
        eps = [Episode(prompt_index=0, index=i, problem_id="p", reward=r) for i, r in enumerate([1.0, 0.0])]
        for ep in eps:
            ep.steps.append(Step(0, ep.index, "solver", 0, "m", [1], [2], [-0.1], 1.0, "x", True))
        assert [s.reward for s in score_steps(eps, AlgoConfig(eps=1e-3))] == [2.0, 0.0]
        assert [s.reward for s in score_steps(eps, AlgoConfig())] == [1.0, 0.0]
    finally:
        del STAGES["rewards"]["test_doubled"]


def test_a_stage_name_is_registered_once():
    class Twice(Stage):
        kind, name = "rewards", "format_penalty"

    with pytest.raises(ValueError, match="already registered"):
        register_stage(Twice)


def test_an_objective_fills_only_what_the_user_did_not_write():
    """mars2+ sets estimator tree and a k3 KL of 1e-3; a key written at its default value keeps it."""
    cfg = load_config(None, ["algo.objective=mars2+"])
    assert (cfg.algo.estimator, cfg.loss.kl_coef, cfg.loss.level) == ("tree", 1e-3, "sequence")
    cfg = load_config(None, ["algo.objective=mars2+", "algo.estimator=drmas", "loss.kl_coef=0.0"])
    assert (cfg.algo.estimator, cfg.loss.kl_coef, cfg.loss.level) == ("drmas", 0.0, "sequence")


def test_stage_rules_are_the_configs_rules():
    from teamrl.config.tools import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, ["algo.estimator=at_grpo", "algo.dynamic_sampling_refill=2"])
    text = str(err.value)
    assert "at_grpo groups the candidates of a tree-sampling workflow" in text
    assert "algo.dynamic_sampling_refill 2 must be >= 0 and needs algo.dynamic_sampling: true" in text


def test_smoke_and_study_branch_on_no_task_name():
    """Each task says its own --smoke overrides and whether it reads --benchmarks files (TaskSpec)."""
    from teamrl.tasks.base import task_configs

    tasks = set(task_configs())
    found = []
    for path in [PKG / "smoke.py", *_files("study")]:
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare):
                consts = [c.value for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                found += [f"{path.relative_to(ROOT)}:{n.lineno} compares with {c!r}" for c in consts if c in tasks]
            if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "build_task" \
                    and n.args and isinstance(n.args[0], ast.Constant):
                found.append(f"{path.relative_to(ROOT)}:{n.lineno} builds {n.args[0].value!r}")
        found += [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in _names_and_strings(tree)
                  if name.startswith("teamrl.domains")]
    assert found == []


def test_the_benchmark_reader_is_the_task_that_says_so(tmp_path):
    import json

    from teamrl.tasks.base import benchmark_task

    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"problem": "What is 2+3?", "answer": "5"}) + "\n")
    (problem,) = benchmark_task(str(path)).problems("test")
    assert problem.answer == "5"
