"""Procedurally generated code task ("pyfunc"): small Python functions specified in words, hidden tests.

Each problem asks for one function (name, signature, one sentence, and by default one worked
example) drawn from the templates of difficulty ``<= difficulty``:

* 1: one operation on one or two values (add a constant, square, parity, larger of two, repeat a
  string, first element, upper case, last character);
* 2: one loop over a list or string (sum, count above a threshold, scale each, reverse, vowels,
  maximum, keep evens, digit sum);
* 3: a loop with state or two steps (sum of squares of evens, indices above a threshold, word count,
  n-th Fibonacci number, palindrome test, second largest distinct, running sums, longest run).

A problem is a template plus its constant (the 7 in "add 7"). The test split is ``n_test``
problems from a generator seeded with ``seed``, the train split ``n_train`` from a second stream;
with ``holdout_constants`` (default) the two use disjoint constants of each template that has
several, so held-out problems ask for functions never trained on (templates without a constant
appear in both, with different hidden tests). Hidden tests are ``n_tests`` argument tuples drawn per problem, with expected values computed here by
the template's reference function (trusted code, run in this process; only the model's program
runs in the sandbox); a problem's ``answer`` (the gold of transcripts) lists them. Scoring: see
:mod:`teamrl.domains.code.code_task`.

Left out: problems needing imports, classes or input/output; partial specifications.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from teamrl.domains.code.code import CallTests, CodeProblem
from teamrl.domains.code.code_task import ANSWER_FORMAT, CodeScoring, CodeTaskBase
from teamrl.tasks.base import Problem, check_split, config_from, register_task


def smoke_as_pyfunc(cfg: Any) -> list[str]:
    """``--smoke`` of a code task that reads files or a dataset: the procedural ``pyfunc`` task instead. pyfunc's
    answers are signatures, not reference programs: a ``code_team`` tester scored against the reference (its
    default) is scored on the coder's program instead."""
    fix = ["workflow.code_team.tester_reward=generated"] if cfg.workflow.name == "code_team" else []
    return ["task.name=pyfunc", "task.pyfunc.n_test=2", "task.pyfunc.n_tests=2", *fix]

__all__ = ["TEMPLATES", "PyFuncConfig", "PyFuncTask", "Template", "make_problem"]

Rng = random.Random


def _ints(r: Rng, n: int = 6, lo: int = -9, hi: int = 20) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(1, n))]


def _word(r: Rng) -> str:
    return "".join(r.choice("abcdeilmnorstu") for _ in range(r.randint(1, 7)))


@dataclass(frozen=True)
class Template:
    """One kind of function: its level, name, parameters, text, reference and argument generator."""

    level: int
    name: str
    """Function name; ``{k}`` is replaced by the constant."""
    params: str
    """Parameter list, e.g. "x" or "xs, k"."""
    text: str
    """What it returns, in words; ``{k}`` is replaced by the constant."""
    constants: tuple[int, ...]
    """Values the constant takes ((0,) when there is none)."""
    ref: Callable[..., Any]
    """Reference: ``ref(k, *args)``."""
    args: Callable[[Rng], tuple[Any, ...]]
    """Draws one argument tuple."""


_NUM = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _longest_run(xs: list[int]) -> int:
    best = run = 0
    for i, x in enumerate(xs):
        run = run + 1 if i and x == xs[i - 1] else 1
        best = max(best, run)
    return best


