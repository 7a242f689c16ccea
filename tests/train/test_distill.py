"""On-policy distillation per role (algo.distill): the per-token reverse-KL advantage, its config rules, the stage
that scores trained steps with a teacher, and a run that moves a student towards its teacher."""

from __future__ import annotations

import json
import math

import pytest
import torch

from teamrl.algos import losses
from teamrl.algos.distill import discounted_future_sum, reverse_kl_advantages
from teamrl.config.tools import ConfigError
from teamrl.learner.scoring import response_logprobs
from teamrl.scoring.distill import Distill
from teamrl.train.trainer import Trainer
from tests.conftest import make_tiny_model
from tests.train.test_learner import make_rows
from tests.train.test_trainer import _register_reply_length_task, tiny_config


def test_the_term_is_minus_coef_times_the_log_ratio_and_its_discounted_sum():
    s = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-3.0])]
    t = [torch.tensor([-2.0, -1.0, -0.5]), torch.tensor([-1.0])]
    adv, kl = reverse_kl_advantages(s, t, coef=0.5)
    assert [a.tolist() for a in adv] == [[-0.5, 0.5, 0.0], [1.0]]  # -0.5 * (1, -1, 0) and -0.5 * (-2)
    assert kl == pytest.approx((1 - 1 + 0 - 2) / 4)
    adv, _ = reverse_kl_advantages(s, t, coef=0.5, discount=0.5)
    assert adv[0].tolist() == [-0.5 + 0.5 * 0.5 + 0.25 * 0.0, 0.5, 0.0] and adv[1].tolist() == [1.0]


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9])
def test_discounted_sum_matches_its_definition(gamma):
    x = torch.randn(7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = [sum(gamma ** (k - t) * float(x[k]) for k in range(t, 7)) for t in range(7)]
    assert discounted_future_sum(x, gamma).tolist() == pytest.approx(want, rel=1e-12)


def test_a_student_equal_to_its_teacher_gets_no_term_and_the_term_is_linear_in_coef():
    s = [torch.randn(5, generator=torch.Generator().manual_seed(2))]
    assert reverse_kl_advantages(s, s, coef=3.0)[0][0].abs().max() == 0
    t = [torch.randn(5, generator=torch.Generator().manual_seed(3))]
    one, two = reverse_kl_advantages(s, t, coef=1.0)[0][0], reverse_kl_advantages(s, t, coef=2.0)[0][0]
    assert torch.allclose(2 * one, two)
    with pytest.raises(ValueError, match="equal lengths"):
        reverse_kl_advantages(s, [torch.zeros(4)], coef=1.0)
    with pytest.raises(ValueError, match="discount"):
        reverse_kl_advantages(s, t, coef=1.0, discount=1.0)


def test_the_surrogate_takes_one_advantage_per_token_at_token_level():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(2, 3, generator=g) - 1, torch.randn(2, 3, generator=g) - 1
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    per_token = torch.randn(2, 3, generator=g)
    loss, _ = losses.clipped_surrogate(logp, old, per_token, mask, clip_low=0.2, clip_high=0.2)
    ratio = (logp - old).exp()
    want = -torch.minimum(ratio * per_token, ratio.clamp(0.8, 1.2) * per_token)
    assert torch.allclose(loss[mask.bool()], want[mask.bool()])
    # a constant row of per-token advantages is the sequence's advantage
    seq = torch.tensor([0.7, -0.3])
    a, _ = losses.clipped_surrogate(logp, old, seq, mask, clip_low=0.2, clip_high=0.2)
    b, _ = losses.clipped_surrogate(logp, old, seq[:, None].expand(2, 3), mask, clip_low=0.2, clip_high=0.2)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="level token"):
        losses.clipped_surrogate(logp, old, per_token, mask, clip_low=0.2, clip_high=0.2, level="sequence")


def _cfg(tmp_path, student, teacher, *extra):
    return tiny_config(tmp_path, student, "d", "task.name=reply_length", "algo.format_penalty=0",
                       f"models.teacher.path={teacher}", "models.teacher.trainable=false", *extra)


