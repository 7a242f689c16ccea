"""Soak: a long training run's resources stay flat after a warm-up (memory, files, threads, child processes, disk).

Each team trains ``--steps`` steps in a fresh subprocess, saving a checkpoint every step (``train.keep_checkpoints:
1`` prunes the older ones), and samples its resources after each step's metrics are written
(:mod:`teamrl.metrics.soak`): resident memory, open file descriptors, threads, child processes (recursively)
and zombies among them, the run folder's size and its checkpoints' size, the step's wall time.

* ``math``: the math team (solver + verifier on arithmetic) with the default config's settings, batches of
  2 problems x 2 episodes, 8 new tokens per reply: the same run as ``tests/train/test_soak.py``.
* ``code``: ``configs/code_team.yaml`` (AT-GRPO's coder + tester on the procedural ``pyfunc`` task, two turns)
  with the same small sizes. Every program runs in the sandbox (bubblewrap, a reaper process per run), whose
  processes must all be gone between steps. ``--model tiny`` gives this team a tiny model wired to answer every
  prompt with a one-line program (:func:`program_model`), so each step runs programs; a random model writes no
  code block and would never start the sandbox. The table counts the sandbox's runs.

``--model tiny`` (default): 2-layer random Llamas over SmolLM2's tokenizer, as the tests use (a step takes about a
second on a CPU). ``--model default``: the embedded SmolLM2-135M-Instruct (replies of 8 tokens, code 48).

    python benchmarks/soak.py --team both --steps 500 --out docs/results/soak
    python benchmarks/soak.py --team code --steps 80 --out /tmp/soak --set models.main.rollout_dtype=same
    python benchmarks/soak.py --replot --out docs/results/soak --also "code, f32=/tmp/soak/soak-code.jsonl"

``--set`` overrides every team's config; ``--replot`` redraws the table and plot from ``--out``'s samples without
training, and ``--also LABEL=JSONL`` adds another run's samples to both. Figures: docs/results/soak.md.

Writes ``soak-<team>.jsonl`` (one sample per step) and ``soak.png`` (one panel per resource, step on x, the warm-up
shaded) under ``--out``, prints a table per team and one line per team::

    RESULT name=soak team=... steps=... warmup=... rss_growth_mib=... rss_slope_mib_per_100=... fds_growth=...
    threads_growth=... children_growth=... zombies_growth=... checkpoints_ratio=... records_kib_per_step=...
    step_s=... sandbox_runs=... flat=1

and exits 1 when a team broke a bound of :class:`teamrl.metrics.soak.Bounds` (``--warmup`` sets its warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from teamrl.metrics.soak import MIB, Bounds, Sample, growth, problems

REPO = Path(__file__).resolve().parents[1]
TEAMS = ("math", "code")
COLORS = {"math": "tab:blue", "code": "tab:orange"}
WIDTHS = {"math": 3.0, "code": 1.8}  # a line stays visible under a later run's where they agree (others: 1.0)


def tiny_model(tokenizer, *, tie: bool = True, seed: int = 0):
    """tests/conftest.py's tiny model: a randomly initialised 2-layer Llama over the tokenizer's vocabulary."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.conftest import make_tiny_model

    return make_tiny_model(tokenizer, seed=seed, tie=tie)