TEMPLATES: tuple[Template, ...] = (
    Template(1, "add_{k}", "x", "x plus {k}", tuple(range(2, 10)), lambda k, x: x + k, lambda r: (r.randint(-50, 50),)),
    Template(1, "times_{k}", "x", "x multiplied by {k}", tuple(range(2, 10)), lambda k, x: x * k,
             lambda r: (r.randint(-30, 30),)),
    Template(1, "square", "x", "x squared", (0,), lambda k, x: x * x, lambda r: (r.randint(-20, 20),)),
    Template(1, "is_even", "x", "True if x is even, else False", (0,), lambda k, x: x % 2 == 0,
             lambda r: (r.randint(-40, 40),)),
    Template(1, "larger", "a, b", "the larger of a and b", (0,), lambda k, a, b: max(a, b),
             lambda r: (r.randint(-30, 30), r.randint(-30, 30))),
    Template(1, "repeat_{k}", "s", "the string s repeated {k} times", tuple(range(2, 6)), lambda k, s: s * k,
             lambda r: (_word(r),)),
    Template(1, "first", "xs", "the first element of the non-empty list xs", (0,), lambda k, xs: xs[0],
             lambda r: (_ints(r),)),
    Template(1, "shout", "s", "the string s in upper case", (0,), lambda k, s: s.upper(), lambda r: (_word(r),)),
    Template(2, "total", "xs", "the sum of the numbers in the list xs (0 for an empty list)", (0,),
             lambda k, xs: sum(xs), lambda r: (_ints(r) if r.random() < 0.9 else [],)),
    Template(2, "count_above_{k}", "xs", "how many numbers in the list xs are greater than {k}", tuple(range(0, 10)),
             lambda k, xs: sum(x > k for x in xs), lambda r: (_ints(r, 8),)),
    Template(2, "scale_{k}", "xs", "a new list with every number of the list xs multiplied by {k}",
             tuple(range(2, 10)), lambda k, xs: [x * k for x in xs], lambda r: (_ints(r),)),
    Template(2, "reverse", "s", "the string s reversed", (0,), lambda k, s: s[::-1], lambda r: (_word(r),)),
    Template(2, "vowels", "s", "how many vowels (a, e, i, o, u) the lower-case string s has", (0,),
             lambda k, s: sum(c in "aeiou" for c in s), lambda r: (_word(r),)),
    Template(2, "largest", "xs", "the largest number in the non-empty list xs", (0,), lambda k, xs: max(xs),
             lambda r: (_ints(r),)),
    Template(2, "evens", "xs", "the even numbers of the list xs, in their order", (0,),
             lambda k, xs: [x for x in xs if x % 2 == 0], lambda r: (_ints(r, 8),)),
    Template(2, "digit_sum", "n", "the sum of the decimal digits of the non-negative integer n", (0,),
             lambda k, n: sum(map(int, str(n))), lambda r: (r.randint(0, 99999),)),
    Template(3, "even_squares", "xs", "the sum of the squares of the even numbers in the list xs", (0,),
             lambda k, xs: sum(x * x for x in xs if x % 2 == 0), lambda r: (_ints(r, 8),)),
    Template(3, "where_above_{k}", "xs", "the list of indices i where xs[i] is greater than {k}", tuple(range(0, 10)),
             lambda k, xs: [i for i, x in enumerate(xs) if x > k], lambda r: (_ints(r, 8),)),
    Template(3, "word_count", "s", "how many words (separated by spaces) the string s has", (0,),
             lambda k, s: len(s.split()), lambda r: (" ".join(_word(r) for _ in range(r.randint(0, 5))),)),
    Template(3, "fib", "n", "the n-th Fibonacci number, with fib(0) = 0 and fib(1) = 1", (0,), lambda k, n: _fib(n),
             lambda r: (r.randint(0, 25),)),
    Template(3, "is_palindrome", "s", "True if the string s reads the same backwards, else False", (0,),
             lambda k, s: s == s[::-1], lambda r: ((w := _word(r)) + w[::-1][r.randint(0, 1):] if r.random() < 0.5
                                                  else _word(r),)),
    Template(3, "second_largest", "xs", "the second largest distinct number in xs (a list with at least two "
             "distinct numbers)", (0,), lambda k, xs: sorted(set(xs))[-2],
             lambda r: ([*_ints(r), 21, 22],)),
    Template(3, "running_sums", "xs", "the list of running sums of xs (element i is xs[0] + ... + xs[i])", (0,),
             lambda k, xs: [sum(xs[: i + 1]) for i in range(len(xs))], lambda r: (_ints(r),)),
    Template(3, "longest_run", "xs", "the length of the longest run of equal neighbouring numbers in the "
             "list xs (0 for an empty list)", (0,), lambda k, xs: _longest_run(xs),
             lambda r: ([r.randint(0, 2) for _ in range(r.randint(0, 9))],)),
)
"""Every template; ``difficulty`` keeps those with ``level <= difficulty``."""


