"""Command line: ``teamrl train``, ``eval``, ``ablate``, ``probe``, ``report``, ``export``, ``configs``, ``serve-retriever``, ``build-corpus``."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

from teamrl._cli import (  # noqa: F401  (_TCMALLOC, allocator_of, format_results: importable from here, as before)
    _TCMALLOC,
    _add_allocator,
    _reexec_with_tcmalloc,
    _version,
    allocator_of,
    flag_hint,
    format_results,
    format_time,
    next_steps,
    remove_new_run_dir,
    run_prior,
)
from teamrl.config import files as configfiles
from teamrl.config import tools as configtools


def _import_file(path: str) -> None:
    """Import a user's Python file so its agents, workflows and tasks register themselves."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--import {path}: no such file")
    spec = importlib.util.spec_from_file_location(p.stem, p)
    if spec is None or spec.loader is None:
        raise ImportError(f"--import {path}: not a Python file Python can import (name it *.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[p.stem] = module
    spec.loader.exec_module(module)


def _train(args: argparse.Namespace) -> int:
    from teamrl.config.schema import help_config, load_config

    if args.help_config:
        for f in args.imports:  # their tasks and workflows are listed with their options
            _import_file(f)
        print(help_config())
        return 0
    if args.plan_from and not args.dry_run:
        raise ValueError("--plan-from RUN times a config's --dry-run with an earlier run's work; add --dry-run")
    config, overrides = _config_and_overrides(args)
    if args.smoke:  # the one-step CPU variant; the user's own overrides still win
        from teamrl.smoke import smoke_overrides

        overrides = [*smoke_overrides(load_config(config, overrides)), *overrides]
    cfg = load_config(config, overrides)
    from teamrl.train import preflight

    if not args.dry_run:  # every check the run makes before it loads weights, all in one report
        preflight.check(cfg, resume=args.resume, overwrite=args.overwrite, allow_change=_allowed(args))
    if cfg.train.steps == 0:
        print("train.steps is 0: the team is evaluated (eval.before / eval.after), nothing is trained")
    if args.dry_run:
        import yaml

        from teamrl.metrics.sinks import require

        require(cfg.train.loggers)
        planned = cfg
        if cfg.backend == "local":  # a device this machine does not have (cuda:7) fails here, as in training
            from teamrl.hardware import resolve_config

            planned = resolve_config(cfg)  # the precision training takes here (no auto left to plan)
        from teamrl.plan.report import format_plan, plans_gpu

        print(yaml.safe_dump(configtools.to_dict(cfg), sort_keys=False) + format_plan(planned, on_gpu=plans_gpu(planned)))
        from teamrl.plan.timing import dry_run_plan
        from teamrl.plan.training import format_training

        prior = run_prior(args.plan_from) if args.plan_from else None
        print(format_training(planned), dry_run_plan(planned, args.plan_gpu, prior), sep="\n")
        # the run's own checks last, so the plans above are there to read when one of them fails
        preflight.check(cfg, resume=args.resume, overwrite=args.overwrite, allow_change=_allowed(args))
        print(preflight.summary(cfg, resume=args.resume, overwrite=args.overwrite))
        print(f"config ok: {len(cfg.models)} model(s), agents {', '.join(cfg.agents)}, workflow "
              f"{cfg.workflow.name}, task {cfg.task.name}; nothing loaded (--dry-run)")
        return 0
    from teamrl.train.trainer import Trainer

    existed = Path(cfg.run_dir).exists()
    try:
        trainer = Trainer(cfg, resume=args.resume, overwrite=args.overwrite, allow_change=_allowed(args))
        results = trainer.train()
    except _USER_ERRORS:
        remove_new_run_dir(Path(cfg.run_dir), existed)
        raise
    print(format_results(results, cfg))
    print("\n".join(filter(None, [format_time(cfg.run_dir), next_steps(cfg.run_dir)])))
    return 0


def _allowed(args: argparse.Namespace) -> list[str]:
    """The keys of ``--allow-change`` (repeatable, or comma-separated)."""
    return [k.strip() for item in args.allow_change for k in item.split(",") if k.strip()]


def _config_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    for f in args.imports:
        _import_file(f)
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not Path(config).exists():  # no file, only overrides
        config, overrides = None, [config, *overrides]
    if config is not None:
        config = configfiles.resolve(config)  # a file, or the name of a built-in config
    return config, overrides


def _eval(args: argparse.Namespace) -> int:
    from teamrl.config.schema import load_config
    from teamrl.study.evaluate import beside_run, format_eval, parse_benchmarks, run_config, run_eval

    if args.checkpoint is None and not args.untrained:
        raise ValueError("teamrl eval needs --checkpoint PATH (a run directory or checkpoints/step_N) or --untrained")
    config, overrides = _config_and_overrides(args)
    run = run_config(args.checkpoint) if args.checkpoint is not None else None
    if config is None and run is not None:  # the run's own team, models and sampling, overrides on top
        config = str(run)
        print(f"config: {run} (the run's own){'; overrides: ' + ' '.join(overrides) if overrides else ''}")
    samples = args.samples or args.k
    # no tracker runs for an evaluation: its results go to eval.json
    cfg = load_config(config, [*overrides, f"run_dir={args.out}", f"eval.samples={samples}", "train.loggers=[]"])
    existed = Path(args.out).exists()
    try:
        results = run_eval(cfg, checkpoint=args.checkpoint, benchmarks=parse_benchmarks(args.benchmarks), k=args.k)
    except _USER_ERRORS:
        remove_new_run_dir(Path(args.out), existed)
        raise
    print(format_eval(results))
    if run is not None:
        print(beside_run(cfg, run))
    print(f"written to {Path(args.out) / 'eval.json'}")
    return 0


def _ablate(args: argparse.Namespace) -> int:
    from teamrl.study.ablate import CellsFailed, ablate, parse_presets, parse_seeds
    from teamrl.study.evaluate import parse_benchmarks

    config, overrides = _config_and_overrides(args)
    out = args.out or f"runs/ablate_{Path(config).stem if config else 'default'}"
    if not args.benchmarks and (args.k is not None or args.samples is not None):
        raise ValueError("--k and --samples set the evaluation of --benchmarks; add --benchmarks NAME=PATH or drop them")
    try:
        report = ablate(config, parse_presets(args.presets), parse_seeds(args.seeds), overrides, out, jobs=args.jobs,
                        imports=args.imports, baseline=args.baseline or "grpo", require_baseline=bool(args.baseline),
                        benchmarks=parse_benchmarks(args.benchmarks), k=args.k or 4, samples=args.samples,
                        allocator=args.allocator)
    except CellsFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"report: {report}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from teamrl.study.ablate import parse_presets, parse_seeds
    from teamrl.study.probe import ProbeSpec, run_probe
    from teamrl.study.probe_report import write_probe_report

    if args.report_only:
        print(f"report: {write_probe_report(args.out)}")
        return 0
    config, overrides = _config_and_overrides(args)
    spec = ProbeSpec(presets=parse_presets(args.presets), batches=args.batches, seeds=parse_seeds(args.seeds),
                     checkpoint=args.checkpoint, sweep=args.sweep, shifts=_floats(args.shifts, "--shifts"),
                     scales=_floats(args.scales, "--scales"), sweep_presets=parse_presets(args.sweep_presets),
                     cosines=not args.no_cosines)
    print(f"report: {run_probe(config, overrides, spec, args.out)}")
    return 0


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: give comma-separated numbers such as 0,0.5,1") from None


def _report(args: argparse.Namespace) -> int:
    from teamrl.study.report import write_report

    report = write_report(args.runs, args.out, baseline=args.baseline or "grpo", require_baseline=bool(args.baseline))
    print(f"report: {report}")
    return 0


def _configs(args: argparse.Namespace) -> int:
    if args.action == "copy":
        print(f"copied to {configfiles.copy(args.name, args.dest)}")
        return 0
    names = configfiles.builtin_names()
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {configfiles.describe(name)}")
    print(f"\n(in {configfiles.builtin_dir()}; run one with `teamrl train NAME`, edit a copy from "
          f"`teamrl configs copy NAME`)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from teamrl.export import export_run

    for ex in export_run(args.run_dir, args.out, step=args.step, merge_lora=args.merge_lora):
        print(f"{ex.kind:<8} {ex.path}  agents: {', '.join(ex.agents) or '-'}")
    return 0


def _serve_retriever(args: argparse.Namespace) -> int:
    from teamrl.domains.search.server import serve

    serve(args.corpus, host=args.host, port=args.port, topk=args.topk, index_dir=args.index_dir)
    return 0


def _build_corpus(args: argparse.Namespace) -> int:
    from teamrl.domains.search.corpus import build_corpus

    n = build_corpus(args.hotpot, args.out)
    print(f"wrote {n} passages to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] in (["train"], ["ablate"], ["eval"], ["probe"]):
        _reexec_with_tcmalloc()
    parser = argparse.ArgumentParser(prog="teamrl", description="Group-based RL for teams of LLM agents.")
    parser.add_argument("--version", action="version", version=f"teamrl {_version()}")
    sub = parser.add_subparsers(dest="command")
    tr = sub.add_parser("train", help="train a team from a YAML config")
    tr.add_argument("config", nargs="?", help="YAML config file, or the name of a built-in config (teamrl configs)")
    tr.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.steps=5")
    tr.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    tr.add_argument("--allow-change", action="append", default=[], metavar="KEY",
                    help="with --resume: a key (or dotted prefix) that may differ from the run's config.yaml, e.g. "
                         "train.steps (repeatable; any other difference is refused; run_dir may always differ)")
    tr.add_argument("--overwrite", action="store_true",
                    help="start a new run in a run_dir that holds an earlier run's records, which are moved to "
                         "<run_dir>.replaced-<time> first (without it, or --resume, such a run_dir is refused)")
    tr.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                    help="Python file defining your own agents/workflows/tasks (repeatable)")
    tr.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")
    tr.add_argument("--dry-run", action="store_true",
                    help="validate the config, make every check the run makes before loading weights (model paths, data, "
                         "run folder, resume state), print it resolved and its memory, training and time plans; loads no "
                         "model and trains nothing")
    tr.add_argument("--plan-gpu", default="H100", metavar="NAME", help="with --dry-run, the GPU a GPU config is timed "
                    "on when none is visible (H200, H100, H100 PCIe, A100, L40S: teamrl/plan/limits.py)")
    tr.add_argument("--plan-from", default=None, metavar="RUN", help="with --dry-run, time the config with the work an "
                    "earlier run did (RUN/metrics.jsonl against RUN/config.yaml: reply lengths, calls, rows trained, host "
                    "seconds) instead of the shipped prior of its workflow and task (docs/time.md)")
    tr.add_argument("--smoke", action="store_true",
                    help="one training step on a CPU: the embedded model, small sizes, offline data (teamrl/smoke.py, "
                         "docs/recipes.md); with --dry-run it prints that variant")
    _add_allocator(tr)
    tr.set_defaults(fn=_train)
    ev = sub.add_parser("eval", help="avg@n and pass@k of a checkpoint or the untrained team on held-out benchmarks")
    ev.add_argument("config", nargs="?", help="YAML config file (the team, models and sampling); default with "
                                              "--checkpoint RUN_DIR: the run's own config.yaml")
    ev.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    which = ev.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", help="run directory (its latest checkpoint) or a checkpoints/step_N folder")
    which.add_argument("--untrained", action="store_true", help="evaluate the models as the config loads them")
    ev.add_argument("--benchmarks", action="append", default=[], metavar="NAME=PATH[,NAME=PATH]",
                    help="GSM8K/MATH-style test files read by the math task (default: the config task's test split)")
    ev.add_argument("--k", type=int, default=4, help="k of pass@k (default 4)")
    ev.add_argument("--samples", type=int, default=None, help="samples per problem n >= k (default k)")
    ev.add_argument("--out", default="runs/eval", help="folder for eval.json and transcripts (default runs/eval)")
    ev.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                    help="Python file defining your own agents/workflows/tasks (repeatable)")
    _add_allocator(ev)
    ev.set_defaults(fn=_eval)
    ab = sub.add_parser("ablate", help="train a config under several presets and seeds, then compare them")
    ab.add_argument("config", nargs="?", help="YAML config file")
    ab.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run")
    ab.add_argument("--presets", default="grpo,grpo_step,agent_episode,drmas",
                    help="comma-separated estimator presets (default grpo,grpo_step,agent_episode,drmas)")
    ab.add_argument("--seeds", default="3", metavar="N|A-B|LIST",
                    help="seeds per preset: N for train.seed = 0 .. N-1 (default 3), or seeds and ranges such as 3-5 "
                         "or 0,2,7 (another machine's share of the grid)")
    ab.add_argument("--out", default=None, help="grid folder; run dirs are <out>/<preset>_seed<k> (default runs/ablate_<config>)")
    ab.add_argument("--jobs", type=int, default=1,
                    help="runs at once, each a teamrl train process logging to <run_dir>/train.log "
                         "(default 1: one after another in this process)")
    ab.add_argument("--baseline", default=None, metavar="PRESET",
                    help="preset the others are compared with in the report, paired by seed (default grpo, when run)")
    ab.add_argument("--benchmarks", action="append", default=[], metavar="NAME=PATH[,NAME=PATH]",
                    help="GSM8K/MATH-style test files each finished run is scored on (as teamrl eval) into "
                         "<run_dir>/benchmarks/; the report gets their avg@n and pass@k")
    ab.add_argument("--k", type=int, default=None, help="with --benchmarks: k of pass@k (default 4)")
    ab.add_argument("--samples", type=int, default=None, help="with --benchmarks: samples per problem n >= k (default k)")
    ab.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                    help="Python file defining your own agents/workflows/tasks (repeatable)")
    _add_allocator(ab)
    ab.set_defaults(fn=_ablate)
    pr = sub.add_parser("probe", help="per-agent gradients of several presets on identical rollout batches (2x2, Lemma 4.2)")
    pr.add_argument("config", nargs="?", help="YAML config file, or the name of a built-in config")
    pr.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    pr.add_argument("--presets", default="grpo,grpo_step,agent_episode,drmas",
                    help="comma-separated estimator presets compared on every batch (default the 2x2 grid)")
    pr.add_argument("--batches", type=int, default=4, help="rollout batches per seed (default 4)")
    pr.add_argument("--seeds", default="1", metavar="N|A-B|LIST", help="train.seed values, as for ablate (default 1: seed 0)")
    pr.add_argument("--checkpoint", default=None, help="model state: a run directory or checkpoints/step_N (default untrained)")
    pr.add_argument("--sweep", default=None, metavar="AGENT",
                    help="heterogeneity sweep: transform this agent's rewards (shift its mean, scale its spread)")
    pr.add_argument("--shifts", default="0,0.5,1,2", help="sweep: reward shifts (default 0,0.5,1,2)")
    pr.add_argument("--scales", default="1", help="sweep: spread scales > 0 (default 1)")
    pr.add_argument("--sweep-presets", default="grpo_step,drmas", help="sweep: presets traced (default grpo_step,drmas)")
    pr.add_argument("--no-cosines", action="store_true", help="skip the cosines between presets' gradients (saves memory)")
    pr.add_argument("--out", default="runs/probe", help="folder for the rows and probe_report.md (default runs/probe)")
    pr.add_argument("--report-only", action="store_true", help="rewrite the report from the rows already in --out")
    pr.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                    help="Python file defining your own agents/workflows/tasks (repeatable)")
    _add_allocator(pr)
    pr.set_defaults(fn=_probe)
    rp = sub.add_parser("report", help="compare run directories: table, plots and report.html")
    rp.add_argument("runs", nargs="+", help="run directories (names ending _seed<k> are averaged per prefix)")
    rp.add_argument("--out", default="runs/report", help="folder for report.html, PNGs and tables (default runs/report)")
    rp.add_argument("--baseline", default=None, metavar="LABEL",
                    help="label the others are compared with, paired by seed (default grpo, when present)")
    rp.set_defaults(fn=_report)
    cf = sub.add_parser("configs", help="list the built-in configs, or copy one out (teamrl configs copy NAME [DEST])")
    cf.add_argument("action", nargs="?", choices=["list", "copy"], default="list", help="list (default) or copy")
    cf.add_argument("name", nargs="?", help="copy: the built-in config's name")
    cf.add_argument("dest", nargs="?", help="copy: file or folder to write (default ./NAME.yaml)")
    cf.set_defaults(fn=_configs)
    ex = sub.add_parser("export", help="a run's trained models as Hugging Face directories (safetensors, tokenizer, README)")
    ex.add_argument("run_dir", help="run directory written by teamrl train")
    ex.add_argument("--out", required=True, help="new folder for the exported models")
    ex.add_argument("--step", type=int, default=None, help="checkpoint step to export (default: the latest)")
    ex.add_argument("--merge-lora", action="store_true",
                    help="merge each LoRA adapter into its base: one full model per adapter (default: PEFT adapters)")
    ex.set_defaults(fn=_export)
    sr = sub.add_parser("serve-retriever", help="serve BM25 search over a corpus (Search-R1 retriever protocol)")
    sr.add_argument("--corpus", required=True, help="wiki-18 JSONL corpus: {\"id\", \"contents\": \"\\\"Title\\\"\\ntext\"}")
    sr.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    sr.add_argument("--port", type=int, default=8000, help="port to listen on (0 = any free port; default 8000)")
    sr.add_argument("--topk", type=int, default=3, help="documents per query when a request gives no topk")
    sr.add_argument("--index-dir", default=None, help="folder of built indexes (default $TEAMRL_CACHE/retriever)")
    sr.set_defaults(fn=_serve_retriever)
    bc = sub.add_parser("build-corpus", help="make a wiki-18 JSONL corpus from HotpotQA distractor paragraphs")
    bc.add_argument("--hotpot", nargs="+", required=True, metavar="FILE",
                    help="QA files with context paragraphs (HotpotQA distractor, MuSiQue)")
    bc.add_argument("--out", required=True, help="corpus file to write")
    bc.set_defaults(fn=_build_corpus)
    sub.add_parser("sandbox-check", add_help=False,
                        help="what the sandbox contains here: hostile programs, process starts during them, zombies "
                             "(teamrl sandbox-check --help)")
    if (argv if argv is not None else sys.argv[1:])[:1] == ["sandbox-check"]:  # its own options, parsed by it
        from teamrl.sandbox import check

        return check.main((argv if argv is not None else sys.argv[1:])[1:])
    given = argv if argv is not None else sys.argv[1:]
    if not given:  # bare `teamrl`: what it does and its commands
        parser.print_help()
        return 0
    try:
        args, rest = parser.parse_known_args(argv)
    except SystemExit as exit_:
        if exit_.code not in (0, None) and flag_hint(given):
            print(f"teamrl: {flag_hint(given).removeprefix('; ')}", file=sys.stderr)
        raise
    if args.command is None:
        parser.error("give a command (teamrl -h lists them)")
    if args.command == "configs" and args.action == "copy" and args.name is None:
        parser.error("teamrl configs copy needs the NAME of a built-in config (teamrl configs lists them)")
    if args.command == "configs" and args.action == "list" and args.name is not None:
        parser.error(f"unrecognized arguments: {args.name}; did you mean `teamrl configs copy {args.name}`?")
    if rest and (not hasattr(args, "overrides") or any(r.startswith("-") or "=" not in r for r in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}{flag_hint(rest)}")
    if rest:  # key=value overrides written after options
        args.overrides = [*args.overrides, *rest]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpx2", "transformers"):  # httpx2: the HTTP client of newer openai releases
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars; teamrl draws its own progress
    try:
        return args.fn(args)
    except _USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


_USER_ERRORS = (configtools.ConfigError, FileNotFoundError, ValueError, ConnectionError, ImportError, FileExistsError)
"""What a user's setting or file can cause: one line (or one report) on stderr and exit status 2, no traceback."""


if __name__ == "__main__":
    sys.exit(main())
