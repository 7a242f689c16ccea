"""Cutting a reply at a stop string, as OpenAI does, while the tokens stay the ones returned.

Engines stop generating once a stop string appears and keep it in the reply (in-process
workflows rely on that, e.g. a closing ``</answer>``). An OpenAI client instead expects the text
to end just before the stop string. :func:`cut_at_stop` finds how many of the reply's tokens to
keep so that the returned text is exactly the decode of the kept tokens: the longest token prefix
whose text ends at or before the earliest stop string. A stop string that begins inside a token
(the token holds text before it and the start of the stop string) drops that whole token, so the
text before the stop string in that token is not returned either; nothing returned is untrained
and nothing trained is unreturned. Left out: stop strings inside the prompt (only the reply is
searched) and tokens whose text depends on the tokens after them beyond what ``decode`` of a prefix
shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def cut_at_stop(decode: Callable[[list[int]], str], ids: Sequence[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """Where to cut a reply that holds a stop string.

    Args:
        decode: token ids -> text (the engine's decode, special tokens skipped).
        ids: the reply's token ids, shape ``[n]``.
        stops: the stop strings (empty ones are ignored).

    Returns:
        ``(k, text)``: keep ``ids[:k]``, whose text ``text`` ends before the earliest stop string;
        None when no stop string occurs in the reply.

    >>> pieces = {1: "To", 2: " add", 3: " 2"}
    >>> dec = lambda ids: "".join(pieces[i] for i in ids)
    >>> cut_at_stop(dec, [1, 2, 3], [" "])  # " " starts token 2: keep "To"
    (1, 'To')
    >>> cut_at_stop(dec, [1, 2, 3], ["dd"])  # "dd" starts inside " add": the whole token goes
    (1, 'To')
    >>> cut_at_stop(dec, [1, 2, 3], ["!"]) is None
    True
    """
    full = decode(list(ids))
    hits = [full.find(s) for s in stops if s]
    hits = [h for h in hits if h >= 0]
    if not hits:
        return None
    head = full[:min(hits)]
    for k in range(len(ids), -1, -1):  # the stop is usually near the end: few decodes
        text = decode(list(ids[:k]))
        if head.startswith(text):
            return k, text
    return 0, ""
