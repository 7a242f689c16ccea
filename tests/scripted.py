"""The parts of the engine contract (:class:`teamrl.engines.base.Engine`) that scripted test engines share.

A scripted engine answers from a script instead of a model; it subclasses this and writes ``generate``.
"""

from __future__ import annotations

import torch


class ScriptedEngineBase:
    """No weights to sync, no memory to free, nothing queued between calls."""

    tokenizer: object

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.generator = torch.Generator().manual_seed(0)

    def sync_weights(self) -> None:
        pass

    def release_memory(self) -> None:
        pass

    def reset(self) -> None:
        pass
