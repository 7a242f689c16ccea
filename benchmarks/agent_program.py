"""Endpoint throughput: the example program over HTTP vs the same team as a teamrl workflow.

Both run the planner -> solver team of ``examples/agent_programs/openai_team.py`` (same model,
same prompts, same sampling) on the same arith problems; the workflow calls ``team.ask``
directly, the program goes through the OpenAI-compatible endpoint. Prints the generated tokens
per second of each and ``RESULT endpoint/workflow throughput ratio``. ``--window`` sets the
endpoint's flush window (0: no waiting for programs), ``--scheduler`` the dispatcher's scheduler.

    python benchmarks/agent_program.py --episodes 16 --window 50
"""

from __future__ import annotations

import argparse
import time

import torch

from examples.agent_programs.openai_team import PLANNER, SOLVER
from teamrl.engines.base import SamplingParams
from teamrl.engines.hf import HFEngine
from teamrl.models import load_model_and_tokenizer
from teamrl.tasks.arith import ArithConfig, ArithTask
from teamrl.team.agent_program import AgentProgramConfig
from teamrl.team.agents import get_agent
from teamrl.team.team import AgentBinding, Dispatcher
from teamrl.team.workflows import WorkflowSpec, get_workflow
from teamrl.train.rollout import Rollout


async def as_workflow(team, problem, task, cfg) -> str:
    """The example program's two calls as team.ask calls."""
    plan = await team.ask("planner", [{"role": "system", "content": PLANNER}, {"role": "user", "content": problem.question}])
    answer = await team.ask("calculator", [{"role": "system", "content": SOLVER},
                                           {"role": "user", "content": f"{problem.question}\nExpression: {plan.text}"}])
    return answer.text


def run(kind: str, args, engine, problems, task) -> tuple[float, int, list]:
    cfg = AgentProgramConfig(program="examples.agent_programs.openai_team:solve", flush_window_ms=args.window,
                             models={"planner": "planner", "solver": "calculator"}, timeout_s=3600)
    bindings = {"planner": AgentBinding(get_agent("planner"), "m", SamplingParams(0.7, max_new_tokens=32), ""),
                "calculator": AgentBinding(get_agent("calculator"), "m", SamplingParams(0.7, max_new_tokens=16), "")}
    wf = get_workflow("agent_program") if kind == "endpoint" else WorkflowSpec(as_workflow, object, ())
    rollout = Rollout(Dispatcher({"m": engine}, schedulers={"m": args.scheduler}), bindings, wf, cfg, task)
    t0 = time.perf_counter()
    eps = rollout.collect(problems, 1, progress=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(s.response_ids) for ep in eps for s in ep.steps), eps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--window", type=float, default=50.0, help="flush_window_ms of the endpoint")
    ap.add_argument("--scheduler", default="lockstep", choices=["lockstep", "continuous"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer("default")
    task = ArithTask(ArithConfig())
    problems = task.problems("test")[: args.episodes]
    results = {}
    for kind in ("workflow", "endpoint", "workflow", "endpoint"):  # each twice: the first pass warms up
        engine = HFEngine(model, tok, seed=0)
        dt, tokens, eps = run(kind, args, engine, problems, task)
        results[kind] = (dt, tokens, eps)
    for kind, (dt, tokens, eps) in results.items():
        calls = {a: sum(s.agent == a for ep in eps for s in ep.steps) / len(eps) for a in ("planner", "calculator")}
        print(f"{kind:9s} {dt:7.2f} s  {tokens / dt:7.1f} tokens/s  calls/episode {calls}  "
              f"failed {sum(ep.error is not None for ep in eps)}")
    ratio = (results["endpoint"][1] / results["endpoint"][0]) / (results["workflow"][1] / results["workflow"][0])
    print(f"RESULT endpoint/workflow throughput ratio {ratio:.3f} (episodes={args.episodes}, window={args.window:g} ms, "
          f"scheduler={args.scheduler})")


if __name__ == "__main__":
    main()
