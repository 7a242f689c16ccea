"""Tests for the math task: row mapping, loading, answer extraction and scoring.

The real-data tests read the benchmark files next to the repository
(``<repo>/../shared/data``, or the folder named by ``TEAMRL_DATA``) and skip
when that folder is absent.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest

import teamrl.domains.math.math as math_task
import teamrl.tasks.grading as grading
from teamrl.domains.math.math import MathConfig, MathTask, gold_answer, grade_answer, last_boxed
from teamrl.tasks.base import Problem, build_task

DATA_DIR = Path(os.environ.get("TEAMRL_DATA") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"benchmark data folder {DATA_DIR} is absent")

# Rows of math_train/train.json whose "answer" is null or empty (rows 887, 1010, 5329, 5331).
MATH_TRAIN_ROWS_WITHOUT_ANSWER = 4


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _source_rows(folder: str, file: str) -> int:
    """Row count of ``file`` as stated in ``folder/SOURCE.md``."""
    text = (DATA_DIR / folder / "SOURCE.md").read_text(encoding="utf-8")
    match = re.search(rf"^\|\s*`{re.escape(file)}`\s*\|\s*(\d+)\s*\|", text, flags=re.MULTILINE)
    assert match, f"no row count for {file} in {folder}/SOURCE.md"
    return int(match.group(1))


# --------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("so \\boxed{1} no wait \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("$\\boxed {x^{2}+1}$", "x^{2}+1"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5 is it", "5"),
        ("\\boxed{3} then cut off \\boxed{4", "3"),
        ("The answer is 1,234.", "1234"),
        ("-7", "-7"),
        ("no number", None),
        ("3 + 4 = 7", "7"),
        ("total: \\boxed{104.}", "104"),
        ("\\boxed{}", None),
    ],
)
def test_extract_answer(reply: str, expected: str | None) -> None:
    task = MathTask(MathConfig(test_path="unused.jsonl"))
    assert task.extract_answer(reply) == expected


def test_boxed_only_answers_without_the_last_number_fallback() -> None:
    task = MathTask(MathConfig(test_path="unused.jsonl", answer_fallback="none"))
    assert task.extract_answer("The answer is 1,234.") is None and task.extract_answer("so \\boxed{12}.") == "12"
    assert task.score(Problem(id="p", question="q", answer="1234"), "The answer is 1234") == 0.0


def test_test_answer_key_reads_the_test_split_from_its_own_field(tmp_path) -> None:
    """Dr. MAS's train rows keep the answer in reward_model.ground_truth, its evaluation sets in answer."""
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(json.dumps({"problem": "1+1?", "reward_model": {"ground_truth": "2"}}) + "\n")
    test.write_text(json.dumps({"problem": "2+2?", "answer": "4"}) + "\n")
    task = MathTask(MathConfig(train_path=str(train), test_path=str(test), answer_key="reward_model.ground_truth",
                               test_answer_key="answer"))
    assert task.problems("train")[0].answer == "2" and task.problems("test")[0].answer == "4"
    with pytest.raises(ValueError, match="answer"):
        MathTask(MathConfig(test_path=str(test), answer_key="reward_model.ground_truth")).problems("test")


