"""Two-player games (``task.name: textarena_two_player``): self-play, and play against a fixed random opponent.

* ``game_selfplay``: each seat is an agent (``players``: ``player_0``, ``player_1``). Map both to one model for
  self-play on one model (SPIRAL, arXiv 2506.24119), or each to its own model. Each prompt names the seat
  ("You play as Player 1"), as SPIRAL's prompts carry the role; the game's own text names it too.
* ``game_vs_random``: one agent plays seat ``seed % 2`` of each game (so a set of problems covers both seats)
  against a fixed opponent (``opponent``): by default a random legal move (uniform over the moves the observation
  lists as available, SPIRAL's ``RandomAgent``; where it lists none, a candidate from the game's text that TextArena
  accepts on a copy of the game: :meth:`~teamrl.domains.environments.textarena.TwoPlayerEnv.random_move`; a game
  where it finds none is refused before training), or an agent, e.g. ``opponent`` on a frozen copy of the untrained
  model (``models.<name>.trainable: false``). Its episodes record ``info["outcome"]``: win, draw or loss;
  ``teamrl eval`` and the evaluations during training report the rates with Wilson 95% intervals
  (:func:`teamrl.metrics.diagnostics.outcome_rates`).

Rewards are terminal, per seat: the game's reward for that seat (TextArena: +1 win, -1 loss, 0 draw;
a game still running after ``max_turns`` moves is a draw) goes to every step of the agent in that seat
(``episode.agent_rewards``). An invalid move makes its step invalid (``algo.format_penalty``); by default
TextArena allows one retry, then the mover loses; ``task.textarena_two_player.invalid_move_rewards`` sets SPIRAL's
rule instead (the first invalid move ends the game, -1.5 the mover / +0.5 the other seat:
:mod:`teamrl.tasks.textarena`). Estimators: any per-agent one (``drmas``), or ``rae`` (SPIRAL's role-conditioned
baseline, :mod:`teamrl.algos.rae`).

Left out: SPIRAL's game history in the prompt beyond what TextArena's observation holds, and its hosted-model
opponents.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from teamrl.domains.environments.textarena import TwoPlayerEnv
from teamrl.tasks.base import Problem, Task
from teamrl.tasks.env import EnvTask, actions_text
from teamrl.team.agents import Parsed, register_agent
from teamrl.team.registry import register_workflow
from teamrl.team.team import Team

__all__ = ["GameSelfPlayConfig", "GameVsRandomConfig", "check_random_player", "game_selfplay", "game_vs_random"]

_GAME_TAG = re.compile(r"^\[GAME\] ?", re.MULTILINE)
_PLAYER_PROMPT = "You play a two-player game. Read the game and write your next move in the required format."


def _parse_move(text: str) -> Parsed:
    return Parsed(text.strip(), valid=bool(text.strip()))


register_agent("player_0", system_prompt=_PLAYER_PROMPT)(_parse_move)
register_agent("player_1", system_prompt=_PLAYER_PROMPT)(_parse_move)
register_agent("opponent", system_prompt=_PLAYER_PROMPT)(_parse_move)


@dataclass(kw_only=True)
class GameSelfPlayConfig:
    """Options of ``game_selfplay``: the agent in each seat."""

    players: tuple[str, str] = ("player_0", "player_1")
    """The agents in seat 0 and seat 1 (two names; map both to one model for self-play on one model)."""
    action_prefix: str = ""
    """Text each move's reply starts with, e.g. '[' (its tokens join the prompt and are not trained; the parsed reply
    is this text + what the model wrote); empty: the model writes the whole reply."""
    action_close: str = ""
    """Text that ends each move's reply, e.g. ']' (generation stops there; appended when the model ends its turn
    without it); empty: none."""
    hide_game_tags: bool = False
    """Drop the '[GAME] ' tags TextArena starts its lines with from the prompt (the untrained 135M model copies
    '[GAME]' as its move; the moves and the text are unchanged)."""
    per_step_rewards: ClassVar[bool] = True  # per-seat rewards of a zero-sum game: Shapley credit must not replace them
    needs_environment: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if len(self.players) != 2 or self.players[0] == self.players[1]:
            raise ValueError(f"players {self.players} must name two different agents, one per seat")

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(self.players)


@dataclass(kw_only=True)
class GameVsRandomConfig:
    """Options of ``game_vs_random``: the agent that plays against the random player."""

    agent: str = "player_0"
    """The agent that plays seat seed % 2 of each game; the other seat is the opponent."""
    opponent: str = "random"
    """The other seat: 'random' (a random legal move: TwoPlayerEnv.random_move), or an agent, e.g. 'opponent' mapped to a frozen
    copy of the untrained model (models.<name>.trainable: false)."""
    action_prefix: str = ""
    """Text each of the agent's replies starts with (see game_selfplay.action_prefix)."""
    action_close: str = ""
    """Text that ends each of the agent's replies (see game_selfplay.action_close)."""
    hide_game_tags: bool = False
    """Drop TextArena's '[GAME] ' line tags from the agent's prompt (see game_selfplay.hide_game_tags)."""
    needs_environment: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.opponent == self.agent:
            raise ValueError(f"opponent {self.opponent!r} is the agent itself; name another agent (e.g. 'opponent' "
                             f"on a frozen model) or 'random'")

    @property
    def agents(self) -> tuple[str, ...]:
        return (self.agent,) if self.opponent == "random" else (self.agent, self.opponent)


