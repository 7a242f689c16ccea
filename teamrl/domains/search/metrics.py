"""Answer metrics of open-domain QA: exact match, token F1 and substring match.

Answers are normalised as in the SQuAD evaluation script (and Search-R1, FlashRAG): lower-case,
punctuation removed, the articles a/an/the removed, whitespace collapsed. Every metric is the
maximum over the gold answers. Metrics are registered by name in ``METRICS``.

Left out: answer-type rules (numbers, dates, yes/no variants) beyond that normalisation.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["METRICS", "exact_match", "f1", "normalize_answer", "substring_em"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)

Metric = Callable[[str, Sequence[str]], float]
METRICS: dict[str, Metric] = {}
"""Registered metrics: (prediction, gold answers) -> score in [0, 1]."""


def register_metric(name: str) -> Callable[[Metric], Metric]:
    def deco(fn: Metric) -> Metric:
        if name in METRICS:
            raise ValueError(f"metric {name!r} is already registered")
        METRICS[name] = fn
        return fn

    return deco


def normalize_answer(text: str) -> str:
    """SQuAD normalisation.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


@register_metric("em")
def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer.

    >>> exact_match("the Beatles.", ["Beatles", "The Rolling Stones"])
    1.0
    """
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


@register_metric("substring_em")
def substring_em(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if a normalised gold answer occurs inside the normalised prediction (Search-R1's subEM:
    a plain substring test, so "Parisian" contains "paris"; an empty gold matches nothing).

    >>> substring_em("It was Paris, France", ["paris"])
    1.0
    >>> substring_em("Lyon", ["paris"])
    0.0
    """
    pred = normalize_answer(prediction)
    return float(any(gold and gold in pred for gold in map(normalize_answer, golds)))


def _f1_one(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@register_metric("f1")
def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-overlap F1 between normalised prediction and gold, maximised over golds.

    >>> round(f1("the big red dog", ["red dog"]), 4)
    0.8
    """
    pred = normalize_answer(prediction).split()
    return max((_f1_one(pred, normalize_answer(g).split()) for g in golds), default=0.0)
