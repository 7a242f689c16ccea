"""Reading one ``<tag>...</tag>`` span out of a model reply, strictly.

A reply is well formed when it holds exactly one opening and one closing tag, in that order,
around non-empty text (tag names match case-insensitively; text outside the span is allowed).
Everything else (no tag, an unclosed tag, nested or repeated tags, an empty span) is malformed,
and :func:`extract_tag` says why.

Left out: attributes on tags and escaping.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Tagged", "extract_tag"]


class Tagged(NamedTuple):
    """The span's text, or None and the reason it is malformed."""

    content: str | None
    error: str = ""


def extract_tag(text: str, tag: str) -> Tagged:
    """The text inside the single ``<tag>...</tag>`` of ``text``.

    >>> extract_tag("I will look. <search> capital of France </search>", "search")
    Tagged(content='capital of France', error='')
    >>> extract_tag("<search>a <search>b</search></search>", "search").error
    'nested or repeated <search> tags'
    >>> extract_tag("Paris", "answer").error
    'no <answer>...</answer>'
    """
    opens = [m.start() for m in re.finditer(f"<{tag}>", text, flags=re.IGNORECASE)]
    closes = [m.start() for m in re.finditer(f"</{tag}>", text, flags=re.IGNORECASE)]
    if not opens and not closes:
        return Tagged(None, f"no <{tag}>...</{tag}>")
    if len(opens) > 1 or len(closes) > 1:
        return Tagged(None, f"nested or repeated <{tag}> tags")
    if not opens or not closes or closes[0] < opens[0]:
        return Tagged(None, f"unbalanced <{tag}> tags")
    content = text[opens[0] + len(tag) + 2 : closes[0]].strip()
    if not content:
        return Tagged(None, f"empty <{tag}>")
    return Tagged(content)