def test_config_rules_name_the_key_and_the_fix(tmp_path, tiny_model_dir):
    _register_reply_length_task()
    ok = _cfg(tmp_path, tiny_model_dir, tiny_model_dir, "algo.distill.teachers.solver=teacher")
    assert ok.algo.distill.teachers == {"solver": "teacher"}  # a teacher counts as a mapped model
    cases = {
        "algo.distill.teachers.solvr=teacher": "'solvr' is not an agent",
        "algo.distill.teachers.solver=techer": "did you mean 'teacher'",
        "algo.distill.teachers.solver=main": "the agent's own model",
        "loss.level=sequence": "set loss.level: token",
        "agents.solver.temperature=0.7": "agents.solver.temperature: 1.0",
        "models.teacher.trainable=true": "models.teacher.trainable: false",
        "algo.distill.coef=-1": "must be >= 0",
        "backend=ray": "needs backend: local",
    }
    for override, message in cases.items():
        extra = [override] if "teachers" in override else ["algo.distill.teachers.solver=teacher", override]
        with pytest.raises(ConfigError, match=message):
            _cfg(tmp_path, tiny_model_dir, tiny_model_dir, *extra)
    with pytest.raises(ConfigError, match="algo.distill options apply when"):
        tiny_config(tmp_path, tiny_model_dir, "d", "task.name=reply_length", "algo.distill.coef=0.5")


def test_the_stage_sets_minus_coef_times_the_log_ratio_on_the_agents_tokens(tokenizer):
    student, teacher = make_tiny_model(tokenizer, seed=0), make_tiny_model(tokenizer, seed=1)
    rows = make_rows(tokenizer, n=6)
    with torch.no_grad():
        ls, _, _ = response_logprobs(student, rows, temperature=1.0)
        lt, _, _ = response_logprobs(teacher, rows, temperature=1.0)
    for i, r in enumerate(rows):
        r.logprobs = ls[i, : len(r.response_ids)].tolist()
    before = [r.advantage for r in rows]
    metrics = Distill({"solver": teacher}, coef=2.0, rl_weight=0.5, row_tokens=40).apply(rows)  # several forwards
    d = []
    for i, r in enumerate(rows):
        n = len(r.response_ids)
        if r.agent != "solver":
            assert r.token_advantages is None and r.advantage == before[i]
            continue
        assert r.advantage == 0.5 * before[i]
        assert r.token_advantages == pytest.approx((-2.0 * (ls[i, :n] - lt[i, :n])).tolist(), abs=1e-5)
        d += (ls[i, :n] - lt[i, :n]).tolist()
    assert metrics["distill/solver/reverse_kl"] == pytest.approx(sum(d) / len(d), abs=1e-6)
    assert metrics["distill/solver/tokens"] == len(d) and "distill/verifier/reverse_kl" not in metrics
    same = Distill({"verifier": student}).apply(rows)  # the student as its own teacher: no term
    assert abs(same["distill/verifier/reverse_kl"]) < 1e-5


def test_a_run_distils_the_solver_and_leaves_the_teacher_and_the_verifier_alone(tmp_path, tokenizer, tiny_model_dir):
    """Distillation alone (rl_weight 0) on the solver, through the trainer: the teacher's weights stay, the student's
    move, every step logs the solver's reverse KL on its tokens and the verifier (not distilled) logs none."""
    _register_reply_length_task()
    teacher_dir = tmp_path / "teacher"
    _sharper(tokenizer, 5.0).save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    cfg = _cfg(tmp_path, tiny_model_dir, teacher_dir, "algo.distill.teachers.solver=teacher", "algo.distill.rl_weight=0",
               "train.steps=2", "train.save_every=0", "eval.before=false", "eval.after=false")
    tr = Trainer(cfg, progress=False)
    teacher, student = tr.runtime.teachers["teacher"], tr.models["main"]
    frozen = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    start = {n: p.detach().clone() for n, p in student.named_parameters()}
    tr.train()
    assert all(torch.equal(p, frozen[n]) for n, p in teacher.named_parameters())
    assert any(not torch.equal(p, start[n]) for n, p in student.named_parameters())
    metrics = [json.loads(line) for line in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["distill/solver/tokens"] > 0 and m["distill/solver/reverse_kl"] > 0 for m in metrics)
    assert all("distill/verifier/reverse_kl" not in m for m in metrics)
    # the teacher's forwards are the log-probs phase's, not the rollout's
    assert all(m["perf/logprobs/s"] == m["perf/advantage_terms_s"] > 0 for m in metrics)
    assert all(m["perf/rollout_s"] + m["perf/advantage_terms_s"] <= m["perf/step_s"] for m in metrics)
    assert (tmp_path / "d" / "checkpoints").is_dir()  # the weights are saved at the end


