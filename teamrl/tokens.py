"""Token-sequence helpers shared by the engines and the learner."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    >>> common_prefix_length([1, 2, 3], (1, 2, 4, 5)), common_prefix_length([], [1]), common_prefix_length([7], [7])
    (2, 0, 1)
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
