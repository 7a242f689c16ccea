"""A griffe extension for the docs site's API reference (mkdocs.yml loads it into mkdocstrings).

teamrl's docstrings are plain text with reStructuredText-style code (````x````) and doctests, not Markdown. Two
things would otherwise render wrong: a doctest (``>>>`` lines and their output) reads as nested block quotes, and
brackets in prose (``[B, T]``, a doctest's ``[1, 2]``) read as Markdown reference links. This fences each doctest
as a ``pycon`` code block and escapes brackets outside code."""

from __future__ import annotations

import re
from typing import Any

import griffe

_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def _escape_brackets(line: str) -> str:
    parts = _CODE_SPAN.split(line)
    return "".join(p if i % 2 else p.replace("[", r"\[").replace("]", r"\]") for i, p in enumerate(parts))


def markdown_docstring(text: str) -> str:
    """``text`` with each doctest fenced as ``pycon`` and the brackets of its prose escaped (tests/test_docs_site.py)."""
    out: list[str] = []
    fence: str | None = None  # the indentation of the doctest being fenced, or of a ``` block
    in_code = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        if fence is not None and not in_code:  # inside a doctest: it ends at a blank line
            if stripped:
                out.append(line)
                continue
            out.append(f"{fence}```")
            fence = None
        if stripped.startswith("```"):
            in_code = not in_code
            out.append(line)
            continue
        if in_code:
            out.append(line)
            continue
        if stripped.startswith(">>>"):
            fence = indent
            out.extend([f"{indent}```pycon", line])
            continue
        out.append(_escape_brackets(line))
    if fence is not None:
        out.append(f"{fence}```")
    return "\n".join(out)


class MarkdownDocstrings(griffe.Extension):
    """Rewrites every docstring with :func:`markdown_docstring` as griffe loads it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
