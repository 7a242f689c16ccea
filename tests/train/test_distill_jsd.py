"""MAD-OPD's distillation from a team of teachers (algo.distill.loss: jsd): the divergence against a transcription of
the original's loss code, the debate's prompts and weights, the learner's loss and gradient against the original's
computation on whole logits, the config rules, and runs through the trainer (two teachers, with and without a debate).

The ``_orig_*`` functions are chiefovoavicii/MAD-OPD at 6c7a66a, ``mad_opd/trainers/mad_opd_core.py``, transcribed
line by line (its logger and CUDA cache calls left out)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from teamrl.algos import mad_opd
from teamrl.algos.distill import generalized_jsd
from teamrl.config.tools import ConfigError
from teamrl.learner.distill_term import DistillLoss
from teamrl.team.records import Step
from teamrl.train.trainer import Trainer
from tests.conftest import make_tiny_model
from tests.train.test_trainer import _register_reply_length_task, tiny_config

# ---------------------------------------------------------------- the original, transcribed (mad_opd_core.py)

def _orig_chunked_jsd(student_logits, teacher_logits, beta, chunk_size, num_valid):  # :42-87
    total_loss = torch.zeros((), dtype=torch.float32)
    if beta != 0 and beta != 1:
        beta_t = torch.tensor(beta, dtype=torch.float32)
        log_beta = torch.log(beta_t)
        log_1_minus_beta = torch.log1p(-beta_t)
    for start_idx in range(0, num_valid, chunk_size):
        end_idx = min(start_idx + chunk_size, num_valid)
        s_log_probs = F.log_softmax(student_logits[start_idx:end_idx], dim=-1)
        t_log_probs = F.log_softmax(teacher_logits[start_idx:end_idx], dim=-1)
        if beta == 0:
            jsd_chunk = F.kl_div(s_log_probs, t_log_probs, reduction="none", log_target=True)
        elif beta == 1:
            jsd_chunk = F.kl_div(t_log_probs, s_log_probs, reduction="none", log_target=True)
        else:
            mixture_log_probs = torch.logsumexp(
                torch.stack([s_log_probs + log_1_minus_beta, t_log_probs + log_beta]), dim=0)
            kl_teacher = F.kl_div(mixture_log_probs, t_log_probs, reduction="none", log_target=True)
            kl_student = F.kl_div(mixture_log_probs, s_log_probs, reduction="none", log_target=True)
            jsd_chunk = beta_t * kl_teacher + (1 - beta_t) * kl_student
        total_loss = total_loss + jsd_chunk.sum()
    return (total_loss / num_valid).clamp(min=0.0)


def _orig_jsd_single(student_logits, teacher_logits, beta=0.5, chunk_size=256, top_k=None):  # :90-209, labels None
    if student_logits.dim() >= 2 and teacher_logits.dim() >= 2:
        min_seq = min(student_logits.shape[-2], teacher_logits.shape[-2])
        student_logits, teacher_logits = student_logits[..., :min_seq, :], teacher_logits[..., :min_seq, :]
    student_logits = student_logits.reshape(-1, student_logits.size(-1))
    teacher_logits = teacher_logits.reshape(-1, teacher_logits.size(-1))
    num_valid = student_logits.size(0)
    if top_k is not None and top_k > 0 and top_k < student_logits.size(-1):
        with torch.no_grad():
            _, top_k_indices = torch.topk(teacher_logits, k=top_k, dim=-1)
        student_logits = torch.gather(student_logits, dim=-1, index=top_k_indices)
        teacher_logits = torch.gather(teacher_logits, dim=-1, index=top_k_indices)
    return _orig_chunked_jsd(student_logits, teacher_logits, beta, chunk_size, num_valid)


def _orig_mad_loss(student_logits, teacher_a_logits, teacher_b_logits, alpha, beta, jsd_beta, jsd_top_k=None):
    """``compute_mad_distillation_loss`` (:281-476) with labels None: each teacher's divergence over the reply, then
    the normalised weights."""
    loss_a = _orig_jsd_single(student_logits, teacher_a_logits.detach(), beta=jsd_beta, top_k=jsd_top_k)
    loss_b = _orig_jsd_single(student_logits, teacher_b_logits.detach(), beta=jsd_beta, top_k=jsd_top_k)
    weight_sum = alpha + beta
    return alpha / weight_sum * loss_a + beta / weight_sum * loss_b


def _orig_softmax_confidence_weights(score_a, score_b, tau_conf=1.0):  # :31-38
    logits = [score_a / 100.0 / tau_conf, score_b / 100.0 / tau_conf]
    m = max(logits)
    exps = [math.exp(x - m) for x in logits]
    z = sum(exps)
    return exps[0] / z, exps[1] / z


# ---------------------------------------------------------------- the pure functions against it

@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("top_k", [0, 5])
def test_the_divergence_is_the_originals_on_random_logits(beta, top_k):
    g = torch.Generator().manual_seed(int(beta * 10) + top_k)
    for _ in range(5):
        n, v = int(torch.randint(1, 9, (1,), generator=g)), 40
        s, t = 3 * torch.randn(n, v, generator=g), 3 * torch.randn(n, v, generator=g)
        ours = generalized_jsd(s, t, beta=beta, top_k=top_k).mean().clamp(min=0)
        theirs = _orig_jsd_single(s, t, beta=beta, chunk_size=3, top_k=top_k or None)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-5, abs=1e-7)


def test_the_divergence_by_hand_and_its_cases():
    s, t = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(3.0)]])  # S = (1/2, 1/2), T = (1/4, 3/4)
    m = [0.375, 0.625]  # beta 0.5
    kl_tm = 0.25 * math.log(0.25 / m[0]) + 0.75 * math.log(0.75 / m[1])
    kl_sm = 0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])
    assert float(generalized_jsd(s, t, beta=0.5)) == pytest.approx(0.5 * kl_tm + 0.5 * kl_sm, rel=1e-5)
    kl_ts = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)  # KL(T || S)
    kl_st = 0.5 * math.log(2.0) + 0.5 * math.log(2 / 3)  # KL(S || T)
    assert float(generalized_jsd(s, t, beta=0.0)) == pytest.approx(kl_ts, rel=1e-5)
    assert float(generalized_jsd(s, t, beta=1.0)) == pytest.approx(kl_st, rel=1e-5)
    assert float(generalized_jsd(s, t, beta=0.5)) <= math.log(2)  # bounded by ln 2 at beta 1/2
    # top-1 renormalises both onto one token: nothing left to differ
    assert float(generalized_jsd(s, t, beta=0.5, top_k=1)) == 0.0
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(s, t, beta=1.5)


def test_two_teachers_weighted_as_the_original_combines_them():
    g = torch.Generator().manual_seed(7)
    s, a, b = (torch.randn(6, 30, generator=g) for _ in range(3))
    for alpha, beta in [(0.5, 0.5), (0.7, 0.3), (*_orig_softmax_confidence_weights(90, 35),)]:
        ours = alpha * generalized_jsd(s, a, beta=0.5).mean() + beta * generalized_jsd(s, b, beta=0.5).mean()
        assert float(ours) == pytest.approx(float(_orig_mad_loss(s, a, b, alpha, beta, 0.5)), rel=1e-5)


def test_confidence_weights_and_tags_are_the_originals():
    for a, b in [(90, 40), (0, 100), (55, 55), (100, 99)]:
        assert mad_opd.confidence_weights(a, b) == pytest.approx(_orig_softmax_confidence_weights(a, b))
    assert mad_opd.confidence_weights(90, -1) == (0.5, 0.5) == mad_opd.confidence_weights(-1, -1)
    assert mad_opd.last_confidence("I think 4. <<CONFIDENCE=70>> no, 5 <<CONFIDENCE=95>>") == 95.0
    assert mad_opd.last_confidence("<<CONFIDENCE=high>> Confidence: 80") == -1
    w = mad_opd.confidence_weights(100, 0)
    assert w[0] == pytest.approx(math.e / (math.e + 1))  # softmax(1, 0)


def test_the_debates_texts_are_the_originals():
    p = "What is 2+3?"
    assert mad_opd.first_round_prompt(p) == (
        "You are a knowledgeable expert. Please solve the following problem step by step.\n\n"
        "Question: What is 2+3?\n\nYour solution:" + mad_opd.CONFIDENCE_SUFFIX)
    assert mad_opd.CONFIDENCE_SUFFIX.endswith("<<CONFIDENCE=N>> where N is an integer from 0 to 100. "
                                              "Do not include any other text after this tag.")
    history = "\n".join([mad_opd.debate_part("A", 1, "5"), mad_opd.debate_part("B", 1, "6")])
    revised = mad_opd.revision_prompt(p, history, "B")
    assert revised.startswith(p + "\n\nThe following is the debate history between two experts on this problem:\n\n"
                              "[Expert A Round 1]: 5\n[Expert B Round 1]: 6\n\nYou are Expert B, you don't have to")
    assert "solution.please continue the debate about this problem.Having seen" in revised  # the original's spacing
    h = mad_opd.debate_history(history.split("\n"))
    ctx = mad_opd.teacher_context(p, h, "A")
    assert ctx == (p + "\n\nYou are Expert A. The following is the debate between you and other experts:\n\n" + h +
                   "\n\nNow based on the debate results, please solve this problem again using your own method and "
                   "process:")
    assert mad_opd.teacher_context(p, h, "A", "code").endswith("please write the best code solution to this "
                                                                "programming challenge:")
    assert "tool-use" in mad_opd.first_round_prompt(p, "tool") and "code golf" in mad_opd.first_round_prompt(p, "code")


# ---------------------------------------------------------------- the learner's loss against the original on whole logits

def _rows(tokenizer, n=4, teachers=("ta", "tb"), weights=((0.5, 0.5), (0.8, 0.2), (0.1, 0.9), (1.0, 0.0))):
    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(n):
        prompt = tokenizer.encode(f"question number {i} " * (1 + i % 3))
        resp = torch.randint(0, 1000, (2 + i % 4,), generator=g).tolist()
        ctx = [tokenizer.encode(f"you are expert {k} and the question is {i}") for k in range(len(teachers))]
        rows.append(Step(prompt_index=0, episode=i, agent="solver", agent_call=0, model="m", prompt_ids=prompt,
                         response_ids=resp, logprobs=[-2.0] * len(resp), temperature=1.0, text="", valid=True,
                         teacher_rows=[{"model": m, "prompt_ids": ctx[k], "weight": weights[i][k]}
                                       for k, m in enumerate(teachers)]))
    return rows


def _reply_logits(model, prompt, reply):
    logits = model(input_ids=torch.tensor([prompt + reply])).logits[0]
    return logits[len(prompt) - 1: len(prompt) + len(reply) - 1]  # the positions that predict the reply


@pytest.mark.parametrize("pack,top_k,chunk", [(False, 0, 0), (True, 0, 3), (False, 7, 2)])
def test_the_learners_loss_and_gradient_are_the_originals_on_whole_logits(tokenizer, pack, top_k, chunk):
    """Each reply's loss is compute_mad_distillation_loss of the student's logits and each teacher's (after its own
    context), their mean over the replies; the learner's gradient (advantages 0, so the divergence alone) equals the
    gradient of that, padded or packed, over the whole vocabulary or the teachers' top-k, chunked or not."""
    from teamrl.learner.learner import TorchLearner
    from teamrl.learner.packing import use_packed_attention
    from tests.train.test_learner import settings

    student = make_tiny_model(tokenizer, seed=0)
    teachers = {"ta": make_tiny_model(tokenizer, seed=1).eval(), "tb": make_tiny_model(tokenizer, seed=2).eval()}
    rows = _rows(tokenizer)
    want = 0.0
    for r in rows:
        s = _reply_logits(student, r.prompt_ids, r.response_ids)
        with torch.no_grad():
            t = [_reply_logits(teachers[tr["model"]], tr["prompt_ids"], r.response_ids) for tr in r.teacher_rows]
        (a, b) = (tr["weight"] for tr in r.teacher_rows)
        want = want + _orig_mad_loss(s, t[0], t[1], a, b, 0.5, top_k or None) / len(rows)
    want.backward()
    exact = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()
    if pack:
        use_packed_attention(student)
        for t in teachers.values():
            use_packed_attention(t)
    learner = TorchLearner("m", student, settings(pack_rows=pack, share_prefixes=pack, logits_chunk_tokens=chunk), {})
    learner.distill = DistillLoss(teachers, coef=1.0, beta=0.5, top_k=top_k, chunk=chunk)
    out = learner.compute_gradients(rows)
    assert out["loss"] == pytest.approx(float(want.detach()), rel=1e-4)
    assert out["distill_jsd"] > 0 and out["rows_trained"] == len(rows)
    for n, p in student.named_parameters():
        assert torch.allclose(p.grad, exact[n], rtol=1e-3, atol=1e-6), n
    assert any(g.abs().max() > 0 for g in exact.values())