def test_last_boxed_none_without_box() -> None:
    assert last_boxed("just text 42") is None
    assert last_boxed("\\boxed{unclosed") is None


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("answer", "She makes 9 * 2 = $18.\n#### 18", "18"),
        ("answer", "#### 1,080", "1080"),
        ("answer", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("answer", 70, "70"),
        ("answer", 27.0, "27"),
        ("answer", 2.5, "2.5"),
        ("final_answer", ["$2n$", "$3n$"], "$2n$"),
        (
            "solution",
            "Hence $\\boxed{\\frac{a}{b}}$ and \\boxed{\\dfrac{1}{\\sqrt{2}}}.",
            "\\dfrac{1}{\\sqrt{2}}",
        ),
        ("solution", ["no box here", "so \\boxed{9}"], "9"),
        ("reward_model.ground_truth", "72", "72"),
    ],
)
def test_gold_answer_layouts(key: str, value: Any, expected: str) -> None:
    assert gold_answer(key, value) == expected


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("answer", None, "NoneType"),
        ("answer", "  ", "empty"),
        ("solution", "no box", "no \\\\boxed"),
        ("answer", [], "empty list"),
    ],
)
def test_gold_answer_rejects_unusable_values(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gold_answer(key, value)


# --------------------------------------------------------------------------- loading


@needs_data
@pytest.mark.parametrize(
    ("folder", "file", "split", "first_answer"),
    [
        ("gsm8k", "train.jsonl", "train", "72"),
        ("gsm8k", "test.jsonl", "test", "18"),
        ("math500", "test.jsonl", "test", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("aime24", "test.jsonl", "test", "204"),
        ("aime25", "test.jsonl", "test", "70"),
        ("amc23", "test.jsonl", "test", "27"),
        ("olympiadbench", "test.jsonl", "test", "2"),
        ("aime_1983_2023", "train.json", "train", "60"),
    ],
)
def test_real_dataset_loads_every_row(folder: str, file: str, split: str, first_answer: str) -> None:
    task = MathTask({f"{split}_path": str(DATA_DIR / folder / file)})
    problems = task.problems(split)
    assert len(problems) == _source_rows(folder, file)
    assert len({p.id for p in problems}) == len(problems)
    assert all(p.question and p.answer for p in problems)
    first = min(problems, key=lambda p: p.meta["row"])
    assert first.meta["row"] == 1 and first.answer == first_answer
    for p in problems[:3]:
        assert task.score(p, f"Therefore the answer is $\\boxed{{{p.answer}}}$.") == 1.0


@needs_data
def test_math_train_needs_skip_bad_rows(caplog: pytest.LogCaptureFixture) -> None:
    path = DATA_DIR / "math_train" / "train.json"
    with pytest.raises(
        ValueError,
        match=r"train\.json row 887: .*'answer' is NoneType.*"
        r"keys present: \['answer', 'difficulty', 'problem', 'type'\].*skip_bad_rows",
    ):
        MathTask({"train_path": str(path)}).problems("train")
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        problems = MathTask({"train_path": str(path), "skip_bad_rows": True}).problems("train")
    assert len(problems) == _source_rows("math_train", "train.json") - MATH_TRAIN_ROWS_WITHOUT_ANSWER
    skips = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skips) == 1 and f"skipped {MATH_TRAIN_ROWS_WITHOUT_ANSWER} bad row(s)" in skips[0].getMessage()


@needs_data
def test_olympiadbench_uses_final_answer_not_solution() -> None:
    problems = MathTask({"test_path": str(DATA_DIR / "olympiadbench" / "test.jsonl")}).problems("test")
    by_row = {p.meta["row"]: p for p in problems}
    assert by_row[1].answer == "2"
    assert isinstance(by_row[1].meta["fields"]["solution"], list)


def test_bad_row_error_names_file_line_and_keys(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "hint": "even"}],
    )
    with pytest.raises(ValueError) as info:
        MathTask({"test_path": str(path)}).problems("test")
    message = str(info.value)
    assert str(path) in message and "line 2" in message
    assert "no answer field (looked for answer, final_answer, solution)" in message
    assert "keys present: ['hint', 'question']" in message


def test_skip_bad_rows_counts_skips(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows: list[Any] = [
        {"problem": "a?", "answer": "1"},
        {"problem": 5, "answer": "2"},
        "{not json",
        [1, 2],
        {"problem": "b?", "solution": "\\boxed{3}"},
    ]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="teamrl.domains.math.math"):
        problems = MathTask({"test_path": str(path), "skip_bad_rows": True}).problems("test")
    assert [(p.question, p.answer) for p in problems] == [("a?", "1"), ("b?", "3")]
    assert [p.id for p in problems] == ["test-0", "test-4"]
    assert sum("skipped 3 bad row(s)" in r.getMessage() for r in caplog.records) == 1


def test_invalid_json_line_is_a_bad_row(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "a?", "answer": "1"}, "{oops"])
    with pytest.raises(ValueError, match=r"line 2: invalid JSON"):
        MathTask({"test_path": str(path)}).problems("test")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "test.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        MathTask({"test_path": str(missing)}).problems("test")


def test_unsupported_suffix_and_non_list_json(tmp_path: Path) -> None:
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unsupported data file .*\.jsonl, \.json, \.parquet"):
        MathTask({"test_path": str(csv)}).problems("test")
    obj = tmp_path / "d.json"
    obj.write_text(json.dumps({"data": []}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"holds an object with keys \['data'\], expected a list"):
        MathTask({"test_path": str(obj)}).problems("test")


def test_json_list_and_jsonl_named_json(tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"prompt": "p?", "final_answer": ["4"]}]), encoding="utf-8")
    assert MathTask({"test_path": str(listed)}).problems("test")[0].answer == "4"
    lines = _write_jsonl(tmp_path / "lines.json", [{"question": "q?", "answer": 1}, {"question": "r?", "answer": 2}])
    assert [p.answer for p in MathTask({"test_path": str(lines)}).problems("test")] == ["1", "2"]