def program_model(tokenizer, seed: int = 0, scale: float = 4.0):
    """A tiny model that answers every chat prompt with ```` ```python\\n\\nprint(D) ```` (D a digit at random), then
    ends its turn: an unclosed block, which the code tasks read as the program ``print(D)``.

    The wiring: every layer's output projections are zero, so the last hidden state is the normalised embedding of
    the current token alone, and the model is a bigram table. The tokens of the reply (and the last token of the
    chat template's generation prompt) get orthonormal embeddings; the (untied) output row of each token of the
    reply holds ``scale`` x the embedding of the token before it, a logit of ``scale * sqrt(hidden)`` (32) against
    about 0 for the rest of the vocabulary. Every reply token is a distinct token, so the chain is unambiguous.
    Training moves the weights little at the configs' learning rates; the replies stay programs.
    """
    import torch

    model = tiny_model(tokenizer, tie=False, seed=seed)

    def one(text: str) -> int:
        [token] = tokenizer.encode(text, add_special_tokens=False)
        return int(token)

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    chain = [int(prompt[-1]), one("```"), one("python"), one("\n\n"), one("print"), one("(")]
    digits, close, end = [one(str(d)) for d in range(10)], one(")"), int(tokenizer.eos_token_id)
    nxt = {a: [b] for a, b in zip(chain, chain[1:])} | {chain[-1]: digits} | {d: [close] for d in digits} \
        | {close: [end]}
    nodes = sorted(set(nxt))
    if len(nodes) != len(chain) + len(digits) + 1:
        raise ValueError("the reply's tokens are not all distinct under this tokenizer")
    width = model.config.hidden_size
    basis = torch.linalg.qr(torch.randn(width, len(nodes)))[0].T  # orthonormal rows
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.get_input_embeddings().weight, model.lm_head.weight
        for i, token in enumerate(nodes):
            emb[token] = basis[i]
        for b in {b for bs in nxt.values() for b in bs}:
            head[b] = 0.0
        for i, a in enumerate(nodes):
            for b in nxt[a]:
                head[b] += scale * basis[i]
    return model


def save_models(tokenizer, out: Path) -> dict[str, str]:
    """The tiny models of ``--model tiny`` saved under ``out``: team -> path."""
    paths = {}
    for team, model in (("math", tiny_model(tokenizer)), ("code", program_model(tokenizer))):
        model.save_pretrained(out / team)
        tokenizer.save_pretrained(out / team)
        paths[team] = str(out / team)
    return paths


def config_for(team: str, run_dir: Path, model_path: str, steps: int, extra: Sequence[str] = ()):
    """The soak config of ``team``: small batches, a checkpoint every step (one kept), no evaluation, no loggers;
    ``extra`` overrides come last."""
    from teamrl.config.schema import load_config

    common = [f"run_dir={run_dir}", f"models.main.path={model_path}", f"train.steps={steps}", "train.save_every=1",
              "train.keep_checkpoints=1", "rollout.batch_size=2", "rollout.group_size=2", "eval.before=false",
              "eval.after=false", "train.loggers=[]"]
    if team == "math":
        return load_config(None, [*common, "agents.solver.max_new_tokens=8", "agents.verifier.max_new_tokens=8",
                                  *extra])
    tokens = 16 if model_path != "default" else 48  # the wired reply is 8 tokens
    return load_config(REPO / "configs" / "code_team.yaml",
                       [*common, f"agents.coder.max_new_tokens={tokens}", f"agents.tester.max_new_tokens={tokens}",
                        *extra])


@contextlib.contextmanager
def counting_sandbox_runs() -> Iterator[Callable[[], dict[str, float]]]:
    """Count the sandbox's program runs while the block runs; yields a function giving ``{"sandbox_runs": n}``."""
    from teamrl.sandbox import Sandbox

    original, lock, runs = Sandbox.run, threading.Lock(), [0]

    def run(self, *args, **kwargs):
        with lock:
            runs[0] += 1
        return original(self, *args, **kwargs)

    Sandbox.run = run  # type: ignore[method-assign]
    try:
        yield lambda: {"sandbox_runs": float(runs[0])}
    finally:
        Sandbox.run = original  # type: ignore[method-assign]


def soak(team: str, run_dir: Path, model_path: str, steps: int, extra: Sequence[str] = ()) -> list[Sample]:
    """Train ``team`` for ``steps`` steps in this process; one sample per step (and the sandbox's runs so far)."""
    from teamrl.metrics.soak import watch
    from teamrl.train.trainer import Trainer

    trainer = Trainer(config_for(team, run_dir, model_path, steps, extra), progress=False)
    with counting_sandbox_runs() as runs:
        samples = watch(trainer, run_dir, extra=runs)
        trainer.train()
    return samples


