"""Suggestions for misspelt names in error messages ("did you mean ...?")."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: object, options: Iterable[str]) -> str | None:
    """The option most similar to ``word``, or None when none is close.

    >>> closest("drmsa", ["grpo", "drmas"])
    'drmas'
    """
    matches = difflib.get_close_matches(str(word), list(options), n=1)
    return matches[0] if matches else None


def did_you_mean(word: object, options: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest option, or ``""`` when none is close.

    >>> "unknown preset 'drmsa'" + did_you_mean("drmsa", ["grpo", "drmas"])
    "unknown preset 'drmsa'; did you mean 'drmas'?"
    """
    match = closest(word, options)
    return f"; did you mean {match!r}?" if match else ""
