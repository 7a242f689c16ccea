"""Endpoint throughput: the example program over HTTP vs the same team as a teamrl workflow.

Every case runs the planner -> solver team of ``examples/agent_programs/openai_team.py`` (same
model, same prompts, same sampling: T=0.7, at most 32 and 16 new tokens) on the same ``--episodes``
arith test problems, on one fresh ``HFEngine`` (seed 0) over one loaded SmolLM2-135M-Instruct:

* ``workflow``   -- the two calls as ``team.ask`` in a teamrl workflow, lockstep scheduler;
* ``endpoint``   -- the unchanged program (official ``openai`` client) through the OpenAI-compatible
  endpoint, lockstep scheduler with a ``--window`` ms flush window;
* ``endpoint-nowindow`` -- the same with no flush window (generate whatever is pending at once);
* ``endpoint-continuous`` / ``workflow-continuous`` -- the continuous scheduler (no window needed).

A short warm-up pass (2 episodes of each kind) runs first; then each case runs ``--repeats`` times,
interleaved, and its best pass counts. Prints generated tokens per second, wall time, calls per
episode per role, the team's score, failed episodes and the sizes of the lockstep batches the
engine got (none under the continuous scheduler) of each case, then::

    RESULT name=agent_program endpoint_vs_workflow=... continuous_vs_window=... (...)

``endpoint_vs_workflow``: endpoint / workflow tokens/s (both lockstep, the endpoint with its
window); ``continuous_vs_window``: endpoint-continuous / endpoint tokens/s (present when both ran).

    python benchmarks/agent_program.py --episodes 16 --window 50 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: examples/ is importable
from examples.agent_programs.openai_team import PLANNER, SOLVER  # noqa: E402
from teamrl.domains.math.arith import ArithConfig, ArithTask  # noqa: E402
from teamrl.engines.base import SamplingParams  # noqa: E402
from teamrl.engines.hf import HFEngine  # noqa: E402
from teamrl.models import load_model_and_tokenizer  # noqa: E402
from teamrl.serve.agent_program import AgentProgramConfig  # noqa: E402
from teamrl.team.agents import get_agent  # noqa: E402
from teamrl.team.team import AgentBinding, Dispatcher  # noqa: E402
from teamrl.team.workflows import WorkflowSpec, get_workflow  # noqa: E402
from teamrl.train.rollout import Rollout  # noqa: E402

CASES = {  # name -> (kind, scheduler, uses the window)
    "workflow": ("workflow", "lockstep", False),
    "endpoint": ("endpoint", "lockstep", True),
    "endpoint-nowindow": ("endpoint", "lockstep", False),
    "endpoint-continuous": ("endpoint", "continuous", False),
    "workflow-continuous": ("workflow", "continuous", False),
}


async def as_workflow(team, problem, task, cfg) -> str:
    """The example program's two calls as team.ask calls."""
    plan = await team.ask("planner", [{"role": "system", "content": PLANNER}, {"role": "user", "content": problem.question}])
    answer = await team.ask("calculator", [{"role": "system", "content": SOLVER},
                                           {"role": "user", "content": f"{problem.question}\nExpression: {plan.text}"}])
    return answer.text


def run(case: str, window_ms: float, engine, problems, task) -> tuple[float, int, list]:
    """One pass of ``case`` over ``problems``; returns seconds, generated tokens and the episodes."""
    kind, scheduler, windowed = CASES[case]
    cfg = AgentProgramConfig(program="examples.agent_programs.openai_team:solve",
                             flush_window_ms=window_ms if windowed else 0.0,
                             models={"planner": "planner", "solver": "calculator"}, timeout_s=3600)
    bindings = {"planner": AgentBinding(get_agent("planner"), "m", SamplingParams(0.7, max_new_tokens=32), ""),
                "calculator": AgentBinding(get_agent("calculator"), "m", SamplingParams(0.7, max_new_tokens=16), "")}
    wf = get_workflow("agent_program") if kind == "endpoint" else WorkflowSpec(as_workflow, object, ())
    rollout = Rollout(Dispatcher({"m": engine}, schedulers={"m": scheduler}), bindings, wf, cfg, task)
    batches = []
    generate = engine.generate
    engine.generate = lambda requests, **kw: batches.append(len(requests)) or generate(requests, **kw)
    t0 = time.perf_counter()
    try:
        eps = rollout.collect(problems, 1, progress=False)
    finally:
        del engine.generate
    dt = time.perf_counter() - t0
    for ep in eps:
        ep.info["lockstep_batches"] = batches  # the sizes of the engine's lockstep batches of the pass
    return dt, sum(len(s.response_ids) for ep in eps for s in ep.steps), eps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--window", type=float, default=50.0, help="flush_window_ms of the 'endpoint' case")
    ap.add_argument("--cases", default="workflow,endpoint,endpoint-continuous",
                    help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--repeats", type=int, default=1, help="passes per case (the best counts)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer("default")
    task = ArithTask(ArithConfig())
    problems = task.problems("test")[: args.episodes]
    for kind in ("workflow", "endpoint"):  # warm-up: imports, the server's start, first kernels
        run(kind, args.window, HFEngine(model, tok, seed=0), problems[:2], task)
    best: dict[str, tuple[float, int, list]] = {}
    for _ in range(args.repeats):
        for case in cases:
            dt, tokens, eps = run(case, args.window, HFEngine(model, tok, seed=0), problems, task)
            if case not in best or tokens / dt > best[case][1] / best[case][0]:
                best[case] = (dt, tokens, eps)
    rate = {case: tokens / dt for case, (dt, tokens, _) in best.items()}
    for case, (dt, tokens, eps) in best.items():
        calls = {a: sum(s.agent == a for ep in eps for s in ep.steps) / len(eps) for a in ("planner", "calculator")}
        print(f"{case:20s} {dt:7.2f} s  {tokens:5d} tokens  {rate[case]:7.1f} tokens/s  calls/episode {calls}  "
              f"score {sum(ep.reward for ep in eps) / len(eps):.3f}  failed {sum(ep.error is not None for ep in eps)}  "
              f"lockstep batches {eps[0].info['lockstep_batches'] or '-'}")
    ratios = []
    if "endpoint" in rate and "workflow" in rate:
        ratios.append(f"endpoint_vs_workflow={rate['endpoint'] / rate['workflow']:.3f}")
    if "endpoint" in rate and "endpoint-continuous" in rate:
        ratios.append(f"continuous_vs_window={rate['endpoint-continuous'] / rate['endpoint']:.3f}")
    print(f"RESULT name=agent_program {' '.join(ratios)} (episodes={args.episodes}, window={args.window:g} ms, "
          f"threads={args.threads}, repeats={args.repeats})")


if __name__ == "__main__":
    main()
