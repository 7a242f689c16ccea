"""What the time plan cannot know from a config alone, measured: how much of the work a config declares its runs do.

A config declares caps: ``max_new_tokens`` per agent, ``max_loops`` or ``max_turns`` calls per episode, every row of a
step trained. A run does less: replies end early, a verifier that accepts ends an episode after one loop, a game ends
when it is won, a group whose episodes all score alike trains nothing. A :class:`WorkPrior` holds, for one kind of
run, the measured work over the work the plan counts from the config's caps (:func:`teamrl.plan.timing.base_counts`):

* ``decoded``: tokens decoded (rollouts and evaluations);
* ``steps``: decode steps (the engine's forwards over its rows);
* ``prefill``: prompt tokens prefilled;
* ``trained``: tokens an update computes;
* ``host_s``: the seconds per episode a rollout spends outside the engine (rewards, sandboxed tests, environments,
  chat templates), on the CPU it was measured on.

Where it comes from, first found first:

1. ``--plan-from RUN`` (``teamrl train CONFIG --dry-run --plan-from RUN``): an earlier run's own steps
   (``RUN/metrics.jsonl``) against the plan of its own config (``RUN/config.yaml``), so a small run plans a larger
   one of the same team and task;
2. :data:`PRIORS`: per workflow, task, environment and prefix tree (:func:`key`), measured on the first training step
   of the shipped configs with the embedded model (``benchmarks/time_vs_measured.py``, docs/time.md);
3. none: every reply at :data:`teamrl.plan.timing.REPLY_SHARE` of its cap, every declared call made, every row
   trained (the plan's ceiling more than its forecast).

An evaluation is planned with its training rollout's prior (the same team on the same task's held-out problems), or
under another workflow (``eval.workflow``) with that workflow's shipped prior where there is one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teamrl.config.schema import Config

COUNTS = {"decoded": "perf/rollout/decoded_tokens", "steps": "perf/rollout/decode_steps",
          "prefill": "perf/rollout/prefill_tokens", "trained": "perf/update_tokens_computed"}
"""The metrics (a step's row of metrics.jsonl) each share of :class:`WorkPrior` is measured from."""


@dataclass(frozen=True)
class WorkPrior:
    """Measured work over the work the plan counts from the config's caps (module docstring)."""

    decoded: float = 1.0
    steps: float = 1.0
    prefill: float = 1.0
    trained: float = 1.0
    host_s: float = 0.0
    source: str = ""

    def describe(self) -> str:
        if not self.source:
            return ("work from the config's caps (no prior for this workflow and task: every reply at 0.75 of its "
                    "cap, every call made, every row trained; --plan-from RUN plans from a run of it)")
        return (f"work from {self.source}: decoded tokens x{self.decoded:.2f}, decode steps x{self.steps:.2f}, "
                f"prefill x{self.prefill:.2f}, update tokens x{self.trained:.2f}, host {self.host_s * 1e3:.0f} ms "
                f"per episode")


NONE = WorkPrior()

PRIORS: dict[tuple[str, str, str, str], WorkPrior] = {
    ('agent_program', 'arith', '', ''): WorkPrior(decoded=1.0447, steps=1.0088, prefill=0.1999, trained=0.6052, host_s=0.0475, source='the first step of agent_program'),
    ('code_pair', 'pyfunc', '', ''): WorkPrior(decoded=1.2314, steps=1.0362, prefill=0.2628, trained=0.7822, host_s=0.1795, source='the first step of code_pair'),
    ('code_team', 'pyfunc', '', ''): WorkPrior(decoded=1.2713, steps=0.5181, prefill=0.6877, trained=0.8598, host_s=0.0762, source='the first step of code_team'),
    ('code_tree', 'pyfunc', '', ''): WorkPrior(decoded=0.8585, steps=0.5181, prefill=0.6281, trained=0.8894, host_s=0.1378, source='the first step of code_tree'),
    ('env_single', 'openenv', 'examples.hubs.openenv_guess:GuessEnvironment', ''): WorkPrior(decoded=1.0295, steps=0.9649, prefill=0.0202, trained=0.1939, host_s=0.0022, source='the first step of openenv_guess'),
    ('env_single', 'openenv', 'examples.hubs.openenv_tools:AddEnvironment', ''): WorkPrior(decoded=1.1493, steps=1.0362, prefill=0.593, trained=0.0, host_s=0.0324, source='the first step of openenv_tools'),
    ('env_single', 'plan_path', '', ''): WorkPrior(decoded=0.8533, steps=1.0197, prefill=0.3715, trained=0.6768, host_s=0.0029, source='the first step of plan_path_single'),
    ('env_single', 'sokoban', '', ''): WorkPrior(decoded=1.2431, steps=1.0197, prefill=0.2373, trained=0.6907, host_s=0.0027, source='the first step of sokoban_single'),
    ('env_single', 'sudoku', '', ''): WorkPrior(decoded=1.2569, steps=1.0197, prefill=0.4606, trained=0.0, host_s=0.0029, source='the first step of sudoku_single'),
    ('env_team_tree', 'plan_path', '', ''): WorkPrior(decoded=1.0813, steps=0.259, prefill=1.1865, trained=0.6196, host_s=0.2366, source='the first step of plan_path_at_grpo, plan_path_at_grpo_separate'),
    ('env_team_tree', 'sokoban', '', ''): WorkPrior(decoded=1.3125, steps=0.259, prefill=1.3281, trained=0.1483, host_s=0.3049, source='the first step of sokoban_at_grpo'),
    ('env_team_tree', 'sudoku', '', ''): WorkPrior(decoded=1.3125, steps=0.259, prefill=1.6855, trained=0.0, host_s=0.312, source='the first step of sudoku_at_grpo'),
    ('game_selfplay', 'textarena_two_player', 'TicTacToe-v0', ''): WorkPrior(decoded=0.075, steps=0.2368, prefill=0.0568, trained=0.1134, host_s=0.0019, source='the first step of tictactoe_selfplay'),
    ('math_team', 'arith', '', ''): WorkPrior(decoded=0.5558, steps=1.0088, prefill=0.2222, trained=0.4363, host_s=0.001, source='the first step of math_team_hetero, math_team_lora, math_team_separate, math_team_sharp, quickstart'),
    ('math_team', 'arith', '', 'prefix_tree 2x4'): WorkPrior(decoded=0.4049, steps=2.0066, prefill=0.1762, trained=0.111, host_s=0.0019, source='the first step of math_team_c3'),
    ('math_team', 'reasoning_gym', 'ransom_note', ''): WorkPrior(decoded=0.5592, steps=0.9868, prefill=0.2587, trained=0.4204, host_s=0.0013, source='the first step of reasoning_gym_team'),
    ('math_tree', 'arith', '', ''): WorkPrior(decoded=0.6354, steps=0.9868, prefill=0.5366, trained=1.1211, host_s=0.0114, source='the first step of math_team_mars2'),
    ('search_team', 'search', '', ''): WorkPrior(decoded=0.5046, steps=0.6908, prefill=0.1222, trained=0.2087, host_s=0.1057, source='the first step of search_quickstart'),
    ('single', 'pyfunc', '', ''): WorkPrior(decoded=1.14, steps=1.0362, prefill=0.0595, trained=0.8351, host_s=0.0477, source='the first step of code_single'),
    ('single', 'reasoning_gym', 'ransom_note', ''): WorkPrior(decoded=0.6562, steps=0.9868, prefill=0.0541, trained=0.7414, host_s=0.0005, source='the first step of reasoning_gym_single'),
    ('verifiers', 'verifiers', 'examples.hubs.vf_arith', ''): WorkPrior(decoded=1.2431, steps=1.0088, prefill=0.0278, trained=0.0, host_s=0.0228, source='the first step of verifiers_arith'),
    ('verifiers', 'verifiers', 'examples.hubs.vf_two_seat', ''): WorkPrior(decoded=1.2014, steps=0.9942, prefill=0.207, trained=0.7055, host_s=0.0266, source='the first step of verifiers_two_seat'),
}
"""Per :func:`key`: the median over the shipped configs of that key of their first training step against their
plans, the embedded model, one thread of an AMD EPYC (family 25 model 17), 2026-12-04. Filled by ``python
benchmarks/time_vs_measured.py --priors FILE`` from the runs of docs/time.md's table (host seconds at one thread)."""


def key(cfg: Config) -> tuple[str, str, str, str]:
    """(workflow, task, the environment or dataset the task reads: its ``env_id`` or ``dataset``, else "", the
    rollout's prefix tree: ``prefix_tree 2x4``, else "") of ``cfg``, the key of :data:`PRIORS` (a prefix tree replays
    its shared calls instead of generating them again, and C3's tree trains fewer rows than Dr. MAS's groups).

    >>> from teamrl.config.schema import load_config
    >>> key(load_config(None, ["workflow.name=single", "task.name=arith"]))
    ('single', 'arith', '', '')
    """
    section = getattr(cfg.task, cfg.task.name, None)
    which = getattr(section, "env_id", None) or getattr(section, "dataset", None) or ""
    tree = cfg.rollout.prefix_tree
    return cfg.workflow.name, cfg.task.name, str(which), "prefix_tree " + "x".join(map(str, tree)) if tree else ""


def prior_for(cfg: Config, workflow: str | None = None) -> WorkPrior:
    """The shipped prior of ``cfg`` (of ``workflow`` in its place, an evaluation's): the one of its :func:`key`, else
    the median of those of its workflow, task and environment with another rollout shape, else :data:`NONE`."""
    k = key(cfg)
    if workflow:
        k = (workflow, *k[1:])
    if k in PRIORS:
        return PRIORS[k]
    same = [p for kk, p in sorted(PRIORS.items()) if kk[:3] == k[:3]]
    return combine(same, f"the {k[0]} / {k[1]} prior of other rollout shapes") if same else NONE


def combine(priors: list[WorkPrior], source: str) -> WorkPrior:
    """The median of each share of ``priors``."""
    def med(name: str) -> float:
        return round(statistics.median(getattr(p, name) for p in priors), 4)

    return replace(NONE, **{n: med(n) for n in (*COUNTS, "host_s")}, source=source)
