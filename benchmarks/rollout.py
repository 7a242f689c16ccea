"""Rollout throughput: teamrl's ``hf`` engine vs Hugging Face ``model.generate``.

Part 1, one model: the same SmolLM2-135M-Instruct module (``teamrl.models.load_model_and_tokenizer
("default", dtype=...)``), sampling with temperature 1.0 and top_p 1.0, prompts of about 72 tokens,
exactly ``--new-tokens`` new tokens per row (end-of-turn stopping is off in both: ``generate(
min_new_tokens=N, max_new_tokens=N)`` and ``SamplingParams(ignore_eos=True)``). Rows:

* ``generate``     -- ``model.generate`` on a left-padded batch, no log-probs;
* ``generate+lp``  -- the same with ``output_scores=True``, plus the log-prob of every sampled token
  (``log_softmax`` of each step's score row, gathered): what the engine returns;
* ``engine``       -- ``HFEngine.generate`` as a run builds it (``share_prefix`` 16: what ``models.<m>.share_prefix:
  auto`` gives; returns log-probs always); ``--variant share_prefix=0`` adds the engine without shared prefill;
* ``engine-generic`` (``--generic``) -- the engine's generic decode loop (over ``model.forward``
  with a ``DynamicCache``; the path used for LoRA adapters and architectures without a fast path);
* ``vllm`` when the ``vllm`` package imports (otherwise a note is printed).

Part 2, a two-agent team sharing the model: N episodes of solver -> verifier (the verifier sees the
solver's answer). teamrl runs them through the ``Dispatcher`` (all N solver calls in one engine
batch, then all N verifier calls); the baseline runs each episode in turn with one
``model.generate`` call per agent per turn (batch 1).

Part 3 (``--sched``), the Dispatcher's two schedulers on the same engine and workflow, with
replies of natural length: ``--sched-episodes`` episodes of solver (at most ``--solver-tokens``,
ends at its end-of-turn token) -> verifier (at most ``--verifier-tokens``), sampled at T=1.0.
``lockstep`` sends all pending calls as one batch and decodes it to completion (an episode whose
solver reply ends early waits for the longest); ``continuous`` resolves each call as it finishes
and its episode's verifier call joins the running batch. Tokens/s counts generated tokens.

Part 4 (``--prefix``), shared-prefix prefill: ``--prefix-groups`` problems x ``--prefix-group-size``
verifier prompts (one system prompt and problem per group, a different ~``--prefix-suffix``-token
solution per row), prefilled (admitted + first token) by the engine with ``share_prefix`` off and
on (32 tokens).

The machine is shared, so every repetition runs all rows back to back, alternating, after one
warm-up, and ratios are medians over repetitions of per-repetition ratios. Torch uses 2 threads.

    python benchmarks/rollout.py                  # --dtype auto: bf16 where native, else float32 (printed)
    python benchmarks/rollout.py --batches 32 --reps 3 --no-team --generic
    python benchmarks/rollout.py --no-single --no-team --sched --prefix --reps 3

Last line: ``RESULT name=rollout b32_ratio=... b64_ratio=... team_ratio=...`` (engine tok/s divided
by ``generate`` tok/s, without log-probs on the generate side; ``*_lp_ratio`` compares with
``generate+lp``; ``b*_over_<variant>`` is the default engine's tok/s over a ``--variant`` row's, e.g.
``b128_over_fuse0`` for ``--variant fuse=0``; ``sched_ratio`` is continuous / lockstep tok/s; ``prefix_ratio`` is the prefill time
without sharing / with sharing). One decode step (attention kernel, profile): ``benchmarks/decode_step.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from dtypes import rollout_dtype
from limits import GpuBusy, copy_bandwidth, roofline, sync  # benchmarks/ is on sys.path when run as a script
from shapes import SHAPES, prompt_tokenizer, random_model
from team_workload import VERIFIER_SYS, forget_prefixes, team_sequential, team_teamrl, verifier_messages

QUESTIONS = [
    "A farmer has {a} sheep and buys {b} more, then sells a third of the flock at the market on Sunday.",
    "Tom reads {a} pages every morning and {b} pages every evening for two weeks of his summer holiday.",
    "A train leaves at {a} minutes past noon and travels {b} kilometres at a steady, unchanging speed.",
    "Sara bakes {a} cookies, gives {b} to her neighbours and packs the rest into boxes of six each.",
]


def make_prompts(tok, n: int, target: int = 72) -> list[list[int]]:
    """``n`` chat prompts of about ``target`` tokens each (different numbers and wording per row)."""
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)].format(a=10 + 7 * i, b=3 + 5 * i)
        text = f"{q} How many are there in the end? Explain your reasoning step by step, then give the number."
        ids = list(tok.apply_chat_template([{"role": "system", "content": "You are a careful math tutor."},
                                            {"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False))
        while len(ids) < target - 2:  # pad the question with a neutral phrase towards the target length
            text = "Please be brief. " + text
            ids = list(tok.apply_chat_template([{"role": "system", "content": "You are a careful math tutor."},
                                                {"role": "user", "content": text}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False))
        out.append(ids)
    return out


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    return ids, mask


@torch.no_grad()
def hf_generate(model, tok, prompts: list[list[int]], new_tokens: int, logprobs: bool) -> tuple[int, list]:
    """One batched ``model.generate`` call; returns (new tokens generated, per-row log-probs or [])."""
    ids, mask = left_pad(prompts, tok.pad_token_id)
    ids, mask = ids.to(model.device), mask.to(model.device)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                         min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id,
                         return_dict_in_generate=True, output_scores=logprobs)
    seq = out.sequences[:, ids.shape[1]:]
    lps = []
    if logprobs:  # scores are the processed logits of each step: with T=1, top_p=1 the raw logits
        per_step = [torch.log_softmax(s.float(), -1).gather(1, seq[:, i:i + 1]) for i, s in enumerate(out.scores)]
        lps = torch.cat(per_step, 1).tolist()
    return seq.numel(), lps


def engine_generate(engine, prompts: list[list[int]], new_tokens: int) -> int:
    from teamrl.engines.base import GenRequest, SamplingParams

    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    forget_prefixes(engine)
    outs = engine.generate([GenRequest(p, sp) for p in prompts])
    return sum(len(o.response_ids) for o in outs)


# HFEngine switches that --variant sets as booleans (0 / 1); other keys are integers (share_prefix)
BOOL_VARIANTS = ("device_loop", "cuda_graphs", "compile", "overlap", "fuse", "pack", "mkl_pack", "panel", "fused_step")


def timed(fn) -> tuple[float, int]:
    sync()
    t = time.perf_counter()
    n = fn()
    sync()
    return time.perf_counter() - t, n


def make_vllm(dtype: str):
    try:
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; ample for 64 rows of 200 tokens
        from vllm import LLM  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"note: vllm row skipped ({type(exc).__name__}: {exc})")
        return None
    from teamrl.models import resolve_model_path

    # On the CPU build gpu_memory_utilization is the share of host memory it insists is free at start.
    return LLM(model=resolve_model_path("default"), dtype=dtype, enforce_eager=True, seed=0,
               gpu_memory_utilization=0.3, max_model_len=2048)


def vllm_generate(llm, prompts: list[list[int]], new_tokens: int) -> int:
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    sp = VSP(temperature=1.0, top_p=1.0, min_tokens=new_tokens, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs)


def bench_single(args, model, tok, engines: dict, llm) -> dict[int, dict[str, list[float]]]:
    results: dict[int, dict[str, list[float]]] = {}
    for B in args.batches:
        prompts = make_prompts(tok, B)
        rows = {"generate": lambda: hf_generate(model, tok, prompts, N, False)[0]}
        if args.hf_logprobs:
            rows["generate+lp"] = lambda: hf_generate(model, tok, prompts, N, True)[0]
        for name, eng in engines.items():
            rows[name] = (lambda e: lambda: engine_generate(e, prompts, N))(eng)
        if llm is not None:
            rows["vllm"] = lambda: vllm_generate(llm, prompts, N)
        N = args.warmup_tokens
        for fn in rows.values():  # warm-up
            fn()
        N = args.new_tokens
        tps = {name: [] for name in rows}
        for rep in range(args.reps):
            names = list(rows) if rep % 2 == 0 else list(reversed(rows))  # alternate the order
            for name in names:
                dt, n = timed(rows[name])
                tps[name].append(n / dt)
            print(f"B={B} rep {rep}: " + "  ".join(f"{k} {tps[k][-1]:.1f}" for k in rows), flush=True)
        results[B] = tps
        if args.device == "cuda":
            from teamrl.metrics.perf import peak_tflops

            peak = peak_tflops(torch.cuda.get_device_name(), args.dtype)
            prompt = statistics.mean(map(len, prompts))
            roof, bound = roofline(model, B, prompt + args.new_tokens / 2, args.bandwidth, peak)
            for k, v in tps.items():
                print(f"B={B} {k}: {statistics.median(v):.0f} tok/s = {100 * statistics.median(v) / roof:.1f}% of the "
                      f"roofline ({roof:.0f} tok/s, {bound}-bound: weights + mean KV read once per step at "
                      f"{args.bandwidth / 1e12:.2f} TB/s, {peak} TFLOP/s)")
            results[B]["roofline"] = [roof]
        base = tps["generate"]
        print(f"B={B} median tok/s: " + "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in tps.items()))
        for k, v in tps.items():
            if k != "generate":
                print(f"B={B} {k}/generate median ratio {statistics.median([a / b for a, b in zip(v, base)]):.2f}")
        print(flush=True)
    return results


# ---- two-agent team (the workload: team_workload.py) -------------------------------------------

def bench_team(args, model, tok, engine) -> list[float]:
    problems = [QUESTIONS[i % len(QUESTIONS)].format(a=10 + 7 * i, b=3 + 5 * i) + " How many are there in the end?"
                for i in range(args.episodes)]
    rows = {
        "sequential generate": lambda: team_sequential(model, tok, problems, S, V),
        "teamrl dispatcher": lambda: team_teamrl(engine, tok, problems, S, V),
    }
    S, V = 4, 4
    for fn in rows.values():
        fn()
    S, V = args.solver_tokens, args.verifier_tokens
    tps = {k: [] for k in rows}
    for rep in range(args.reps):
        for name in (list(rows) if rep % 2 == 0 else list(reversed(rows))):
            dt, n = timed(rows[name])
            tps[name].append(n / dt)
        print(f"team rep {rep}: " + "  ".join(f"{k} {tps[k][-1]:.1f} tok/s" for k in rows), flush=True)
    ratios = [a / b for a, b in zip(tps["teamrl dispatcher"], tps["sequential generate"])]
    print(f"team ({args.episodes} episodes, solver {args.solver_tokens} + verifier {args.verifier_tokens} tokens) "
          f"median tok/s: " + "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in tps.items())
          + f"  median ratio {statistics.median(ratios):.2f}\n", flush=True)
    return ratios


# ---- schedulers: lockstep vs continuous ------------------------------------------------------

def bench_sched(args, engine) -> list[float]:
    problems = [QUESTIONS[i % len(QUESTIONS)].format(a=10 + 7 * i, b=3 + 5 * i) + " How many are there in the end?"
                for i in range(args.sched_episodes)]
    S, V = args.solver_tokens, args.verifier_tokens

    def row(name: str):
        return lambda: team_teamrl(engine, engine.tokenizer, problems, S, V, scheduler=name, ignore_eos=False)

    rows = {name: row(name) for name in ("lockstep", "continuous")}
    for name in rows:  # warm-up, short replies
        team_teamrl(engine, engine.tokenizer, problems, 4, 4, scheduler=name, ignore_eos=False)
    tps: dict[str, list[float]] = {k: [] for k in rows}
    for rep in range(args.reps):
        for name in (list(rows) if rep % 2 == 0 else list(reversed(rows))):
            if args.device == "cuda":
                with GpuBusy() as busy:
                    dt, n = timed(rows[name])
                util = f", GPU utilisation {busy.mean:.0f}%"
            else:
                dt, n, util = *timed(rows[name]), ""
            tps[name].append(n / dt)
            print(f"sched rep {rep}: {name} {n} tokens in {dt:.1f} s, {n / dt:.1f} tok/s{util}", flush=True)
    ratios = [a / b for a, b in zip(tps["continuous"], tps["lockstep"])]
    print(f"schedulers ({args.sched_episodes} episodes, solver <= {S} + verifier <= {V} tokens, natural ends) "
          f"median tok/s: " + "  ".join(f"{k} {statistics.median(v):.1f}" for k, v in tps.items())
          + f"  median ratio continuous/lockstep {statistics.median(ratios):.2f}\n", flush=True)
    return ratios


def bench_prefix(args, model, tok) -> list[float]:
    """Prefill time of grouped verifier prompts, shared-prefix prefill off vs on."""
    from teamrl.engines.base import GenRequest, SamplingParams
    from teamrl.engines.hf import HFEngine

    words = "we add the numbers, then subtract, then check the remainder and count again".split()
    prompts = []
    for g in range(args.prefix_groups):
        problem = QUESTIONS[g % len(QUESTIONS)].format(a=10 + 7 * g, b=3 + 5 * g) + " How many are there in the end?"
        for i in range(args.prefix_group_size):
            solution = " ".join(words[(i + j) % len(words)] for j in range(args.prefix_suffix))
            chat = [{"role": "system", "content": VERIFIER_SYS}, *verifier_messages(problem, solution)]
            prompts.append(list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)))
    sp = SamplingParams(max_new_tokens=1)
    rows = {name: HFEngine(model, tok, max_batch_size=len(prompts), share_prefix=k)
            for name, k in (("plain", 0), ("shared", 32))}
    lens = [len(p) for p in prompts]
    common = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
              for a, b in zip(prompts[:-1], prompts[1:])]
    print(f"prefix: {len(prompts)} prompts of {min(lens)}-{max(lens)} tokens, shared prefix within a group "
          f"about {statistics.median(common)} tokens", flush=True)
    for eng in rows.values():  # warm-up
        eng.generate([GenRequest(p, sp) for p in prompts[:4]])
    times: dict[str, list[float]] = {k: [] for k in rows}
    for rep in range(args.reps):
        for name in (list(rows) if rep % 2 == 0 else list(reversed(rows))):
            forget_prefixes(rows[name])
            dt, _ = timed(lambda: rows[name].generate([GenRequest(p, sp) for p in prompts]))
            times[name].append(dt)
        print(f"prefix rep {rep}: " + "  ".join(f"{k} {times[k][-1]:.2f} s" for k in rows), flush=True)
    ratios = [a / b for a, b in zip(times["plain"], times["shared"])]
    print("prefix median prefill s: " + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in times.items())
          + f"  median speed-up {statistics.median(ratios):.2f}\n", flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                    help="auto: bf16 where it is native (GPU, CPU with AMX / AVX-512 BF16), else float32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default="default", help="a model path ('default': the embedded SmolLM2-135M)")
    src.add_argument("--shape", choices=sorted(set(SHAPES) - {"tiny"}), help="a random Qwen2.5-shaped model (the default model's "
                     "tokenizer makes the prompts)")
    ap.add_argument("--tokenizer", help="--shape: a tokenizer folder for the prompts (default: the default model's)")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--warmup-tokens", type=int, default=16, help="new tokens per row in the warm-up round")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-hf-logprobs", dest="hf_logprobs", action="store_false",
                    help="skip the generate+lp row (generate with output_scores and the log-prob gather)")
    ap.add_argument("--generic", action="store_true", help="add the engine's generic decode loop as a row")
    ap.add_argument("--variant", action="append", default=[],
                    help="add an engine row with these integer constructor options, e.g. fuse=0 (repeatable)")
    ap.add_argument("--no-single", dest="single", action="store_false", help="skip part 1 (one model)")
    ap.add_argument("--no-team", dest="team", action="store_false", help="skip part 2 (two-agent team)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--solver-tokens", type=int, default=64)
    ap.add_argument("--verifier-tokens", type=int, default=16)
    ap.add_argument("--sched", action="store_true", help="part 3: lockstep vs continuous Dispatcher")
    ap.add_argument("--sched-episodes", type=int, default=32)
    ap.add_argument("--prefix", action="store_true", help="part 4: shared-prefix prefill off vs on")
    ap.add_argument("--prefix-groups", type=int, default=4)
    ap.add_argument("--prefix-group-size", type=int, default=8)
    ap.add_argument("--prefix-suffix", type=int, default=48, help="words of each row's own solution")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    args.dtype = rollout_dtype(args.dtype, args.device)
    from teamrl.engines.hf import HFEngine
    from teamrl.models import load_model_and_tokenizer

    if args.shape:  # only the tokenizer of the default model (or of --tokenizer) is needed
        tok = prompt_tokenizer(args.tokenizer)
        model = random_model(args.shape, args.dtype, args.device)
    else:
        model, tok = load_model_and_tokenizer(args.model, dtype=args.dtype, device=args.device)
    model.eval()
    args.bandwidth = copy_bandwidth() if args.device == "cuda" else None
    base = {"seed": 0, "share_prefix": "auto"}  # as a run builds it (models.<m>.share_prefix: auto)
    engines = {"engine": HFEngine(model, tok, **base,
                                  max_batch_size=max(max(args.batches), args.episodes, args.sched_episodes))}
    if args.generic:
        engines["engine-generic"] = HFEngine(model, tok, seed=0, max_batch_size=max(args.batches), fast=False)
    for v in args.variant:  # e.g. fuse=0 or share_prefix=32
        kw = {k: bool(int(x)) if k in BOOL_VARIANTS else int(x) for k, x in (kv.split("=") for kv in v.split(","))}
        engines[f"engine[{v}]"] = HFEngine(model, tok, max_batch_size=max(args.batches), **{**base, **kw})
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"threads {torch.get_num_threads()}"
    print(f"torch {torch.__version__}, {where}, model {args.shape or args.model}, dtype {args.dtype}, "
          f"{args.new_tokens} new tokens, {args.reps} reps after a warm-up; tokens/s", flush=True)
    result = ["RESULT name=rollout"]
    if args.single:
        llm = make_vllm(args.dtype)
        res = bench_single(args, model, tok, engines, llm)
        for B, tps in res.items():
            r = statistics.median([a / b for a, b in zip(tps["engine"], tps["generate"])])
            result.append(f"b{B}_ratio={r:.2f}")
            if "generate+lp" in tps:
                r = statistics.median([a / b for a, b in zip(tps["engine"], tps["generate+lp"])])
                result.append(f"b{B}_lp_ratio={r:.2f}")
            result.append(f"b{B}_engine_tps={statistics.median(tps['engine']):.0f}")
            if "roofline" in tps:
                result.append(f"b{B}_roofline_pct={100 * statistics.median(tps['engine']) / tps['roofline'][0]:.1f}")
            for v in args.variant:  # the default engine's speed over each variant's, e.g. b128_over_fuse0
                r = statistics.median([a / b for a, b in zip(tps["engine"], tps[f"engine[{v}]"])])
                result.append(f"b{B}_over_{v.replace('=', '').replace(',', '_')}={r:.2f}")
    if args.team:
        ratios = bench_team(args, model, tok, engines["engine"])
        result.append(f"team_ratio={statistics.median(ratios):.2f}")
    if args.sched:
        ratios = bench_sched(args, engines["engine"])
        result.append(f"sched_ratio={statistics.median(ratios):.2f}")
    if args.prefix:
        ratios = bench_prefix(args, model, tok)
        result.append(f"prefix_ratio={statistics.median(ratios):.2f}")
    print(" ".join(result))


if __name__ == "__main__":
    main()
