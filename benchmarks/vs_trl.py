"""One single-agent GRPO step: teamrl vs TRL's ``GRPOTrainer`` (needs ``pip install 'teamrl[trl]'``).

Both sides train the same SmolLM2-135M-Instruct (``default``) in the same dtype on the same
problems (teamrl's ``arith`` task, train split, in the order teamrl's sampler draws them), with
the solver's system prompt and answer format, group size 8, 8 prompts per step (64 completions),
at most 64 completion tokens, temperature 1.0, learning rate 2e-5, no KL term, and one optimizer
step per batch.

* teamrl: a ``Trainer`` with ``workflow.name=single``; one step is exactly the body of
  ``Trainer.train``: rollout through the Dispatcher and the ``hf`` engine, advantages, one
  ``Learner.update``, engine sync.
* TRL: ``GRPOTrainer`` with ``per_device_train_batch_size=8``, ``gradient_accumulation_steps=8``
  (64 completions generated at once, one optimizer step), ``num_generations=8``.

Alternation: TRL's training loop runs ``reps + 1`` steps; after each TRL step a callback runs one
teamrl step, so the two alternate in one process. The first step of each is the warm-up. A TRL
step's time is the interval between its step-end callbacks minus the teamrl step run in between.

    python benchmarks/vs_trl.py --reps 3

Last line: ``RESULT name=vs_trl ratio=...`` (median over repetitions of teamrl seconds / TRL
seconds per step; the target is <= 0.5).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="float32: what dtype: auto keeps for a trained model on any machine")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(f"needs TRL: pip install 'teamrl[trl]' ({exc})") from None

    from teamrl.config.schema import load_config
    from teamrl.domains.math.arith import last_integer
    from teamrl.models import load_model_and_tokenizer
    from teamrl.team.agents import get_agent
    from teamrl.train.trainer import ProblemSampler, Trainer

    tmp = tempfile.mkdtemp(prefix="vs_trl-")
    steps_total = args.reps + 1
    cfg = load_config(None, [
        f"run_dir={tmp}/teamrl", "task.name=arith", "workflow.name=single",
        f"models={{main: {{path: default, dtype: {args.dtype}, optim: {{lr: 2.0e-5}}}}}}",
        f"agents={{solver: {{model: main, temperature: 1.0, max_new_tokens: {args.max_tokens}}}}}",
        f"rollout.batch_size={args.batch}", f"rollout.group_size={args.group}", f"train.steps={steps_total}",
        "eval.before=false", "eval.after=false", f"train.threads={args.threads}", "algo.estimator=grpo",
    ])
    ours = Trainer(cfg, progress=False)
    torch.set_num_threads(args.threads)
    same = ProblemSampler(ours.task.problems("train"), cfg.train.seed)  # the order teamrl's sampler draws
    problems = [p for _ in range(steps_total + 1) for p in same.next(args.batch)]

    def teamrl_step() -> float:
        t0 = time.perf_counter()
        batch = ours.sampler.next(args.batch)
        episodes = ours.rollout.collect(batch, args.group, progress=False)
        steps = ours.scorer.rewards_and_advantages(episodes)
        for name, learner in ours.learners.items():
            learner.update([s for s in steps if s.model == name])
        for engine in ours.engines.values():
            engine.sync_weights()
        return time.perf_counter() - t0

    solver = get_agent("solver")
    rows = [{"prompt": [{"role": "system", "content": solver.system_prompt},
                        {"role": "user", "content": f"{p.question}\n{ours.task.answer_format}"}],
             "answer": p.answer} for p in problems]

    def reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if str(last_integer(t)) == a else 0.0 for t, a in zip(texts, answer)]

    model, tok = load_model_and_tokenizer("default", dtype=args.dtype)
    targs = GRPOConfig(
        output_dir=f"{tmp}/trl", per_device_train_batch_size=args.group, gradient_accumulation_steps=args.batch,
        num_generations=args.group, max_completion_length=args.max_tokens, max_steps=steps_total,
        learning_rate=2e-5, beta=0.0, temperature=1.0, use_cpu=True, bf16=args.dtype == "bfloat16",
        logging_steps=1, report_to="none", save_strategy="no", seed=0, shuffle_dataset=False,
        dataloader_num_workers=0,
    )
    times: dict[str, list[float]] = {"teamrl": [], "trl": []}

    class Alternate(TrainerCallback):
        last = None

        def on_train_begin(self, *a, **k):
            self.last = time.perf_counter()

        def on_step_end(self, *a, **k):
            times["trl"].append(time.perf_counter() - self.last)
            times["teamrl"].append(teamrl_step())
            print(f"step {len(times['trl'])}: TRL {times['trl'][-1]:.1f} s, teamrl {times['teamrl'][-1]:.1f} s",
                  flush=True)
            self.last = time.perf_counter()

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=targs, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Alternate()])
    torch.set_num_threads(args.threads)
    trainer.train()
    ours_t, trl_t = times["teamrl"][1:], times["trl"][1:]  # the first step of each is the warm-up
    ratios = [a / b for a, b in zip(ours_t, trl_t)]
    print(f"median s/step: teamrl {statistics.median(ours_t):.1f}, TRL {statistics.median(trl_t):.1f} "
          f"({args.reps} steps after a warm-up step, {args.dtype}, {args.threads} threads)")
    print(f"RESULT name=vs_trl teamrl_s={statistics.median(ours_t):.2f} trl_s={statistics.median(trl_t):.2f} "
          f"ratio={statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
