"""C3's counterfactual credit on a prefix tree of a team's calls (arXiv 2603.06859), as pure functions.

A rollout of ``rollout.prefix_tree: [f_0, f_1, ...]`` samples, per problem, ``f_0`` first calls; under each,
``f_1`` second calls with the first frozen (replayed, not generated again); and so on. A node is one call; its
*path* is the tuple of child indices from the root (``Step.branch``). The sibling group of a node is the nodes with
the same parent path. EIT-EAST-Lab/C3 @ 628185b computes, for its ``reward_only`` variant:

* the node's return: the mean of the final rewards of the leaves below it (``c3/mas/rollout_generator.py``
  :614-624, :856-859, :1065-1071): :func:`subtree_means`;
* its advantage: the return minus the leave-one-out mean of its siblings' returns, ``(S - r_i) / (n - 1)``
  (``c3/credit/c3/provider.py`` ``_baseline_loo`` :81-89, ``compute`` :495-506), or the siblings' mean with
  ``baseline_mode: full_mean`` (:92-96); a group of one node gets 0 (:493-494);
* then the advantages z-scored within the sibling group: ``(a - mean) / sqrt(var + eps)`` with the population
  variance and ``eps`` inside the square root (``c3/algorithms/utils.py`` ``group_mean_std`` :132-164, applied in
  ``openrlhf/trainer/ppo_utils/experience_maker.py`` :1761-1765 unless ``--no_advantage_std_norm``):
  :func:`sibling_advantages`.

Its three diagnostics (``c3/analysis/metrics.py``), computed per sibling group ("bucket"): the variance of the
credit ``A_j = R_j - LOO(R)_j`` (``credit_var``, population variance), the Spearman correlation of a method's credit
with ``R_j - mean(R)`` over all candidates (``credit_fidelity``, ``build_fidelity_pairs`` "all_candidates"), and the
conditional mutual information between the candidate and the next call's reply, hashed (``influence_mi``: Laplace
``alpha`` 1, the ``top_k`` 64 most frequent replies of the step plus OTHER, natural log):
:func:`credit_var`, :func:`spearman`, :func:`influence_mi`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["canonical", "credit_var", "influence_mi", "loo_baseline", "sibling_advantages", "sibling_groups",
           "spearman", "subtree_means"]

Path = tuple[int, ...]


def subtree_means(node_paths: Sequence[Path], leaf_paths: Sequence[Path], leaf_rewards: Sequence[float]) -> list[float]:
    """The mean reward of the leaves below each node (a leaf is below itself and below every prefix of its path).

    >>> subtree_means([(0,), (1,), (0, 0), (0, 1)], [(0, 0), (0, 1), (1, 0)], [1.0, 0.0, 1.0])
    [0.5, 1.0, 1.0, 0.0]
    """
    sums: dict[Path, float] = {}
    counts: dict[Path, int] = {}
    for path, reward in zip(leaf_paths, leaf_rewards, strict=True):
        for cut in range(1, len(path) + 1):
            sums[path[:cut]] = sums.get(path[:cut], 0.0) + float(reward)
            counts[path[:cut]] = counts.get(path[:cut], 0) + 1
    missing = [p for p in node_paths if p not in counts]
    if missing:
        raise ValueError(f"node {missing[0]} has no leaf below it")
    return [sums[p] / counts[p] for p in node_paths]


def sibling_groups(prompts: Sequence[int], paths: Sequence[Path]) -> Tensor:
    """Dense group ids [N]: nodes of one problem with the same parent path (C3's (question, role, parent)).

    >>> sibling_groups([0, 0, 0, 0, 1], [(0,), (1,), (0, 0), (0, 1), (0,)])
    tensor([0, 0, 1, 1, 2])
    """
    if any(not p for p in paths):
        raise ValueError("a step outside the prefix tree (empty branch) has no sibling group")
    ids: dict[tuple[int, Path], int] = {}
    return torch.tensor([ids.setdefault((int(q), p[:-1]), len(ids)) for q, p in zip(prompts, paths, strict=True)],
                        dtype=torch.long)


def loo_baseline(values: Tensor, groups: Tensor) -> Tensor:
    """Each row's leave-one-out mean over the other rows of its group; a group of one row gets its own value
    (so its advantage is 0, as C3 sets it).

    >>> loo_baseline(torch.tensor([1.0, 0.0, 0.0, 2.0]), torch.tensor([0, 0, 0, 1]))
    tensor([0.0000, 0.5000, 0.5000, 2.0000], dtype=torch.float64)
    """
    v = values.to(torch.float64)
    n = int(groups.max()) + 1 if groups.numel() else 0
    total = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, v)
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, torch.ones_like(v))
    own_count = count[groups]
    return torch.where(own_count > 1, (total[groups] - v) / (own_count - 1).clamp_min(1), v)


def sibling_advantages(returns: Tensor, groups: Tensor, *, baseline: str = "leave_one_out", normalize: bool = True,
                       eps: float = 1e-8) -> Tensor:
    """C3's advantages [N] (float64) of nodes with ``returns`` [N] in sibling ``groups`` [N].

    ``baseline``: ``leave_one_out`` (C3's default ``loo``), ``mean`` (its ``full_mean``) or ``none``; a group of one
    node gets 0 either way. ``normalize``: then ``(a - mean_g(a)) / sqrt(var_g(a) + eps)``, the population variance.

    >>> r, g = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    >>> sibling_advantages(r, g, normalize=False)
    tensor([ 1.0000, -0.5000, -0.5000,  0.0000,  0.0000], dtype=torch.float64)
    >>> [round(x, 4) for x in sibling_advantages(r, g).tolist()]
    [1.4142, -0.7071, -0.7071, 0.0, 0.0]
    """
    if baseline not in ("leave_one_out", "mean", "none"):
        raise ValueError(f"baseline {baseline!r} must be leave_one_out, mean or none")
    r = returns.to(torch.float64)
    if r.numel() == 0:
        return r
    n = int(groups.max()) + 1
    count = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, torch.ones_like(r))
    mean = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, r) / count
    if baseline == "leave_one_out":
        adv = r - loo_baseline(r, groups)
    elif baseline == "mean":
        adv = r - mean[groups]
    else:
        adv = r.clone()
    adv = torch.where(count[groups] > 1, adv, torch.zeros_like(adv))
    if not normalize:
        return adv
    a_mean = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, adv) / count
    diff = adv - a_mean[groups]
    var = torch.zeros(n, dtype=torch.float64).index_add_(0, groups, diff * diff) / count
    return diff / torch.sqrt(var[groups] + eps).clamp_min(1e-8)


def credit_var(returns: Sequence[float]) -> float:
    """C3's ``credit_var`` of one sibling group: the population variance of ``R_j - LOO(R)_j``; 0 below 2 nodes.

    >>> round(credit_var([1.0, 0.0, 0.0, 1.0]), 6)  # A = +-2/3
    0.444444
    """
    r = torch.tensor(list(returns), dtype=torch.float64)
    if r.numel() <= 1:
        return 0.0
    a = r - loo_baseline(r, torch.zeros(r.numel(), dtype=torch.long))
    return float(((a - a.mean()) ** 2).mean())


def _ranks(x: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties given their average rank (scipy's ``rankdata(method="average")``)."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j + 2) / 2.0
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b``; 0 when undefined (fewer than 2 points, a constant side), as
    C3's ``credit_fidelity``.

    >>> spearman([0.1, 0.5, 0.2], [1.0, 3.0, 2.0]), spearman([1.0, 1.0], [0.0, 1.0])
    (1.0, 0.0)
    """
    if len(a) != len(b) or len(a) < 2:
        return 0.0
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    da = sum((x - ma) ** 2 for x in ra)
    db = sum((y - mb) ** 2 for y in rb)
    if da <= 0.0 or db <= 0.0:
        return 0.0
    r = sum((x - ma) * (y - mb) for x, y in zip(ra, rb)) / math.sqrt(da * db)
    return max(-1.0, min(1.0, r))


_FENCE = re.compile(r"```(?:[a-zA-Z0-9_+-]+)?\n|\n```", flags=re.MULTILINE)
_SPACES = re.compile(r"[ \t]+")


def canonical(text: str) -> str:
    """C3's ``canonicalize_for_influence`` without its optional math sanitizer: code fences dropped, newlines
    normalised, runs of spaces collapsed, at most one blank line in a row, stripped.

    >>> canonical("```python\\nx  =  1\\n```\\n\\n\\n\\ny")
    'x = 1\\n\\ny'
    """
    s = _FENCE.sub("\n", text).replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    blank = 0
    for line in s.split("\n"):
        line = _SPACES.sub(" ", line.rstrip())
        blank = blank + 1 if line == "" else 0
        if blank <= 1:
            out.append(line)
    return "\n".join(out).strip()


def _symbol(text: str) -> str:
    return hashlib.sha1(canonical(text).encode("utf-8")).hexdigest()[:16]


def influence_mi(next_replies: Sequence[Sequence[str]], vocab: Sequence[str] | None = None, *, top_k: int = 64,
                 alpha: float = 1.0) -> float:
    """C3's ``influence_mi`` of one sibling group: I(J; Y | h) in nats, J the candidate, Y the hashed reply of the
    call after it (``next_replies[j]``: the replies under candidate j), Laplace ``alpha``, the ``top_k`` most frequent
    symbols (of ``vocab``'s replies when given, C3's global vocabulary) plus OTHER; 0 below 2 candidates.

    >>> influence_mi([["a", "a"], ["b", "b"]]) > influence_mi([["a", "b"], ["a", "b"]]) == 0.0
    True
    """
    if len(next_replies) <= 1:
        return 0.0
    syms = [[_symbol(y) for y in ys] for ys in next_replies]
    sizes = [float(len(ys)) for ys in syms]
    total = sum(sizes)
    if total <= 0.0:
        return 0.0
    counts = Counter(s for ys in syms for s in ys) if vocab is None else Counter(_symbol(y) for y in vocab)
    kept = [s for s, _ in counts.most_common(top_k)] if top_k > 0 else []
    bins = {s: i for i, s in enumerate(kept)}
    width = len(kept) + 1  # + OTHER
    p_y_given_j = torch.zeros(len(syms), width, dtype=torch.float64)
    for j, ys in enumerate(syms):
        for s in ys:
            p_y_given_j[j, bins.get(s, len(kept))] += 1.0
    p_j = torch.tensor(sizes, dtype=torch.float64) / total
    p_y_given_j = (p_y_given_j + alpha) / (torch.tensor(sizes, dtype=torch.float64)[:, None] + alpha * width).clamp_min(1e-12)
    p_y = (p_j[:, None] * p_y_given_j).sum(0).clamp_min(1e-300)
    ratio = p_y_given_j.clamp_min(1e-300) / p_y[None, :]
    return max(0.0, float((p_j[:, None] * p_y_given_j * ratio.log()).sum()))
