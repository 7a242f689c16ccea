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
    ('agent_program', 'arith', '', ''): WorkPrior(decoded=1.0438, steps=1.0088, prefill=0.1975, trained=0.4029, host_s=0.0415, source='the first steps of agent_program'),
    ('code_pair', 'pyfunc', '', ''): WorkPrior(decoded=1.2223, steps=1.0362, prefill=0.2696, trained=0.8572, host_s=0.1282, source='the first steps of code_pair'),
    ('code_team', 'pyfunc', '', ''): WorkPrior(decoded=1.2801, steps=0.7771, prefill=0.6413, trained=0.9182, host_s=0.0779, source='the first steps of code_team'),
    ('code_tree', 'pyfunc', '', ''): WorkPrior(decoded=0.8036, steps=0.5181, prefill=0.6124, trained=0.8517, host_s=0.0954, source='the first steps of code_tree'),
    ('env_single', 'openenv', 'examples.hubs.openenv_guess:GuessEnvironment', ''): WorkPrior(decoded=1.0603, steps=0.9649, prefill=0.0224, trained=0.1981, host_s=0.0123, source='the first steps of openenv_guess'),
    ('env_single', 'openenv', 'examples.hubs.openenv_tools:AddEnvironment', ''): WorkPrior(decoded=1.1207, steps=1.0362, prefill=0.5707, trained=0.0575, host_s=0.033, source='the first steps of openenv_tools'),
    ('env_single', 'plan_path', '', ''): WorkPrior(decoded=1.0017, steps=1.0197, prefill=0.4016, trained=0.7381, host_s=0.003, source='the first steps of plan_path_single'),
    ('env_single', 'sokoban', '', ''): WorkPrior(decoded=1.2201, steps=1.0197, prefill=0.2655, trained=0.7138, host_s=0.0032, source='the first steps of sokoban_single'),
    ('env_single', 'sudoku', '', ''): WorkPrior(decoded=1.2721, steps=1.0197, prefill=0.4674, trained=0.0, host_s=0.0026, source='the first steps of sudoku_single'),
    ('env_team_tree', 'plan_path', '', ''): WorkPrior(decoded=1.1875, steps=0.259, prefill=1.3056, trained=0.6379, host_s=0.3624, source='the first steps of plan_path_at_grpo, plan_path_at_grpo_separate'),
    ('env_team_tree', 'sokoban', '', ''): WorkPrior(decoded=1.3115, steps=0.259, prefill=1.3346, trained=0.2793, host_s=0.4079, source='the first steps of sokoban_at_grpo'),
    ('env_team_tree', 'sudoku', '', ''): WorkPrior(decoded=1.3125, steps=0.259, prefill=1.6982, trained=0.0, host_s=0.3814, source='the first steps of sudoku_at_grpo'),
    ('game_selfplay', 'textarena_two_player', 'TicTacToe-v0', ''): WorkPrior(decoded=0.0792, steps=0.2368, prefill=0.0928, trained=0.1324, host_s=0.0026, source='the first steps of tictactoe_selfplay'),
    ('math_team', 'arith', '', ''): WorkPrior(decoded=0.5803, steps=1.0088, prefill=0.2263, trained=0.4374, host_s=0.0011, source='the first steps of math_team_hetero, math_team_separate, math_team_sharp, quickstart'),
    ('math_team', 'arith', '', 'lora'): WorkPrior(decoded=0.6109, steps=1.0526, prefill=0.4904, trained=0.4126, host_s=0.0047, source='the first steps of math_team_lora'),
    ('math_team', 'arith', '', 'prefix_tree 2x4'): WorkPrior(decoded=0.4817, steps=1.8421, prefill=0.2304, trained=0.0961, host_s=0.0023, source='the first steps of math_team_c3'),
    ('math_team', 'reasoning_gym', 'ransom_note', ''): WorkPrior(decoded=0.4813, steps=0.8882, prefill=0.1929, trained=0.3288, host_s=0.0012, source='the first steps of reasoning_gym_team'),
    ('math_tree', 'arith', '', ''): WorkPrior(decoded=0.6559, steps=0.9745, prefill=0.4947, trained=0.9371, host_s=0.0101, source='the first steps of math_team_mars2'),
    ('search_team', 'search', '', ''): WorkPrior(decoded=0.432, steps=0.6908, prefill=0.2145, trained=0.2809, host_s=0.0062, source='the first steps of search_quickstart'),
    ('single', 'pyfunc', '', ''): WorkPrior(decoded=1.1156, steps=1.0362, prefill=0.0614, trained=0.7771, host_s=0.0482, source='the first steps of code_single'),
    ('single', 'reasoning_gym', 'ransom_note', ''): WorkPrior(decoded=0.4603, steps=0.5921, prefill=0.0605, trained=0.5633, host_s=0.0006, source='the first steps of reasoning_gym_single'),
    ('verifiers', 'verifiers', 'examples.hubs.vf_arith', ''): WorkPrior(decoded=1.171, steps=1.0088, prefill=0.032, trained=0.364, host_s=0.0283, source='the first steps of verifiers_arith'),
    ('verifiers', 'verifiers', 'examples.hubs.vf_two_seat', ''): WorkPrior(decoded=1.1846, steps=0.9942, prefill=0.2091, trained=0.7087, host_s=0.0286, source='the first steps of verifiers_two_seat'),
    ('verifiers_v1', 'verifiers_v1', 'examples.hubs.vf1_sum', ''): WorkPrior(decoded=1.2201, steps=2.2697, prefill=0.0431, trained=0.1858, host_s=1.0747, source='the first steps of verifiers_v1_sum'),
    ('verifiers_v1', 'verifiers_v1', 'examples.hubs.vf1_two_seat', ''): WorkPrior(decoded=1.1354, steps=2.0175, prefill=0.2733, trained=0.6997, host_s=1.3838, source='the first steps of verifiers_v1_two_seat'),
}
"""Per :func:`key`: the median over the shipped configs of that key of their first two training steps (each count's
mean) against their plans, the embedded model, one thread of an AMD EPYC (family 25 model 17), 2026-12-04. Filled by
``python benchmarks/time_vs_measured.py --priors FILE`` from the runs of docs/time.md's table (host seconds at one
thread), whose steps 3-4 the plan is then held against."""


def key(cfg: Config) -> tuple[str, str, str, str]:
    """(workflow, task, the environment or dataset the task reads: its ``env_id``, ``taskset`` or ``dataset``, else "", the
    rollout's shape: ``prefix_tree 2x4`` for a prefix tree, ``lora`` for agents on LoRA adapters, both space-joined,
    else "") of ``cfg``, the key of :data:`PRIORS` (a prefix tree replays its shared calls instead of generating them
    again, and C3's tree trains fewer rows than Dr. MAS's groups; adapters decode apart, each call's prompts prefilled
    again).

    >>> from teamrl.config.schema import load_config
    >>> key(load_config(None, ["workflow.name=single", "task.name=arith"]))
    ('single', 'arith', '', '')
    """
    section = getattr(cfg.task, cfg.task.name, None)
    which = (getattr(section, "env_id", None) or getattr(section, "taskset", None) or getattr(section, "dataset", None)
             or "")
    tree = cfg.rollout.prefix_tree
    shape = ["prefix_tree " + "x".join(map(str, tree))] if tree else []
    if any(cfg.models[a.model].lora.rank for a in cfg.agents.values()):
        shape.append("lora")
    return cfg.workflow.name, cfg.task.name, str(which), " ".join(shape)


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
