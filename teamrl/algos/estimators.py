"""Advantage estimators by name: the four knobs of :mod:`teamrl.algos.advantages` (``scope``, ``unit``,
``center``, ``scale``) as one :class:`Estimator`, and the presets (GRPO, Dr. MAS, AT-GRPO and its grouping without tree sampling, MAGRPO,
RLOO, Dr. GRPO, REINFORCE++, MARS2's tree groups, SPIRAL's RAE) that ``algo.estimator`` names; see
``docs/advantages.md``."""

from __future__ import annotations

from dataclasses import dataclass, field

from teamrl.suggest import did_you_mean

__all__ = ["CENTERS", "PRESETS", "SCALES", "SCOPES", "UNITS", "Estimator", "get_estimator", "register_estimator"]

SCOPES = ("prompt", "prompt+agent", "prompt+agent+turn", "prompt+turn", "tree", "tree+agent+turn", "agent", "branch")
UNITS = ("episode", "step")
CENTERS = ("mean", "leave_one_out", "none", "role_ema")
SCALES = ("std", "none", "batch_std")


def check_choice(name: str, value: object, options: tuple[str, ...]) -> None:
    """Raise ValueError unless ``value`` is one of ``options``."""
    if isinstance(value, str) and value in options:
        return
    raise ValueError(f"{name}={value!r} is not valid: choose one of {list(options)}{did_you_mean(value, options)}")


@dataclass(frozen=True)
class Estimator:
    """One setting of the four advantage knobs.

    Args:
        scope: which rows form a group, one of ``SCOPES``.
        unit: ``"step"`` (each row is a sample) or ``"episode"`` (each episode
            in the group is one sample, the mean of its rows), one of ``UNITS``.
        center: baseline, one of ``CENTERS``.
        scale: divisor, one of ``SCALES``.

    Raises:
        ValueError: a knob value is not one of its valid options.

    >>> Estimator("prompt+agent", "step", "mean", "std")
    Estimator(scope='prompt+agent', unit='step', center='mean', scale='std')
    """

    scope: str
    unit: str
    center: str
    scale: str
    pool: int = field(default=1, repr=False)
    """Problems pooled into one group: a row's problem counts as prompt index // pool (``algo.group_pool``)."""

    def __post_init__(self) -> None:
        if self.pool < 1:
            raise ValueError(f"pool {self.pool} must be >= 1 (1: one group per problem)")
        check_choice("scope", self.scope, SCOPES)
        check_choice("unit", self.unit, UNITS)
        check_choice("center", self.center, CENTERS)
        check_choice("scale", self.scale, SCALES)


PRESETS: dict[str, Estimator] = {
    # Vanilla GRPO (https://arxiv.org/abs/2402.03300), Dr. MAS Eq. 2.
    "grpo": Estimator("prompt", "episode", "mean", "std"),
    # Global step-level normalization.
    "grpo_step": Estimator("prompt", "step", "mean", "std"),
    "agent_episode": Estimator("prompt+agent", "episode", "mean", "std"),
    # Dr. MAS Eq. 5 (https://arxiv.org/abs/2602.08847).
    "drmas": Estimator("prompt+agent", "step", "mean", "std"),
    # AT-GRPO (https://arxiv.org/abs/2510.11062): the K candidates one agent sampled at one turn from one
    # state of a tree-sampling workflow (env_single_tree, env_team_tree) form a group.
    "at_grpo": Estimator("tree+agent+turn", "step", "mean", "std"),
    # AT-GRPO's agent-and-turn key without its tree sampling: rows of independent episodes grouped by
    # (prompt, agent, the agent's call index); their histories differ.
    "agent_turn": Estimator("prompt+agent+turn", "step", "mean", "std"),
    # MAGRPO (https://arxiv.org/abs/2508.04652); rewards are joint reward-to-go.
    "magrpo": Estimator("prompt+turn", "episode", "mean", "std"),
    # RLOO (https://arxiv.org/abs/2402.14740).
    "rloo": Estimator("prompt", "episode", "leave_one_out", "none"),
    # Dr. GRPO (https://arxiv.org/abs/2503.20783).
    "dr_grpo": Estimator("prompt", "episode", "mean", "none"),
    # REINFORCE++ with a group baseline (https://arxiv.org/abs/2501.03262).
    "reinforce_pp": Estimator("prompt", "episode", "mean", "batch_std"),
    # MARS2 tree-level groups (https://arxiv.org/abs/2602.07848): every node of one tree, all agents and depths.
    "tree": Estimator("tree", "step", "mean", "std"),
    # SPIRAL's role-conditioned advantage estimation (https://arxiv.org/abs/2506.24119): reward minus a running
    # mean of the reward of the same role (agent) in the same game, kept across steps (teamrl/algos/rae.py).
    "rae": Estimator("agent", "episode", "role_ema", "none"),
    # C3 (https://arxiv.org/abs/2603.06859, EIT-EAST-Lab/C3 reward_only): on a prefix tree of calls
    # (rollout.prefix_tree), each node's subtree-mean return minus its siblings' leave-one-out mean, z-scored among
    # its siblings (teamrl/algos/c3.py, teamrl/scoring/c3.py).
    "c3": Estimator("branch", "step", "leave_one_out", "std"),
}


def get_estimator(name: str) -> Estimator:
    """Look up a preset estimator by name.

    Args:
        name: a key of ``PRESETS`` (built in or added by ``register_estimator``).

    Returns:
        The ``Estimator`` registered under ``name``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the presets.

    >>> get_estimator("drmas")
    Estimator(scope='prompt+agent', unit='step', center='mean', scale='std')
    """
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    raise ValueError(
        f"unknown advantage estimator {name!r}{did_you_mean(name, PRESETS)} "
        f"(presets: {', '.join(sorted(PRESETS))}; add one with register_estimator)"
    )


def register_estimator(name: str, est: Estimator) -> None:
    """Add a named estimator to ``PRESETS``.

    Args:
        name: a new, non-empty name.
        est: the knob setting to register.

    Returns:
        None. ``get_estimator(name)`` returns ``est`` afterwards.

    Raises:
        ValueError: ``name`` is empty or already taken, or ``est`` is not an
            ``Estimator``.

    >>> register_estimator("doc_agent_loo", Estimator("prompt+agent", "step", "leave_one_out", "none"))
    >>> get_estimator("doc_agent_loo").center
    'leave_one_out'
    >>> del PRESETS["doc_agent_loo"]
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
    if not isinstance(est, Estimator):
        raise ValueError(
            f"est must be an Estimator, got {type(est).__name__}; "
            "build one with Estimator(scope, unit, center, scale)"
        )
    if name in PRESETS:
        raise ValueError(
            f"estimator {name!r} is already registered as {PRESETS[name]}; pick another name"
        )
    PRESETS[name] = est