def _sharper(tokenizer, scale: float):
    """The tiny student (seed 0) at temperature 1 / ``scale``: the same model with its output layer scaled."""
    student = make_tiny_model(tokenizer, seed=0)
    sharp = make_tiny_model(tokenizer, seed=0, tie=False)
    sharp.load_state_dict(student.state_dict(), strict=False)
    with torch.no_grad():
        sharp.lm_head.weight.copy_(scale * student.get_input_embeddings().weight)
    return sharp


def test_the_learners_gradient_on_the_term_is_the_reverse_kls(tokenizer):
    """2,000 one-token replies sampled from the student at a prompt, the stage's term, the learner's gradient: it points
    along the exact gradient of KL(student || teacher) at that position (summed over the whole vocabulary), of which
    the term is the policy-gradient estimate (a noisy one: one sample per reply, no baseline)."""
    from teamrl.learner.learner import TorchLearner
    from teamrl.team.records import Step
    from tests.train.test_learner import settings

    student, teacher = make_tiny_model(tokenizer, seed=0), _sharper(tokenizer, 5.0)
    prompt = tokenizer.encode("question number 3 is")
    ls = student(input_ids=torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    with torch.no_grad():
        lt = teacher(input_ids=torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    (ls.exp() * (ls - lt)).sum().backward()
    exact = torch.cat([p.grad.flatten() for p in student.parameters()])
    student.zero_grad()
    ys = torch.multinomial(ls.detach().exp(), 2000, replacement=True, generator=torch.Generator().manual_seed(0))
    rows = [Step(prompt_index=0, episode=i, agent="solver", agent_call=0, model="m", prompt_ids=list(prompt),
                 response_ids=[int(y)], logprobs=[float(ls[y].detach())], temperature=1.0, text="", valid=True)
            for i, y in enumerate(ys)]
    Distill({"solver": teacher}, rl_weight=0.0).apply(rows)
    TorchLearner("m", student, settings(), {}).compute_gradients(rows)
    estimate = torch.cat([p.grad.flatten() for p in student.parameters()])
    cosine = float(torch.nn.functional.cosine_similarity(exact, estimate, dim=0))
    # ~0.16 from 2,000 samples; two unrelated directions among these 3.2 M weights have |cosine| ~ 1 / sqrt(3.2 M)
    assert cosine > 0.1 and exact.numel() > 3_000_000, cosine


@pytest.mark.slow  # two runs and a resume (about 20 s); the default run resumes every shipped workflow
def test_a_distilled_run_resumes_exactly(tmp_path, tokenizer, tiny_model_dir):
    """Two steps straight, or one step and a resume: the same weights and the same logged metrics (the teacher is
    loaded again from its path; the stage keeps no state)."""
    from tests.train.test_resume import assert_two_steps_resume_exactly

    _register_reply_length_task()
    teacher_dir = tmp_path / "teacher"
    _sharper(tokenizer, 5.0).save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)

    def cfg(run: str, steps: int):
        return tiny_config(tmp_path, tiny_model_dir, run, "task.name=reply_length", f"models.teacher.path={teacher_dir}",
                           "models.teacher.trainable=false", "algo.distill.teachers.solver=teacher",
                           f"train.steps={steps}", "eval.before=false", "eval.after=false")

    assert_two_steps_resume_exactly(cfg, tmp_path)


def test_a_teacher_behind_a_server_gives_the_in_process_teachers_terms(tokenizer, tmp_path, tiny_model_dir):
    """The same teacher weights served over HTTP (echoed prompt log-probs, engine: openai) and loaded in process give
    the same per-token terms; a server echoing other token ids is refused; a run with the served teacher asks it once
    per trained solver reply and logs the reverse KL."""
    from teamrl.engines.hf import HFEngine
    from teamrl.engines.openai import OpenAIEngine, OpenAIEngineError
    from tests.engines.openai_server import CompletionsServer

    class OtherIds(OpenAIEngine):  # a server whose tokenizer numbers the tokens otherwise
        def _post(self, body):
            out = super()._post(body)
            lp = out["choices"][0]["logprobs"]
            lp["tokens"] = [f"token_id:{int(t.split(':')[1]) + 1}" for t in lp["tokens"]]
            return out

    teacher = _sharper(tokenizer, 3.0)
    srv = CompletionsServer(HFEngine(teacher, tokenizer, seed=0))
    try:
        rows, local = make_rows(tokenizer, n=4, agents=("solver",)), make_rows(tokenizer, n=4, agents=("solver",))
        Distill({"solver": OpenAIEngine(srv.base_url, "tiny", tokenizer)}).apply(rows)
        Distill({"solver": teacher}).apply(local)
        for a, b in zip(rows, local):
            assert a.token_advantages == pytest.approx(b.token_advantages, abs=1e-4)
        with pytest.raises(OpenAIEngineError, match="echoed other tokens"):
            Distill({"solver": OtherIds(srv.base_url, "tiny", tokenizer)}).apply(make_rows(tokenizer, n=1))

        class NaNs(OpenAIEngine):  # a server answering NaN for the last prompt token of every second row
            calls = 0

            def _post(self, body):
                out = super()._post(body)
                NaNs.calls += 1
                if NaNs.calls % 2 == 0:
                    out["choices"][0]["logprobs"]["token_logprobs"][-2] = float("nan")
                return out

        bad = make_rows(tokenizer, n=4, agents=("solver",))
        before = [r.advantage for r in bad]
        m = Distill({"solver": NaNs(srv.base_url, "tiny", tokenizer, concurrency=1)}).apply(bad)
        assert m["distill/solver/refused"] == 2 and math.isfinite(m["distill/solver/reverse_kl"])
        assert [r.token_advantages is None for r in bad] == [False, True, False, True]
        assert [r.advantage for r in bad][1::2] == before[1::2]  # a refused reply keeps its RL advantage alone

        _register_reply_length_task()
        cfg = tiny_config(tmp_path, tiny_model_dir, "served", "task.name=reply_length",
                          f"models.teacher={{path: {tiny_model_dir}, engine: openai, trainable: false, "
                          f"openai: {{base_url: '{srv.base_url}', model: tiny}}}}",
                          "algo.distill.teachers.solver=teacher", "train.steps=1", "eval.before=false",
                          "eval.after=false", "train.transcripts_per_step=6")  # every episode recorded
        n = len(srv.requests)
        tr = Trainer(cfg, progress=False)
        assert "teacher" in tr.runtime.teachers and "teacher" not in tr.engines
        tr.train()
        episodes = [json.loads(line) for line in (tmp_path / "served" / "episodes.jsonl").read_text().splitlines()]
        solver_replies = sum(t["agent"] == "solver" for ep in episodes for t in ep["turns"])
        assert sum(bool(r.get("echo")) for r in srv.requests[n:]) == solver_replies > 0
        metrics = json.loads((tmp_path / "served" / "metrics.jsonl").read_text().splitlines()[0])
        assert metrics["distill/solver/reverse_kl"] > 0
    finally:
        srv.close()


def test_packed_rows_with_shared_prefixes_give_the_padded_terms(tokenizer):
    """The teacher's forward as the learner's (rows packed, common prefixes once) gives the padded layout's terms;
    under bf16 autocast, to bf16's precision."""
    teacher = _sharper(tokenizer, 3.0)
    rows = make_rows(tokenizer, n=6, agents=("solver",))
    for r in rows[1:3]:  # replies to one prompt: a prefix to share
        r.prompt_ids = list(rows[0].prompt_ids)
    padded, packed, bf16 = (make_rows(tokenizer, n=6, agents=("solver",)) for _ in range(3))
    for copy in (padded, packed, bf16):
        for r, src in zip(copy, rows):
            r.prompt_ids = list(src.prompt_ids)
    Distill({"solver": teacher}).apply(padded)
    Distill({"solver": teacher}, pack=(True, True, False), row_tokens=60).apply(packed)  # several micro-batches
    Distill({"solver": teacher}, pack=(True, True, True)).apply(bf16)
    for a, b, c in zip(padded, packed, bf16):
        assert b.token_advantages == pytest.approx(a.token_advantages, abs=1e-4)
        assert c.token_advantages == pytest.approx(a.token_advantages, abs=0.1)
