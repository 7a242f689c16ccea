"""Token-weighted metrics of one optimizer step, summed over micro-batches and data-parallel workers."""

from __future__ import annotations


class Accum:
    """Token-weighted running metrics of one optimizer step, for the model and for each agent."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.tokens = 0.0
        self.sums: dict[str, float] = {}
        self.agent_tokens: dict[str, float] = {}
        self.agent_sums: dict[str, dict[str, float]] = {}

    def add(self, loss, st, mask, ent_flat, kl, logp, old, agent: str) -> None:
        m = mask.bool()
        tokens = float(m.sum())
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
        return out

    def summary(self) -> dict[str, float]:
        """Model-level means (``clip_frac``, ...) and per-agent means (``agent/<a>/clip_frac``, ...)."""
        n = max(self.tokens, 1.0)
        out = {"loss": self.loss, "tokens": self.tokens}
        out.update({k: v / n for k, v in self.sums.items()})
        for agent, sums in self.agent_sums.items():
            na = max(self.agent_tokens[agent], 1.0)
            out.update({f"agent/{agent}/{k}": v / na for k, v in sums.items() if k != "engine_logprob_absdiff"})
        return out