@dataclass(kw_only=True)
class PyFuncConfig(CodeScoring):
    """Options of the procedural code task."""

    difficulty: int = 1
    """Highest template level used: 1 (one operation), 2 (one loop), 3 (loops with state)."""
    n_test: int = 100
    """Size of the held-out test split."""
    n_train: int = 1000
    """Training problems drawn."""
    n_tests: int = 5
    """Hidden tests per problem."""
    show_example: bool = True
    """Show one example call and its result in the problem text (it is not one of the hidden tests)."""
    holdout_constants: bool = True
    """Templates with several constants use the upper half of them in the test split and the lower
    half in training ("add 6".."add 9" held out, "add 2".."add 5" trained on); templates without a
    constant appear in both splits with different hidden tests."""
    seed: int = 0
    """Seed of the test split, the train split and the tests."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.difficulty not in (1, 2, 3):
            raise ValueError(f"difficulty {self.difficulty} must be 1, 2 or 3")
        if self.n_test < 0 or self.n_train < 0:
            raise ValueError(f"n_test={self.n_test} and n_train={self.n_train} must be >= 0")
        if self.n_tests < 1:
            raise ValueError(f"n_tests {self.n_tests} must be >= 1")


def _call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def make_problem(template: Template, k: int, rng: Rng, *, pid: str, n_tests: int, show_example: bool) -> Problem:
    """One problem of ``template`` with constant ``k``; tests drawn from ``rng``.

    >>> p = make_problem(TEMPLATES[0], 7, random.Random(0), pid="x", n_tests=2, show_example=False)
    >>> p.question.splitlines()[0], p.meta["code"].tests.asserts[0].startswith("assert add_7(")
    ('Write a Python function add_7(x) that returns x plus 7.', True)
    """
    name = template.name.format(k=k)
    text = template.text.format(k=k)
    calls = [template.args(rng) for _ in range(n_tests + 1)]
    asserts = tuple(f"assert {_call(name, a)} == {template.ref(k, *a)!r}" for a in calls[1:])
    question = f"Write a Python function {name}({template.params}) that returns {text}."
    if show_example:
        question += f"\nExample: {_call(name, calls[0])} returns {template.ref(k, *calls[0])!r}."
    code = CodeProblem(pid, question, CallTests(asserts), entry_point=name)
    return Problem(pid, question, "\n".join(asserts), {"code": code, "template": template.name, "k": k,
                                                      "level": template.level})


@register_task("pyfunc", config=PyFuncConfig)
class PyFuncTask(CodeTaskBase):
    """Small functions specified in words, with hidden tests; difficulty 1 to 3."""

    name = "pyfunc"
    answer_format = ANSWER_FORMAT

    def __init__(self, cfg: PyFuncConfig | dict | None = None) -> None:
        self.cfg: PyFuncConfig = config_from(PyFuncConfig, cfg)
        self._templates = [t for t in TEMPLATES if t.level <= self.cfg.difficulty]
        self._splits: dict[str, list[Problem]] = {}

    def _pairs(self, split: str) -> list[tuple[Template, int]]:
        """The (template, constant) pairs ``split`` draws from (see ``holdout_constants``)."""
        pairs = []
        for t in self._templates:
            ks = t.constants
            if self.cfg.holdout_constants and len(ks) > 1:
                ks = ks[len(ks) // 2:] if split == "test" else ks[: len(ks) // 2]
            pairs += [(t, k) for k in ks]
        return pairs

    def problems(self, split: str) -> list[Problem]:
        """``n_test`` held-out or ``n_train`` training problems (fixed by ``seed``)."""
        if check_split(split) not in self._splits:
            rng = random.Random(f"pyfunc-{self.cfg.seed}-{split}")
            pairs = self._pairs(split)
            n = self.cfg.n_test if split == "test" else self.cfg.n_train
            out = []
            for i in range(n):
                template, k = rng.choice(pairs)
                out.append(make_problem(template, k, rng, pid=f"pyfunc-{split}-{i}", n_tests=self.cfg.n_tests,
                                        show_example=self.cfg.show_example))
            self._splits[split] = out
        return self._splits[split]
