"""Episode records: every LLM call of an episode is a :class:`Step`.

These records are the hand-off between rollout (who said what) and training (rewards,
advantages, losses). They are plain data; nothing here knows about tensors or models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Step:
    """One LLM call made by one agent in one episode."""

    prompt_index: int
    """Index of the prompt (problem) within the rollout batch; episodes of one prompt share it (the
    advantage scopes' ``prompt`` key)."""
    episode: int
    """Index of the episode within the rollout batch."""
    agent: str
    agent_call: int
    """How many times this agent had already been called in this episode (0 = its first call); the
    advantage scopes' ``turn`` key (AT-GRPO's turn of one agent)."""
    model: str
    """Name of the physical model that generated the reply."""
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    """Sampling log-probs of ``response_ids`` (softmax(logits / temperature))."""
    temperature: float
    text: str
    valid: bool
    """Whether the reply parsed under the agent's format; invalid steps get the format penalty."""
    finish_reason: str = "stop"
    reward: float = 0.0
    """Reward credited to this step (filled after the episode is scored)."""
    advantage: float = 0.0
    token_advantages: list[float] | None = None
    """Per response token, added to ``advantage`` in the loss (on-policy distillation's reverse-KL term,
    :mod:`teamrl.scoring.distill`); None: ``advantage`` alone on every token."""
    teacher_rows: list[dict[str, Any]] | None = None
    """MAD-OPD's divergence loss (``algo.distill.loss: jsd``): per teacher, ``model`` (its name), ``prompt_ids`` (what
    it reads before ``response_ids``) and ``weight``; None: not distilled this way."""
    tree: int = -1
    """Search tree this call expanded (tree workflows, e.g. ``math_tree``); -1 outside a tree.
    The ``tree`` advantage scope groups the steps of one (prompt, tree); a step with -1 counts
    as its episode's tree."""
    parent: int = -1
    """Index in ``Episode.steps`` of the node this call refined; -1 for the root (the problem)."""
    depth: int = 0
    """Depth of this call's node in its tree (1 = child of the root); 0 outside a tree."""
    branch: tuple[int, ...] = ()
    """Path of this call's node in its problem's prefix tree of calls (``rollout.prefix_tree``, C3): the child index
    at each call from the root, so nodes with the same ``branch[:-1]`` are siblings; () outside one."""


@dataclass
class Episode:
    """One run of a workflow on one problem."""

    prompt_index: int
    """Index of the problem within the rollout batch (see :attr:`Step.prompt_index`)."""
    index: int
    """Index of the episode within the rollout batch."""
    problem_id: str
    steps: list[Step] = field(default_factory=list)
    final: str | None = None
    """What the workflow returned (the team's final answer text)."""
    reward: float = 0.0
    agent_rewards: dict[str, float] = field(default_factory=dict)
    """Optional per-agent rewards; an agent missing here gets the joint ``reward``."""
    step_rewards: dict[int, float] = field(default_factory=dict)
    """Optional per-step rewards by index into ``steps`` (e.g. a verdict judged against the answer it
    judged); they take precedence over ``agent_rewards`` and ``reward``."""
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the workflow failed (its exception), or None. A failed episode keeps the steps it made
    but is not trained on; it is written to failed_episodes.jsonl."""
