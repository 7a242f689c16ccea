"""Prompt prefixes the ``hf`` engine's fast loop prefills once: groups of prompts admitted together that share a
prefix (:func:`prefix_groups`), and the prefixes kept from earlier prefills (:class:`PrefixStore`); see
:meth:`teamrl.engines.fast_decoder.FastDecoder.prefill`."""

from __future__ import annotations

from collections import OrderedDict

import torch

from teamrl.tokens import common_prefix_length


class PrefixStore:
    """Keys and values of prompt prefixes prefilled with the current weights, for later prefills to copy instead
    of running them again (e.g. a team's system prompt, or a problem statement every agent's prompt repeats,
    across the calls of a rollout or an evaluation).

    Entries are the group prefixes :meth:`~teamrl.engines.fast_decoder.FastDecoder.prefill` runs, as [layers, kv heads, tokens, head dim]
    copies; a lookup finds the entry sharing the most tokens with a prompt (at least ``min_len``; entries are
    indexed by their first ``min_len`` tokens). The least recently used entries are dropped beyond
    ``max_tokens`` stored tokens. The owner clears it when the weights change (:meth:`valid_for`).
    """

    def __init__(self, min_len: int, max_tokens: int = 4096) -> None:
        if min_len < 1:
            raise ValueError(f"min_len {min_len} must be >= 1")
        self.min_len, self.max_tokens = min_len, max_tokens
        self.entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.by_start: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        self.tokens = 0
        self.key: object = None
        self.hits = 0
        self.tokens_reused = 0
        """Counters: lookups that found a prefix, and the prompt tokens they did not run."""

    def valid_for(self, key: object) -> None:
        """Clear the store unless ``key`` (the weights' identity and versions) is the one it was filled under."""
        if key != self.key:
            self.clear()
            self.key = key

    def clear(self) -> None:
        self.entries.clear()
        self.by_start.clear()
        self.tokens = 0

    def match(self, tokens: list[int], limit: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The stored keys and values sharing the most of ``tokens[:limit]``, and how many tokens they share
        (0, with empty tensors, where none shares ``min_len``)."""
        best, n = None, 0
        if limit >= self.min_len:
            for e in self.by_start.get(tuple(tokens[: self.min_len]), ()):
                c = common_prefix_length(e, tokens[:limit])
                if c > n:
                    best, n = e, c
        if best is None:
            return torch.empty(0), torch.empty(0), 0
        self.entries.move_to_end(best)
        self.hits += 1
        self.tokens_reused += n
        k, v = self.entries[best]
        return k, v, n

    def put(self, tokens: tuple[int, ...], k: torch.Tensor, v: torch.Tensor) -> None:
        if len(tokens) < self.min_len or tokens in self.entries or len(tokens) > self.max_tokens:
            return
        self.entries[tokens] = (k, v)
        self.by_start.setdefault(tokens[: self.min_len], set()).add(tokens)
        self.tokens += len(tokens)
        while self.tokens > self.max_tokens:
            old, _ = self.entries.popitem(last=False)
            self.tokens -= len(old)
            self.by_start[old[: self.min_len]].discard(old)


def prefix_groups(prompts: list[list[int]], min_len: int) -> list[tuple[list[int], int]]:
    """Groups of at least two prompts sharing a prefix of >= ``min_len`` tokens: (indices, prefix length).

    Prompts are sorted so that those with long common prefixes are adjacent; a group's prefix is
    the shortest adjacent common prefix in it, and stops one token short of its shortest prompt
    (every prompt keeps a token to run, whose hidden state gives the next-token logits).

    >>> prefix_groups([[1, 2, 3, 4], [9, 9], [1, 2, 3, 5]], 2)
    [([0, 2], 3)]
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[tuple[list[int], int]] = []
    cur, P = [order[0]], len(prompts[order[0]]) - 1
    for i in order[1:] + [-1]:
        n = common_prefix_length(prompts[cur[-1]], prompts[i]) if i >= 0 else 0
        n = min(P, n, len(prompts[i]) - 1)
        if i >= 0 and n >= min_len:
            cur.append(i)
            P = n
            continue
        if len(cur) >= 2:
            groups.append((sorted(cur), P))
        if i >= 0:
            cur, P = [i], len(prompts[i]) - 1
    return groups