def test_a_teacher_equal_to_the_student_gives_no_loss(tokenizer):
    from teamrl.learner.learner import TorchLearner
    from tests.train.test_learner import settings

    student = make_tiny_model(tokenizer, seed=0)
    same = make_tiny_model(tokenizer, seed=0).eval()
    rows = _rows(tokenizer, teachers=("t",), weights=[(1.0,)] * 4)
    for r in rows:
        r.teacher_rows[0]["prompt_ids"] = list(r.prompt_ids)  # the student's own prompt: MAD-OPD's opd
    learner = TorchLearner("m", student, settings(), {})
    learner.distill = DistillLoss({"t": same})
    out = learner.compute_gradients(rows)
    assert out["distill_jsd"] == pytest.approx(0.0, abs=1e-6) and abs(out["loss"]) < 1e-6


# ---------------------------------------------------------------- config rules

def _cfg(tmp_path, student, *extra):
    return tiny_config(tmp_path, student, "d", "task.name=reply_length", "algo.format_penalty=0",
                       f"models.ta.path={student}", "models.ta.trainable=false",
                       f"models.tb.path={student}", "models.tb.trainable=false", *extra)


def test_config_rules_name_the_key_and_the_fix(tmp_path, tiny_model_dir):
    _register_reply_length_task()
    two = "algo.distill.teachers.solver=[ta,tb]"
    ok = _cfg(tmp_path, tiny_model_dir, two, "algo.distill.loss=jsd", "agents.solver.temperature=0.7")
    assert ok.algo.distill.teacher_models() == {"solver": ["ta", "tb"]} and ok.algo.distill.models() == ["ta", "tb"]
    bad = {
        (two,): "loss reverse_kl distils towards one teacher per agent",
        ("algo.distill.teachers.solver=ta", "algo.distill.beta=0.3"): "algo.distill.beta applies to loss: jsd",
        ("algo.distill.teachers.solver=[ta,tb,main]", "algo.distill.loss=jsd", "algo.distill.debate_rounds=2"):
            "the debate (algo.distill.debate_rounds 2) is between two teachers",
        (two, "algo.distill.loss=jsd", "algo.distill.weights=[1.0]"): "1 weights for the 2 teachers of solver",
        (two, "algo.distill.loss=jsd", "algo.distill.weights=[1.0,-1.0]"): "must be >= 0 with a positive sum",
        (two, "algo.distill.loss=jsd", "algo.distill.debate_rounds=1", "algo.distill.weights=[1.0,1.0]"):
            "the weights come from the teachers' confidences",
        (two, "algo.distill.loss=jsd", "algo.distill.discount=0.5"): "applies to loss: reverse_kl",
        (two, "algo.distill.loss=jsd", "algo.distill.beta=2"): "beta 2.0 must be in [0, 1]",
        (two, "algo.distill.loss=jsd", "models.tb.engine=openai", "models.tb.openai.base_url=http://127.0.0.1:9/v1"):
            "teacher 'tb' is served (engine: openai)",
        (two, "algo.distill.loss=jsd", "algo.distill.debate_top_p=0"): "debate_top_p 0.0 in (0, 1]",
        ("algo.distill.teachers.solver=[ta,ta]", "algo.distill.loss=jsd"): "must name one or more different",
        (two, "algo.distill.loss=jsd", "algo.distill.debate_mode=code"): "debate_mode applies to the debate",
    }
    for overrides, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            _cfg(tmp_path, tiny_model_dir, *overrides)