def _game_of(task: Task) -> TwoPlayerEnv:
    env = task.make_env() if isinstance(task, EnvTask) else None
    if not isinstance(env, TwoPlayerEnv):
        raise ValueError(f"this workflow plays a two-player game, but task {task.name!r} is not one; set "
                         f"task.name: textarena_two_player")
    return env


async def _play(team: Team, problem: Problem, env: TwoPlayerEnv, seats: dict[int, str],
                cfg: GameSelfPlayConfig | GameVsRandomConfig) -> str:
    """Play one game: seats in ``seats`` are agents, any other seat plays a random legal move; returns the moves."""
    obs = env.reset(problem)
    moves: list[str | None] = []
    rng = random.Random(env.seed)
    for _ in range(env.max_turns):
        seat = env.player
        if seat in seats:
            shown = _GAME_TAG.sub("", obs) if cfg.hide_game_tags else obs
            ask = f"You play as Player {seat}.\n{shown}\n{env.action_format}"
            reply = await team.ask(seats[seat], [{"role": "user", "content": ask}], parse=_parse_move,
                                   prefix=cfg.action_prefix, close=cfg.action_close)
            move = reply.value if reply.valid else None
            turn = env.step(move)
            if turn.info.get("invalid") and reply.step >= 0:
                team.episode.steps[reply.step].valid = False
        else:
            move = env.random_move(rng)
            if move is None:
                raise ValueError(no_random_move(env, len(moves)))
            turn = env.step(move)
        moves.append(move)
        obs = turn.observation
        if turn.done:
            break
    team.episode.agent_rewards.update({name: env.rewards.get(seat, 0.0) for seat, name in seats.items()})
    team.episode.info.update(turns=len(moves), success=env.success, rewards=dict(env.rewards))
    return actions_text(moves)


def no_random_move(env: TwoPlayerEnv, played: int) -> str:
    """Why the random player cannot move, in one line."""
    return (f"TextArena game {env.env_id!r}: the random player found no move the game accepts after {played} "
            f"move(s) (its observation lists none, and TextArena rejected every candidate from its text: the moves "
            f"and examples it writes in brackets, their numbers and squares varied); play it against an agent "
            f"(workflow.game_vs_random.opponent: opponent) or pick another game")


def check_random_player(task: Task, *, games: int = 2) -> None:
    """Refuse, before training, a game the random player cannot play: ``games`` test games (both seats) played by
    random moves in both seats; a ValueError in one line when it finds no move in one of them."""
    for problem in task.problems("test")[:games]:
        env = _game_of(task)  # a fresh game per episode, as the workflows play them (a reused one may hang at reset)
        env.reset(problem)
        rng = random.Random(env.seed)
        for played in range(env.max_turns):
            move = env.random_move(rng)
            if move is None:
                raise ValueError(no_random_move(env, played))
            if env.step(move).done:
                break


def _check_vs_random(cfg: GameVsRandomConfig, task: Task) -> None:
    if cfg.opponent == "random":
        check_random_player(task)


async def game_selfplay(team: Team, problem: Problem, task: Task, cfg: GameSelfPlayConfig) -> str | None:
    """Both seats are agents (self-play when they share a model)."""
    return await _play(team, problem, _game_of(task), dict(enumerate(cfg.players)), cfg)


async def game_vs_random(team: Team, problem: Problem, task: Task, cfg: GameVsRandomConfig) -> str | None:
    """The agent plays seat seed % 2 against the opponent (a random legal-move player or an agent); records win,
    draw or loss."""
    env = _game_of(task)
    seat = int(problem.meta["seed"]) % 2
    seats = {seat: cfg.agent} if cfg.opponent == "random" else {seat: cfg.agent, 1 - seat: cfg.opponent}
    final = await _play(team, problem, env, seats, cfg)
    mine, theirs = env.rewards.get(env.seat, 0.0), env.rewards.get(1 - env.seat, 0.0)
    team.episode.info["outcome"] = "win" if mine > theirs else "loss" if mine < theirs else "draw"
    return final


# per agent: every other move of the game's max_turns (the two seats alternate)
register_workflow("game_selfplay", config=GameSelfPlayConfig, agents=("player_0", "player_1"),
                  calls=lambda o, t: -(-t.max_turns // 2))(game_selfplay)
register_workflow("game_vs_random", config=GameVsRandomConfig, agents=("player_0",),
                  calls=lambda o, t: -(-t.max_turns // 2), check=_check_vs_random)(game_vs_random)
