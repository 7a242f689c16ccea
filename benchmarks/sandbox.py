"""Sandbox throughput: HumanEval's 164 canonical and 164 deliberately wrong programs, sandboxed vs plain subprocesses.

Each program runs with HumanEval's own tests in the harness of :mod:`teamrl.domains.code.code` (one process
per program), ``--workers`` at a time, once through the sandbox (bubblewrap, seccomp, rlimits, a
user per run) and once in plain subprocesses (the same interpreter and harness files in a temporary
folder, no isolation, no limits but a timeout), rounds alternating. It checks that every canonical
program passes and every wrong one fails in both, and prints runs per second and a last line::

    RESULT name=sandbox runs_per_s=... plain_runs_per_s=... canonical_passed=164/164 wrong_failed=164/164 ratio=...

where ratio = sandboxed runs/s / plain runs/s (the share of plain speed the isolation keeps; the
median of the rounds).

    python benchmarks/sandbox.py [--workers 2] [--rounds 2] [--problems 164]

``--containment`` instead runs the hostile programs of ``tests/sandbox/test_sandbox.py`` one at a
time (the limits of that test: 1 s CPU, 3 s wall, 256 MiB, 8 processes, 64 KiB output, 1 MiB disk)
and prints the markdown table of docs/code.md (program, verdict, expected verdict, seconds), then::

    RESULT name=sandbox_containment contained=22/22 max_seconds=...
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from teamrl.domains.code import code
from teamrl.domains.code.humaneval import load_humaneval, reference_program, wrong_program
from teamrl.sandbox import Job, Run, Sandbox


def _plain_run(python: str, job: Job) -> Run:
    """``job`` in a plain subprocess: its files in a temporary folder, no isolation."""
    with tempfile.TemporaryDirectory() as folder:
        for name, content in {"main.py": job.source, **job.files}.items():
            path = Path(folder, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        stdin = job.stdin.encode() if isinstance(job.stdin, str) else job.stdin or b""
        start = time.monotonic()
        try:
            done = subprocess.run([python, "-E", "-s", "-B", "main.py"], input=stdin, capture_output=True, cwd=folder,
                                  timeout=job.limits.wall_seconds, env={})
        except subprocess.TimeoutExpired:
            return Run("timeout", None, "", "", time.monotonic() - start)
        verdict = "ok" if done.returncode == 0 else "error"
        return Run(verdict, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"),
                   time.monotonic() - start)


def _verdicts(pairs, runner) -> list[code.Verdict]:
    planned = [code._jobs(problem, program, code.Limits()) for problem, program in pairs]
    runs = runner([jobs[0] for jobs, _ in planned])
    return [code._call_verdict(problem, run, nonce) for (problem, _), (_, nonce), run in zip(pairs, planned, runs,
                                                                                           strict=True)]


def containment() -> None:
    """The hostile programs of the containment test, one at a time, as a markdown table."""
    from teamrl.sandbox.check import EXPECTED, FAST, hostile_programs

    box = Sandbox(workers=1)
    print(box.describe())
    print("| program | verdict | expected | seconds |\n| --- | --- | --- | --- |")
    good, worst = 0, 0.0
    with tempfile.TemporaryDirectory() as folder:  # as the test's tmp_path: a host folder with a secret file
        secret = Path(folder, "secret.txt")
        secret.write_text("host secret")
        for name, source in hostile_programs(str(secret), 9, os.getpid()).items():
            run = box.run(source, limits=FAST)
            good += run.verdict == EXPECTED[name]
            worst = max(worst, run.seconds)
            print(f"| {name} | {run.verdict} | {EXPECTED[name]} | {run.seconds:.2f} |")
    print(f"RESULT name=sandbox_containment contained={good}/{len(EXPECTED)} max_seconds={worst:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--problems", type=int, default=164)
    parser.add_argument("--containment", action="store_true", help="the containment table instead")
    args = parser.parse_args()
    if args.containment:
        containment()
        return

    problems = load_humaneval()[: args.problems]
    pairs = [(p.meta["code"], reference_program(p)) for p in problems]
    pairs += [(p.meta["code"], wrong_program(p)) for p in problems]
    box = Sandbox(workers=args.workers)
    pool = ThreadPoolExecutor(args.workers)
    python = box.interpreter.executable
    print(f"{box.describe()}; cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    runners = {"plain": lambda jobs: list(pool.map(lambda j: _plain_run(python, j), jobs)), "sandbox": box.map}
    rates: dict[str, list[float]] = {"plain": [], "sandbox": []}
    results: dict[str, list[code.Verdict]] = {}
    for r in range(args.rounds):
        for name, runner in runners.items():
            start = time.monotonic()
            results[name] = _verdicts(pairs, runner)
            seconds = time.monotonic() - start
            rates[name].append(len(pairs) / seconds)
            n = len(problems)
            right = sum(v.ok for v in results[name][:n])
            wrong = sum(v.status == "failed" for v in results[name][n:])
            print(f"round {r + 1} {name:8s} {len(pairs)} runs in {seconds:6.2f} s = {rates[name][-1]:6.1f} runs/s; "
                  f"canonical passed {right}/{n}, wrong failed {wrong}/{n}")
    n = len(problems)
    right = sum(v.ok for v in results["sandbox"][:n])
    wrong = sum(v.status == "failed" for v in results["sandbox"][n:])
    sandboxed, plain = statistics.median(rates["sandbox"]), statistics.median(rates["plain"])
    print(f"RESULT name=sandbox runs_per_s={sandboxed:.1f} plain_runs_per_s={plain:.1f} canonical_passed={right}/{n} "
          f"wrong_failed={wrong}/{n} workers={args.workers} ratio={sandboxed / plain:.2f}")
    box.close()
    pool.shutdown()


if __name__ == "__main__":
    main()
