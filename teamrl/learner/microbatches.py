"""Micro-batches of an update: rows filled into packed layouts of at most ``loss.micro_batch_tokens`` tokens, a group
of replies kept whole where it fits so its shared prompt is computed once (teamrl.learner.packing lays each one
out), or padded rows sorted by length (``loss.pack_rows: false``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from teamrl.team.records import Step
from teamrl.tokens import common_prefix_length


def plan_micro_batches(seqs: Sequence[Sequence[int]], budget: int, *, share: bool) -> list[tuple[list[int], int]]:
    """Fill micro-batches with rows in their order until their packed layout would exceed ``budget`` tokens.

    Rows keep their order (a group's rows are next to each other, so they share their prompt); a
    row longer than the budget gets a micro-batch of its own. With ``share``, a group is kept whole
    where it fits: when a row that continues the group at the end of a full micro-batch does not fit,
    that group's rows move with it to the next micro-batch, so their prompt is computed once, not in
    both (a group starts where a row shares the fewest tokens with the row before it); of that plan and
    the plain one, the one that computes fewer tokens is taken. Returns (row indices, tokens the
    layout computes) per micro-batch.

    >>> plan_micro_batches([[1, 2, 3], [1, 2, 4], [5, 6]], budget=5, share=True)
    [([0, 1], 4), ([2], 2)]
    >>> plan_micro_batches([[1, 2, 3], [1, 2, 4], [5, 6]], budget=5, share=False)
    [([0], 3), ([1, 2], 5)]
    >>> plan_micro_batches([[9], [1, 2, 3], [1, 2, 4], [1, 2, 5]], budget=5, share=True)  # [1, 2] computed once
    [([0], 1), ([1, 2, 3], 5)]
    """
    plain = _fill(seqs, budget, share=share, keep_groups=False)
    if not share:
        return plain
    grouped = _fill(seqs, budget, share=True, keep_groups=True)
    return min(grouped, plain, key=lambda plan: sum(c for _, c in plan))


def _fill(seqs: Sequence[Sequence[int]], budget: int, *, share: bool, keep_groups: bool) -> list[tuple[list[int], int]]:
    out: list[tuple[list[int], int]] = []
    cur: list[int] = []
    used = 0
    trie: dict[int, dict] = {}
    link = [common_prefix_length(seqs[i - 1], seqs[i]) if keep_groups and i else 0 for i in range(len(seqs))]
    for i, s in enumerate(seqs):
        new = len(s) - (_shared_length(trie, s) if share else 0)
        if cur and used + new > budget:
            tail = _group_tail(cur, link, i) if keep_groups else len(cur)
            moved, tail_used = cur[tail:], 0
            tail_trie: dict[int, dict] = {}
            for j in moved + [i]:
                tail_used += len(seqs[j]) - _shared_length(tail_trie, seqs[j])
                _insert(tail_trie, seqs[j])
            if 0 < tail < len(cur) and tail_used <= budget:  # the group fits whole in the next micro-batch
                out.append((cur[:tail], _computed(seqs, cur[:tail])))
                cur, used, trie = moved + [i], tail_used, tail_trie
                continue
            out.append((cur, used))
            cur, used, trie = [], 0, {}
            new = len(s)
        cur.append(i)
        used += new
        if share:
            _insert(trie, s)
    if cur:
        out.append((cur, used))
    return out


def _group_tail(cur: list[int], link: list[int], nxt: int) -> int:
    """Where the group that row ``nxt`` continues starts in ``cur``: the last row after the first that shares the
    fewest tokens with the row before it, if ``nxt`` shares more than that with its own predecessor; else
    ``len(cur)`` (``nxt`` starts a group of its own)."""
    if len(cur) < 2:
        return len(cur)
    weakest = min(link[j] for j in cur[1:])
    if link[nxt] <= weakest:
        return len(cur)
    return max(k for k in range(1, len(cur)) if link[cur[k]] == weakest)


def _computed(seqs: Sequence[Sequence[int]], rows: list[int]) -> int:
    trie: dict[int, dict] = {}
    n = 0
    for j in rows:
        n += len(seqs[j]) - _shared_length(trie, seqs[j])
        _insert(trie, seqs[j])
    return n


def _shared_length(trie: dict[int, dict], seq: Sequence[int]) -> int:
    node, n = trie, 0
    for t in seq:
        if t not in node:
            break
        node, n = node[t], n + 1
    return n


def _insert(trie: dict[int, dict], seq: Sequence[int]) -> None:
    node = trie
    for t in seq:
        node = node.setdefault(t, {})


def pack_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Greedily pack row indices (sorted by length) so rows × longest ≤ ``budget`` tokens.

    >>> pack_micro_batches([5, 3, 9, 4], budget=12)
    [[1, 3], [0], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def by_agent(rows: list[Step]) -> list[tuple[str, list[Step]]]:
    """Rows grouped by agent, agents sorted by name."""
    return [(a, [r for r in rows if r.agent == a]) for a in sorted({r.agent for r in rows})]


def pad_rows(values: list[list[float]], width: int) -> torch.Tensor:
    """Rows of numbers right-padded with zeros to ``width``: [rows, width]."""
    out = torch.zeros((len(values), width))
    for b, v in enumerate(values):
        out[b, : len(v)] = torch.tensor(v)
    return out


def row_advantages(rows: list[Step], width: int) -> torch.Tensor:
    """The rows' advantages for the loss: [rows], one per row, or [rows, width] when some row has per-token terms
    (``Step.token_advantages``, on-policy distillation), each row's advantage plus its terms, zero-padded.

    >>> from teamrl.team.records import Step
    >>> a = Step(0, 0, "s", 0, "m", [1], [2, 3], [-1.0, -1.0], 1.0, "", True, advantage=0.5)
    >>> row_advantages([a], 2).tolist()
    [0.5]
    >>> a.token_advantages = [1.0, -1.0]
    >>> row_advantages([a], 3).tolist()
    [[1.5, -0.5, 0.5]]
    """
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    if all(r.token_advantages is None for r in rows):
        return adv
    return adv[:, None] + pad_rows([r.token_advantages or [] for r in rows], width)


def micro_batch_plan(rows: list[Step], budget: int, *, pack: bool, share: bool) -> list[tuple[list[int], int]]:
    """Row indices of each micro-batch of ``rows`` and the tokens its forward computes: packed layouts filled to
    ``budget`` tokens in row order (``share``: common prefixes once), or padded rows sorted by length (rows x longest
    <= budget)."""
    seqs = [r.prompt_ids + r.response_ids for r in rows]
    if pack:
        return plan_micro_batches(seqs, budget, share=share)
    mbs = pack_micro_batches([len(s) for s in seqs], budget)
    return [(mb, len(mb) * max(len(seqs[i]) for i in mb)) for mb in mbs]
