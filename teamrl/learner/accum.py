"""Token-weighted metrics of one optimizer step, summed over micro-batches and data-parallel workers."""

from __future__ import annotations

from collections.abc import Callable

from teamrl.algos.correction import merge_sums, mismatch_means

WATCHERS: list[Callable[[float], None]] = []
"""Called with the loss tokens of every micro-batch as it is added (the update's progress display)."""


class Accum:
    """Token-weighted running metrics of one optimizer step, for the model and for each agent."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.tokens = 0.0
        self.sums: dict[str, float] = {}
        self.agent_tokens: dict[str, float] = {}
        self.agent_sums: dict[str, dict[str, float]] = {}
        self.mismatch: dict[str, dict[str, float]] = {}
        """Per agent, the sums of :func:`teamrl.algos.correction.mismatch_sums`."""
        self.dropped_tokens = 0.0
        self.dropped_seqs = 0.0
        """Tokens and replies a masking rollout correction took out of the loss."""

    def add(self, loss, st, mask, ent_flat, kl, logp, old, agent: str, *, keep=None,
            mismatch: dict[str, float] | None = None) -> None:
        """One micro-batch of ``agent``; ``keep`` [b, R] the tokens left in the loss, ``mismatch`` its sums."""
        m = mask.bool()
        if keep is not None:
            self.dropped_tokens += float((m & ~keep).sum())
            self.dropped_seqs += float((m.any(dim=1) & ~keep.any(dim=1)).sum())
        if mismatch is not None:
            self.mismatch[agent] = merge_sums(self.mismatch.get(agent, {}), mismatch)
        tokens = float(m.sum())
        for watch in WATCHERS:
            watch(tokens)
        self.loss += float(loss)
        self.tokens += tokens
        self.agent_tokens[agent] = self.agent_tokens.get(agent, 0.0) + tokens
        self._add(agent, "clip_frac", float(st["clipped"][m].float().sum()))
        self._add(agent, "entropy", float(ent_flat.sum()))
        self._add(agent, "engine_logprob_absdiff", float((logp - old)[m].abs().sum()))
        if kl is not None:
            self._add(agent, "kl", float(kl.detach()[m].sum()))

    def _add(self, agent: str, key: str, v: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + v
        mine = self.agent_sums.setdefault(agent, {})
        mine[key] = mine.get(key, 0.0) + v

    @staticmethod
    def merged(parts: list[Accum]) -> Accum:
        """One accumulator holding the sums of ``parts`` (the data-parallel workers' shares)."""
        out = Accum()
        for a in parts:
            out.loss += a.loss
            out.tokens += a.tokens
            for agent, t in a.agent_tokens.items():
                out.agent_tokens[agent] = out.agent_tokens.get(agent, 0.0) + t
            for agent, sums in a.agent_sums.items():
                for k, v in sums.items():
                    out._add(agent, k, v)
            for agent, mm in a.mismatch.items():
                out.mismatch[agent] = merge_sums(out.mismatch.get(agent, {}), mm)
            out.dropped_tokens += a.dropped_tokens
            out.dropped_seqs += a.dropped_seqs
        return out

    def denominator_factor(self, agg: str, num_tokens: float, num_seqs: float) -> float:
        """What the loss (computed with every token's denominators) is multiplied by so that the tokens or
        replies a masking correction dropped leave the denominator too: num_tokens / kept tokens for
        ``token-mean``, num_seqs / kept replies for the ``seq-mean-*`` modes; 1 when nothing was dropped
        or nothing is left."""
        total, dropped = (num_tokens, self.dropped_tokens) if agg == "token-mean" else (num_seqs, self.dropped_seqs)
        return total / (total - dropped) if 0 < dropped < total else 1.0

    def summary(self, model: str = "") -> dict[str, float]:
        """Model-level means (``clip_frac``, ...), per-agent means (``agent/<a>/clip_frac``, ...) and the
        mismatch metrics per agent (``mismatch/<a>/kl_k3``, ...) and of ``model`` (``mismatch/model/<model>/...``)."""
        n = max(self.tokens, 1.0)
        out = {"loss": self.loss, "tokens": self.tokens}
        out.update({k: v / n for k, v in self.sums.items()})
        for agent, sums in self.agent_sums.items():
            na = max(self.agent_tokens[agent], 1.0)
            out.update({f"agent/{agent}/{k}": v / na for k, v in sums.items() if k != "engine_logprob_absdiff"})
        total: dict[str, float] = {}
        for agent, mm in sorted(self.mismatch.items()):
            out.update({f"mismatch/{agent}/{k}": v for k, v in mismatch_means(mm).items()})
            total = merge_sums(total, mm)
        if total:
            out.update({f"mismatch/model/{model}/{k}": v for k, v in mismatch_means(total).items()})
        return out
