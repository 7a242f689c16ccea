"""Small data sets ``--smoke`` writes for itself, so a recipe's one-step CPU variant needs nothing but the package.

* math: arithmetic word problems in MATH's layout (``problem``, a worked ``solution`` ending in ``\\boxed{}``), read
  by the math task and graded as MATH-500's answers are;
* search: questions over made-up places in HotpotQA's distractor layout (``question``, ``answer``, ``context`` with
  titled paragraphs, one of them holding the answer), searched with BM25 in-process.

Each is generated from a fixed seed and written once under ``$TEAMRL_CACHE/smoke`` (default
``~/.cache/teamrl/smoke``); the files are the same on every machine. They check that a recipe's task, workflow and
update run end to end, not what a model learns.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

_SYLLABLES = ("ka", "lo", "ven", "mar", "tis", "dor", "bel", "run", "zi", "qua", "nor", "pel")
_KINDS = (("river", "flows through"), ("town", "lies in"), ("castle", "stands in"), ("lake", "is found in"))


def smoke_dir() -> Path:
    """``$TEAMRL_CACHE/smoke`` (default ``~/.cache/teamrl/smoke``)."""
    root = os.environ.get("TEAMRL_CACHE") or str(Path.home() / ".cache" / "teamrl")
    return Path(root) / "smoke"


def _write(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # a concurrent smoke run reads the whole file or the old one
    return path


def math_rows(n: int, seed: int) -> list[dict]:
    """``n`` arithmetic problems with worked solutions in MATH's layout.

    >>> math_rows(1, 0)[0]["solution"].endswith("\\\\boxed{" + str(math_rows(1, 0)[0]["answer"]) + "}$.")
    True
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
        value = (a + b) * c
        rows.append({"problem": f"Compute $({a} + {b}) \\times {c}$.",
                     "solution": f"First $({a} + {b}) = {a + b}$, then ${a + b} \\times {c} = \\boxed{{{value}}}$.",
                     "answer": str(value)})
    return rows


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()


def search_rows(n: int, seed: int, distractors: int = 3) -> list[dict]:
    """``n`` questions over made-up places, each with its answer's paragraph among ``distractors`` others.

    >>> r = search_rows(1, 0)[0]
    >>> any(r["answer"] in " ".join(s) for s in r["context"]["sentences"])
    True
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        titles, sentences = [], []
        facts = [(_name(rng), *rng.choice(_KINDS), _name(rng)) for _ in range(distractors + 1)]
        for place, kind, verb, region in facts:
            titles.append(place)
            sentences.append([f"{place} is a {kind} that {verb} the region of {region}.",
                              f" It is known for its {rng.choice(('bridges', 'markets', 'orchards', 'mills'))}."])
        place, kind, verb, region = facts[0]
        order = list(range(len(facts)))
        rng.shuffle(order)
        rows.append({"id": f"smoke-{seed}-{i}", "question": f"Which region does the {kind} {place} belong to?",
                     "answer": region, "context": {"title": [titles[j] for j in order],
                                                   "sentences": [sentences[j] for j in order]}})
    return rows


def math_files(root: Path | None = None) -> tuple[Path, Path]:
    """(train, test) math files, written if missing: 16 and 4 problems."""
    root = root or smoke_dir()
    return _write(root / "math" / "train.jsonl", math_rows(16, 0)), _write(root / "math" / "test.jsonl", math_rows(4, 1))


def search_files(root: Path | None = None) -> tuple[Path, Path]:
    """(train, test) search files, written if missing: 16 and 4 questions."""
    root = root or smoke_dir()
    return (_write(root / "search" / "train.jsonl", search_rows(16, 0)),
            _write(root / "search" / "test.jsonl", search_rows(4, 1)))
