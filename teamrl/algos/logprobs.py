"""Token log-probabilities and entropies from logits (or from hidden states through the LM head, in chunks so the
``[tokens x vocabulary]`` logits are never whole): what the losses of :mod:`teamrl.algos.losses` and the learner's
scoring take.

Shape legend: B sequences (rows), T tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint
from torch import Tensor

__all__ = ["chunked_logprobs", "entropy_from_logits", "token_logprobs"]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, H = logsumexp(l) - sum(p * l).

    Entries equal to -inf (banned tokens) contribute 0.

    Args:
        logits: [..., V] unnormalized log-probabilities.

    Returns:
        [...] entropy in nats.

    Raises:
        ValueError: ``logits`` is not a tensor with at least one dim.

    >>> entropy_from_logits(torch.zeros(2, 4))  # uniform over 4: log 4
    tensor([1.3863, 1.3863])
    """
    if not isinstance(logits, Tensor) or logits.dim() == 0:
        raise ValueError("logits must be a tensor of shape [..., V] with at least one dim")
    finite = torch.where(torch.isneginf(logits), 0.0, logits)  # [..., V]
    probs = torch.softmax(logits, dim=-1)  # [..., V]
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(dim=-1)


def _temperature_view(temperature: float | Tensor, logits: Tensor) -> float | Tensor:
    """Validate ``temperature`` and shape it to broadcast over ``logits`` [B, ..., V]."""
    if isinstance(temperature, Tensor):
        if temperature.dim() == 0:
            temperature = temperature.reshape(1)
        if temperature.dim() != 1 or temperature.numel() not in (1, logits.shape[0]):
            raise ValueError(
                f"temperature tensor must be a scalar or [B]={logits.shape[0]}, "
                f"got shape {list(temperature.shape)}"
            )
        if not bool((temperature > 0).all() & torch.isfinite(temperature).all()):
            raise ValueError(f"temperature must be finite and > 0, got {temperature.tolist()}")
        view = [temperature.numel()] + [1] * (logits.dim() - 1)
        return temperature.to(logits.dtype).reshape(view)
    if not 0.0 < float(temperature) < float("inf"):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}; 1.0 is none")
    return float(temperature)


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float | Tensor = 1.0) -> Tensor:
    """Log-probability of each token under softmax(logits / temperature).

    Computed as the gathered logit minus logsumexp, without materialising a
    full log-softmax tensor.

    Args:
        logits: [B, T, V] model logits.
        tokens: [B, T] integer token ids in [0, V).
        temperature: float, or [B] tensor (one temperature per row), > 0.

    Returns:
        [B, T] log-probs, differentiable w.r.t. ``logits``.

    Raises:
        ValueError: shape mismatch, non-integer or out-of-range tokens, or a
            non-positive temperature.

    >>> token_logprobs(torch.zeros(1, 2, 4), torch.tensor([[0, 3]]))  # log(1/4)
    tensor([[-1.3863, -1.3863]])
    """
    if not isinstance(logits, Tensor) or not isinstance(tokens, Tensor):
        raise ValueError("logits and tokens must be torch.Tensors")
    if logits.dim() != tokens.dim() + 1 or logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logits {list(logits.shape)} must be tokens {list(tokens.shape)} plus a vocab dim"
        )
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must hold integers, got {tokens.dtype}; convert with .long()")
    vocab = logits.shape[-1]
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise ValueError(
            f"token ids must be in [0, {vocab}), got min {int(tokens.min())} max {int(tokens.max())}"
        )
    temp = _temperature_view(temperature, logits)
    scaled = logits if isinstance(temp, float) and temp == 1.0 else logits / temp  # [B, T, V]
    picked = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(scaled, dim=-1)


def _head_logprobs(head: Callable[[Tensor], Tensor], hidden: Tensor, tokens: Tensor, temperature: Tensor,
                   entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """Log-probs [N] and entropies [N] of ``tokens`` [N] from hidden states [N, H] (logits in fp32)."""
    logits = head(hidden).float()  # [N, V]
    logp = token_logprobs(logits[:, None, :], tokens[:, None], temperature=temperature)[:, 0]  # [N]
    if entropy_grad:
        return logp, entropy_from_logits(logits)
    with torch.no_grad():
        return logp, entropy_from_logits(logits.detach())


def chunked_logprobs(
    head: Callable[[Tensor], Tensor],
    hidden: Tensor,
    tokens: Tensor,
    temperature: Tensor,
    *,
    chunk: int = 0,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Token log-probs and entropies from hidden states, never holding more than ``chunk`` rows of logits.

    Each chunk runs ``head`` (the LM head), the fp32 log-softmax of the sampled token and the
    entropy. With autograd on, each chunk is recomputed in backward (non-reentrant activation
    checkpointing) instead of keeping its ``[chunk, V]`` logits, so the full ``[N, V]`` logits
    never exist, in forward or backward. With ``N <= chunk`` (or ``chunk == 0``) the whole batch
    is one chunk and nothing is recomputed. Values equal the unchunked computation up to the
    row-blocking of the head's matmul (tested to 1e-6 in fp32, gradients too).

    Args:
        head: [n, H] -> [n, V] logits (e.g. ``model.get_output_embeddings()``).
        hidden: [N, H] hidden states of the positions that predict ``tokens``.
        tokens: [N] token ids.
        temperature: [N] sampling temperature of each token (> 0); the entropy is of the untempered logits.
        chunk: rows per chunk (0: one chunk).
        entropy_grad: the entropy carries a gradient (an entropy bonus); else it is detached.

    Returns:
        (log-probs [N] with grad, entropies [N]).

    Raises:
        ValueError: a negative ``chunk``, or mismatched lengths.

    >>> head = torch.nn.Linear(2, 4, bias=False); _ = torch.nn.init.zeros_(head.weight)
    >>> logp, ent = chunked_logprobs(head, torch.ones(3, 2), torch.tensor([0, 1, 3]), torch.ones(3), chunk=2)
    >>> logp, ent
    (tensor([-1.3863, -1.3863, -1.3863], grad_fn=<CatBackward0>), tensor([1.3863, 1.3863, 1.3863]))
    """
    if chunk < 0:
        raise ValueError(f"chunk {chunk} must be >= 0 (0: one chunk)")
    if not (hidden.shape[0] == tokens.shape[0] == temperature.shape[0]):
        raise ValueError(f"hidden {list(hidden.shape)}, tokens {list(tokens.shape)} and temperature "
                         f"{list(temperature.shape)} must have the same number of rows")
    n = hidden.shape[0]
    if chunk == 0 or n <= chunk:
        return _head_logprobs(head, hidden, tokens, temperature, entropy_grad)
    recompute = torch.is_grad_enabled()
    logps, ents = [], []
    for i in range(0, n, chunk):
        part = (hidden[i : i + chunk], tokens[i : i + chunk], temperature[i : i + chunk])
        if recompute:
            lp, en = torch.utils.checkpoint.checkpoint(_head_logprobs, head, *part, entropy_grad, use_reentrant=False)
        else:
            lp, en = _head_logprobs(head, *part, entropy_grad)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps), torch.cat(ents)