# ---------------------------------------------------------------- runs through the trainer

def _teacher_dirs(tmp_path, tokenizer):
    dirs = []
    for k in (1, 2):
        d = tmp_path / f"t{k}"
        make_tiny_model(tokenizer, seed=k).save_pretrained(d)
        tokenizer.save_pretrained(d)
        dirs.append(d)
    return dirs


@pytest.mark.parametrize("rounds", [0, 1])
def test_a_run_distils_the_solver_from_two_teachers(tmp_path, tokenizer, tiny_model_dir, rounds):
    """Two teachers, fixed weights 0.7 / 0.3 (mt_opd) or a one-round debate (mad_opd): the solver's replies carry
    both teachers' rows, the learner logs the divergence, the student moves and the teachers do not."""
    _register_reply_length_task()
    a, b = _teacher_dirs(tmp_path, tokenizer)
    extra = (["algo.distill.weights=[0.7,0.3]"] if rounds == 0 else
             [f"algo.distill.debate_rounds={rounds}", "algo.distill.debate_max_tokens=6"])
    cfg = _cfg(tmp_path, tiny_model_dir, f"models.ta.path={a}", f"models.tb.path={b}",
               "algo.distill.teachers.solver=[ta,tb]", "algo.distill.loss=jsd", "algo.distill.rl_weight=0",
               "train.steps=1", "train.save_every=0", "eval.before=false", "eval.after=false", *extra)
    tr = Trainer(cfg, progress=False)
    frozen = {n: p.detach().clone() for n, p in tr.runtime.teachers["ta"].named_parameters()}
    start = {n: p.detach().clone() for n, p in tr.models["main"].named_parameters()}
    tr.train()
    assert all(torch.equal(p, frozen[n]) for n, p in tr.runtime.teachers["ta"].named_parameters())
    assert any(not torch.equal(p, start[n]) for n, p in tr.models["main"].named_parameters())
    m = json.loads((tmp_path / "d" / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["agent/solver/distill_jsd"] > 0 and "agent/verifier/distill_jsd" not in m
    ws = m["distill/solver/weight/ta"], m["distill/solver/weight/tb"]
    assert sum(ws) == pytest.approx(1.0)
    if rounds == 0:
        assert ws == pytest.approx((0.7, 0.3))
    else:
        assert 0 <= m["distill/solver/confidence_found"] <= 1 and 0 < m["distill/solver/debate_tokens"] <= 2 * rounds * 6  # per reply: two teachers, at most 6 tokens an answer


def test_the_time_plan_counts_the_teachers_forwards_in_the_update(tmp_path, tiny_model_dir):
    """loss jsd runs the teachers in the learner's micro-batches: their forwards are the update phase's, planned per
    teacher; reverse_kl's single teacher scores in the log-probs phase."""
    from teamrl.plan.limits import Limits
    from teamrl.plan.timing import plan_time

    _register_reply_length_task()
    cpu = Limits("test cpu", 100.0, 400.0, 20.0, "by hand")
    jsd = _cfg(tmp_path, tiny_model_dir, "algo.distill.teachers.solver=[ta,tb]", "algo.distill.loss=jsd")
    plans = {p.phase: p for p in plan_time(jsd, cpu, on_gpu=False)}
    assert {"ta", "tb"} <= set(plans["update"].work) and "logprobs" not in plans
    kl = _cfg(tmp_path, tiny_model_dir, "algo.distill.teachers.solver=ta", "algo.distill.teachers.verifier=tb")
    plans = {p.phase: p for p in plan_time(kl, cpu, on_gpu=False)}
    assert set(plans["logprobs"].work) == {"ta", "tb"} and "ta" not in plans["update"].work


@pytest.mark.slow  # four short runs (about 30 s); the default run covers the stage and the learner's term above
def test_a_run_with_a_debate_resumes_exactly(tmp_path, tokenizer, tiny_model_dir):
    """Two steps straight, or one step and a resume, with two teachers debating: the same weights and the same logged
    metrics (the debates sample with the run's generator state, which a checkpoint restores)."""
    from tests.train.test_resume import assert_two_steps_resume_exactly

    _register_reply_length_task()
    a, b = _teacher_dirs(tmp_path, tokenizer)

    def cfg(run: str, steps: int):
        return tiny_config(tmp_path, tiny_model_dir, run, "task.name=reply_length", f"models.ta.path={a}",
                           "models.ta.trainable=false", f"models.tb.path={b}", "models.tb.trainable=false",
                           "algo.distill.teachers.solver=[ta,tb]", "algo.distill.loss=jsd",
                           "algo.distill.debate_rounds=2", "algo.distill.debate_max_tokens=4",
                           f"train.steps={steps}", "eval.before=false", "eval.after=false")

    assert_two_steps_resume_exactly(cfg, tmp_path)