def child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix=f"soak-{args.child}-") as tmp:
        samples = soak(args.child, Path(tmp) / "run", args.model_path, args.steps, args.set)
    Path(args.samples).write_text("".join(json.dumps({"team": args.child, **s}) + "\n" for s in samples))


def read_samples(path: Path) -> list[Sample]:
    return [{k: v for k, v in json.loads(line).items() if k != "team"} for line in path.read_text().splitlines()]


def rolling_median(values: list[float], width: int = 21) -> list[float]:
    """The median of each value's window of ``width`` values around it (fewer at the ends).

    >>> rolling_median([1.0, 9.0, 1.0, 1.0, 1.0], width=3)
    [5.0, 1.0, 1.0, 1.0, 1.0]
    """
    half = width // 2
    return [statistics.median(values[max(0, i - half): i + half + 1]) for i in range(len(values))]


def plot(runs: dict[str, list[Sample]], warmup: int, path: Path, title: str = "") -> None:
    """One panel per resource, the step on x, a line per run, the warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("resident memory (MiB)", [("rss", "-")], MIB), ("open file descriptors", [("fds", "-")], 1),
              ("threads", [("threads", "-")], 1),
              ("child processes between steps (dotted: zombies)", [("children", "-"), ("zombies", ":")], 1),
              ("run folder (MiB; dashed: its checkpoints)", [("run_dir", "-"), ("checkpoints", "--")], MIB),
              ("step wall time (s; faint: each, line: median of 21)", [("seconds", "-")], 1)]
    cycle = iter(["tab:green", "tab:red", "tab:purple", "tab:brown"])
    colors = {name: COLORS.get(name) or next(cycle) for name in runs}
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), sharex=True)
    for ax, (name, lines, unit) in zip(axes.flat, panels):
        ax.axvspan(1, warmup + 1, color="0.85", lw=0, label="warm-up" if ax is axes.flat[0] else None)
        for run, samples in runs.items():
            steps = [s["step"] + 1 for s in samples]  # steps done
            width = WIDTHS.get(run, 1.0)
            for key, style in lines:
                ys = [s[key] / unit for s in samples]
                if key == "seconds":
                    ax.plot(steps, ys, style, color=colors[run], lw=0.6, alpha=0.25)
                    ys = rolling_median(ys)
                ax.plot(steps, ys, style, color=colors[run], lw=width,
                        label=run if key == lines[0][0] and ax is axes.flat[0] else None)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0), max(hi, 1))
    for ax in axes[-1]:
        ax.set_xlabel("step")
    axes.flat[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"soak: resources after each training step (shaded: warm-up){title}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(team: str, samples: list[Sample], bounds: Bounds) -> tuple[list[str], bool]:
    """The team's table lines and RESULT line; whether the run is flat."""
    g, found = growth(samples, bounds.warmup), problems(samples, bounds)
    warm, last = samples[bounds.warmup], samples[-1]
    rows = [("resident memory (MiB)", warm["rss"] / MIB, last["rss"] / MIB, f"{g['rss_mib']:+.1f}",
             f"< {bounds.rss_mib:g}")]
    rows += [(key, warm[key], last[key], f"{g[key]:+.0f} (max)", "<= 0")
             for key in ("fds", "threads", "children", "zombies")]
    rows += [("checkpoints (MiB)", warm["checkpoints"] / MIB, last["checkpoints"] / MIB,
              f"x{g['checkpoints_ratio']:.3f} (max)", f"<= x{bounds.checkpoints_ratio:g}"),
             ("records (MiB)", (warm["run_dir"] - warm["checkpoints"]) / MIB,
              (last["run_dir"] - last["checkpoints"]) / MIB, f"{g['records_kib_per_step']:.1f} KiB/step",
              f"< {bounds.records_kib_per_step:g} KiB/step")]
    later = samples[bounds.warmup + 1:]
    step_s = statistics.median(s["seconds"] for s in later)
    runs = last.get("sandbox_runs", 0.0)
    lines = [f"--- {team}: {len(samples)} steps, warm-up {bounds.warmup}, median step {step_s:.2f} s, "
             f"{runs:.0f} sandbox runs, resident memory slope {g['rss_slope_mib']:+.2f} MiB per 100 steps",
             f"{'resource':24s} {'after warm-up':>14s} {'last step':>12s} {'growth':>20s} {'bound':>18s}"]
    lines += [f"{name:24s} {a:14.1f} {b:12.1f} {d:>20s} {bound:>18s}" for name, a, b, d, bound in rows]
    lines += [f"NOT FLAT: {p}" for p in found]
    lines.append(f"RESULT name=soak team={team.replace(' ', '_')} steps={len(samples)} warmup={bounds.warmup} "
                 f"rss_growth_mib={g['rss_mib']:.1f} rss_slope_mib_per_100={g['rss_slope_mib']:.2f} "
                 + " ".join(f"{k}_growth={g[k]:.0f}" for k in ("fds", "threads", "children", "zombies"))
                 + f" checkpoints_ratio={g['checkpoints_ratio']:.3f} records_kib_per_step="
                   f"{g['records_kib_per_step']:.1f} step_s={step_s:.2f} sandbox_runs={runs:.0f} flat={int(not found)}")
    return lines, not found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--team", choices=[*TEAMS, "both"], default="both")
    ap.add_argument("--steps", type=int, default=300, help="training steps per team")
    ap.add_argument("--code-steps", type=int, help="the code team's steps (default: --steps)")
    ap.add_argument("--model", choices=["tiny", "default"], default="tiny")
    ap.add_argument("--warmup", type=int, default=Bounds.warmup, help="steps before the flat part (the bounds' index)")
    ap.add_argument("--out", type=Path, default=Path("soak-out"), help="folder of the samples and the plot")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every team's run (repeatable), e.g. models.main.train_autocast=none")
    ap.add_argument("--replot", action="store_true", help="no training: the table and plot from --out's samples")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=JSONL",
                    help="with the teams, the samples of another run (a soak-<team>.jsonl), checked and drawn as LABEL")
    ap.add_argument("--child", choices=TEAMS, help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--samples", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    bounds = Bounds(warmup=args.warmup)
    teams = TEAMS if args.team == "both" else (args.team,)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.replot:
        with tempfile.TemporaryDirectory(prefix="soak-models-") as tmp:
            if args.model == "tiny":
                from transformers import AutoTokenizer

                from teamrl.models import resolve_model_path

                paths = save_models(AutoTokenizer.from_pretrained(resolve_model_path("default")), Path(tmp))
            else:
                paths = dict.fromkeys(TEAMS, "default")
            for team in teams:
                steps = args.code_steps if team == "code" and args.code_steps else args.steps
                start = time.perf_counter()
                subprocess.run([sys.executable, __file__, "--child", team, "--steps", str(steps), "--model-path",
                                paths[team], "--samples", str(args.out / f"soak-{team}.jsonl"),
                                *(f"--set={o}" for o in args.set)], check=True)
                print(f"{team}: {steps} steps in {time.perf_counter() - start:.0f} s", flush=True)
    runs = {team: read_samples(args.out / f"soak-{team}.jsonl") for team in teams
            if (args.out / f"soak-{team}.jsonl").is_file()}
    for also in args.also:
        label, _, path = also.partition("=")
        runs[label] = read_samples(Path(path))
    flat = True
    for team, samples in runs.items():
        lines, ok = report(team, samples, bounds)
        print("\n".join(lines))
        flat &= ok
    plot(runs, bounds.warmup, args.out / "soak.png", "".join(f"; {o}" for o in args.set))
    print(f"plot: {args.out / 'soak.png'}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