def test_key_overrides_dotted_keys_and_chat_prompts(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "What is 6*7?"},
            ],
            "reward_model": {"ground_truth": "42"},
            "question": "ignored",
        }
    ]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    task = MathTask(
        {
            "test_path": str(path),
            "question_key": "prompt",
            "answer_key": "reward_model.ground_truth",
        }
    )
    (problem,) = task.problems("test")
    assert (problem.question, problem.answer) == ("What is 6*7?", "42")
    with pytest.raises(ValueError, match=r"no question field \(looked for 'query'\)"):
        MathTask({"test_path": str(path), "question_key": "query"}).problems("test")


def test_train_shuffle_by_seed_and_limits(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(50)])
    cfg = {"train_path": str(path), "test_path": str(path)}
    a = MathTask({**cfg, "seed": 1}).problems("train")
    assert [p.id for p in a] == [p.id for p in MathTask({**cfg, "seed": 1}).problems("train")]
    assert [p.id for p in a] != [p.id for p in MathTask({**cfg, "seed": 2}).problems("train")]
    assert sorted(p.id for p in a) == sorted(f"train-{i}" for i in range(50))
    assert [p.id for p in MathTask({**cfg, "seed": 1, "limit_train": 5}).problems("train")] == [p.id for p in a[:5]]
    test = MathTask({**cfg, "seed": 9, "limit_test": 4}).problems("test")
    assert [p.answer for p in test] == ["0", "1", "2", "3"]


def test_split_and_config_errors(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "1"}])
    task = MathTask({"test_path": str(path)})
    with pytest.raises(ValueError, match="no train_path"):
        task.problems("train")
    with pytest.raises(ValueError, match="unknown split 'val'"):
        task.problems("val")
    with pytest.raises(ValueError, match="set train_path and/or test_path"):
        build_task("math", None)
    with pytest.raises(ValueError, match="grade_backend='thread'"):
        MathTask({"test_path": str(path), "grade_backend": "thread"})
    with pytest.raises(ValueError, match="grade_timeout_s=0"):
        MathTask({"test_path": str(path), "grade_timeout_s": 0})


def test_parquet_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"problem": "x?", "answer": "3"}, {"problem": "y?", "answer": "4"}]),
        path,
    )
    assert [p.answer for p in MathTask({"test_path": str(path)}).problems("test")] == ["3", "4"]


def test_datasets_local_folder_and_saved_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    folder = tmp_path / "gsm_like"
    folder.mkdir()
    _write_jsonl(
        folder / "train.jsonl",
        [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}],
    )
    _write_jsonl(folder / "test.jsonl", [{"question": "3+3?", "answer": "#### 6"}])
    task = MathTask({"train_path": str(folder), "test_path": str(folder)})
    assert sorted(p.answer for p in task.problems("train")) == ["2", "4"]
    assert [p.answer for p in task.problems("test")] == ["6"]

    saved = tmp_path / "saved"
    split = datasets.Dataset.from_list([{"problem": "x?", "solution": "so \\boxed{\\frac{1}{2}}"}])
    datasets.DatasetDict({"validation": split}).save_to_disk(str(saved))
    task = MathTask({"test_path": str(saved), "test_split": "validation"})
    assert [p.answer for p in task.problems("test")] == ["\\frac{1}{2}"]
    with pytest.raises(ValueError, match=r"has splits \['validation'\], not 'test'"):
        MathTask({"test_path": str(saved)}).problems("test")


def test_datasets_missing_gives_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_datasets(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "datasets":
            raise ImportError("No module named 'datasets'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(ImportError, match=r"pip install .teamrl\[hf-datasets\]."):
        MathTask({"test_path": "openai/gsm8k"}).problems("test")


# --------------------------------------------------------------------------- scoring


def test_score_end_to_end() -> None:
    task = MathTask(MathConfig(test_path="unused.jsonl"))
    problem = Problem(id="p", question="Half of one?", answer="\\frac{1}{2}")
    assert task.score(problem, "It is one half, so \\boxed{0.5}.") == 1.0
    assert task.score(problem, "It is \\boxed{\\dfrac{1}{2}}") == 1.0
    assert task.score(problem, "It is \\boxed{2}") == 0.0
    assert task.score(problem, "no idea") == 0.0


def test_grading_names_are_reexported() -> None:
    assert math_task.grade_answer is grading.grade_answer
    assert grade_answer is grading.grade_answer
    assert math_task.GRADE_BACKENDS is grading.GRADE_BACKENDS
