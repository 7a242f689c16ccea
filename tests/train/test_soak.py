"""A long tiny run stays flat: resident memory, open files, threads, child processes and the run folder's
checkpoints stop growing after a warm-up (the checkpoints pruned by train.keep_checkpoints, memory given back
between phases by train.release_memory), by the bounds of teamrl.metrics.soak. The runs are benchmarks/soak.py's,
shorter: the math team for 10 and 30 steps, and the code team (coder + tester) for 12 steps with a tiny model that
writes a program in every reply, so each step runs programs in the sandbox, whose processes must all be gone
between steps. All are ``-m slow`` (CI's slow run); ``python benchmarks/soak.py`` runs hundreds of steps
(docs/results/soak.md)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading

import pytest

from teamrl.metrics.soak import assert_flat, sample
from teamrl.tasks.grading import grade_answer
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def _bench():
    spec = importlib.util.spec_from_file_location("benchmarks_soak", REPO / "benchmarks" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


@pytest.mark.slow  # about 10 s (30 on a loaded machine); test_a_long_run_stays_flat below is its longer form
def test_a_short_run_stays_flat(tmp_path, tiny_model_dir):
    assert_flat(BENCH.soak("math", tmp_path / "run", str(tiny_model_dir), 10))


@pytest.mark.slow
def test_a_long_run_stays_flat(tmp_path, tiny_model_dir):
    assert_flat(BENCH.soak("math", tmp_path / "run", str(tiny_model_dir), 30))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_code_team_run_stays_flat_with_the_sandbox_running_every_step(tmp_path, tokenizer):
    model_dir = tmp_path / "model"
    BENCH.program_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    # The math grading helpers are long-lived children of this process (teamrl.tasks.grading_worker): an earlier
    # test that graded off the main thread leaves them. One is started here, so the count below is the sandbox's
    # alone whichever tests ran before.
    grading = threading.Thread(target=grade_answer, args=("x+1", "1+x"))  # off the main thread: in a helper
    grading.start()
    grading.join()
    before = sample(tmp_path)["children"]
    assert before >= 1, "no grading helper started"
    samples = BENCH.soak("code", tmp_path / "run", str(model_dir), 12)
    runs = [s["sandbox_runs"] for s in samples]
    assert all(b > a for a, b in zip([0.0, *runs], runs)), f"a step ran no program in the sandbox: {runs}"
    # every run's processes are gone when the step ends: no child beyond the helpers there before
    assert max(s["children"] for s in samples) == before, [s["children"] for s in samples]
    assert_flat(samples)


def test_the_wired_model_answers_with_a_program(tokenizer):
    """The code soak's model writes ```python\\n\\nprint(D) and ends its turn, whatever the prompt."""
    from teamrl.domains.code.code import extract_code

    model = BENCH.program_model(tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": "You write unit tests."},
                                            {"role": "user", "content": "Write add_7(x).\n```python\nx\n```"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=16, do_sample=True, temperature=0.7, num_return_sequences=4)
    replies = tokenizer.batch_decode(out[:, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert all(extract_code(r) is not None and extract_code(r).strip() in {f"print({d})" for d in range(10)}
               for r in replies), replies
