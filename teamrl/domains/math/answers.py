"""Math answers: the last ``\\boxed{}`` of a reply and the gold answer of a data row, in the layouts math sets use."""

from __future__ import annotations

import math
import re
from typing import Any

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escape (backslash + next character) or a brace
_TOKEN_RE = re.compile(r"[^\s$]+")


def _partners(text: str, openers: set[int]) -> dict[int, int]:
    """Closing-brace position of each closed opening brace in ``openers``, in one pass (``\\{`` does not count)."""
    stack: list[int] = []
    found: dict[int, int] = {}
    for token in _BRACE_TOKEN_RE.finditer(text):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            opened = stack.pop()
            if opened in openers:
                found[opened] = token.start()
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched with nesting, escaped braces (``\\{``) do not count, and
    the brace-less form ``\\boxed 5`` is read up to the next space or ``$``.

    Args:
        text: A model reply or a worked solution.

    Returns:
        The stripped content, or None when there is no complete box.

    >>> last_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> last_boxed("no box") is None
    True
    """
    boxes = []  # (end of "\\boxed", first non-space after it); linear in len(text) however many boxes
    for match in _BOXED_RE.finditer(text):
        rest = match.end()
        while rest < len(text) and text[rest].isspace():
            rest += 1
        boxes.append((match.end(), rest))
    openers = {rest for _, rest in boxes if rest < len(text) and text[rest] == "{"}
    partners = _partners(text, openers) if openers else {}
    for end, rest in reversed(boxes):
        if rest in partners:
            return text[rest + 1 : partners[rest]].strip()
        if rest not in openers and rest > end:
            token = _TOKEN_RE.match(text, rest)
            if token:
                return token.group(0).strip()
    return None


def _scalar_text(value: Any) -> str | None:
    """Text of a scalar answer value; integral floats lose their ".0"."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip()
    return None


def gold_answer(key: str, value: Any) -> str:
    """Gold answer text from a row field, following the field's usual layout.

    "solution" fields give their last ``\\boxed{}`` content; any other field gives
    its value, where a list gives its first item, text after the last "####" is
    taken (GSM8K, with thousands commas dropped) and 27.0 becomes "27".

    Args:
        key: The field name the value came from.
        value: The field's value.

    Returns:
        The gold answer text.

    Raises:
        ValueError: when no answer text can be had (None, empty, no box, wrong type).

    >>> gold_answer("answer", "Janet sells 9 eggs.\\n#### 1,080")
    '1080'
    >>> gold_answer("final_answer", ["$2n$"])
    '$2n$'
    """
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "solution":
        items = value if isinstance(value, list) else [value]
        for item in reversed(items):
            if isinstance(item, str):
                boxed = last_boxed(item)
                if boxed:
                    return boxed
        raise ValueError(f"{key!r} has no \\boxed{{...}} answer")
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{key!r} is an empty list")
        value = value[0]
    text = _scalar_text(value)
    if text is None:
        kind = type(value).__name__
        raise ValueError(f"{key!r} is {kind} {short_repr(value)}, expected text or a number")
    if "####" in text:
        text = re.sub(r"(?<=\d),(?=\d)", "", text.rsplit("####", 1)[1]).strip()
    if not text:
        raise ValueError(f"{key!r} is empty")
    return text


def short_repr(value: Any, limit: int = 60) -> str:
    """Short repr for messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
