"""TextArena games as environments: a single-player game by id (``task.name: textarena``).

The observation is the game's text; the action is the reply (the game reads its own bracketed move); the
reward is 0 until the game ends, then the game's reward for the player. ``pip install 'teamrl[textarena]'``.

* Instances are drawn by seed: two seeds are two instances, even when their first observations are equal
  (Minesweeper places its mines, card games deal, after the first move). A game whose play does not depend
  on the seed (TowerOfHanoi-v0) plays the same game in both splits.
* TextArena draws from Python's global ``random`` (it seeds it at reset). Each game keeps its own random
  state and swaps it in around its own calls, so games played side by side, or a copy of one, draw the same
  boards as the game played alone, and the trainer's own random state is left untouched.
* TextArena's invalid-move signal (a move it rejects, a reply without a move) is read after each step: the
  turn carries ``info["invalid"]`` and the workflow records the step as invalid (``algo.format_penalty``).
* A game that cannot be made or played is refused with its cause in one line (:func:`game_cause`): NLTK data
  that is not installed, an API key, a game for another number of players.

``textarena_two_player`` (:class:`TwoPlayerEnv`): a two-player game (``TicTacToe-v0``, ``KuhnPoker-v0``, ...);
``step`` plays the move of the player to move (``player``); when the game ends, ``rewards`` holds each seat's
reward (TextArena's: +1 the winner, -1 the loser, 0 each in a draw; a game still running after ``max_turns``
moves is a draw). The workflows that play it (self-play, against a random player) are in
:mod:`teamrl.domains.environments.games`.

Invalid moves (``invalid_move_rewards``). By default TextArena's rule: a rejected move may be retried once,
a second one loses the game (-1 the mover, +1 the other seat). With ``invalid_move_rewards: [r_mover, r_other]``,
SPIRAL's rule (spiral-rl/spiral @ a02d0ed8d11c57e0ee4a4096e9881866d69a052b, ``train_spiral.py``):

* ``:233`` (training) and ``:678`` (evaluation): ``env.state.error_allowance = 0``, no retry;
* ``:631-645`` (``extract_action``): the reply, stripped, put in brackets when it has none and at most 5 words,
  whitespace collapsed, must be one of the moves the observation lists (``spiral/agents/utils.py``'s parsers);
  anything else is the invalid action;
* ``:317-324``: an invalid action ends the game at once, ``rewards = {0: 0.5, 1: 0.5}; rewards[player_id] = -1.5``:
  SPIRAL trains with ``[-1.5, 0.5]`` (not zero-sum); its evaluation (``:684-693``) scores the same event -1 / +1.

Here a move is invalid when the observation lists moves and the move (formatted as above) is not one of them,
or when TextArena rejects it (games whose observation lists no moves).

Left out: games for more than two players.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from teamrl.tasks.base import Problem
from teamrl.tasks.env import EnvConfig, Turn, register_env

__all__ = ["TextArenaConfig", "TextArenaEnv", "TwoPlayerConfig", "TwoPlayerEnv", "candidate_moves", "game_cause",
           "legal_moves", "make_game", "spiral_move"]

_NLTK = re.compile(r"Resource '?(\w+)'? not found")
_MOVE = re.compile(r"'(\[[^\]']+\])'")
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,60})\]([^\n'\[\]]{0,40})")  # a bracketed text, the rest of its line
_FILES = re.compile(r"(?m)^[ |]*(a(?: +[b-z])+) *$")
_RANKS = re.compile(r"(?m)^ *(\d{1,2}) *\|")
_SIZE = re.compile(r"\b(\d{1,2}) ?x ?(\d{1,2}) board")
_NAMED = re.compile(r"(available|valid|possible|legal) (moves|actions)", re.IGNORECASE)
_TAGS = re.compile(r"^(GAME|ERROR|Player \d+|P\d+)$")  # TextArena's message tags, not moves
# a square (a2, e10), a number, or a placeholder for one ('[play X]', '[attack M O]', '[<number>]', '[row, col]')
_SLOT = re.compile(r"(?<![A-Za-z])([a-z])(\d{1,2})(?!\d)|(\d+)|(<[^<>]{1,20}>|(?<![A-Za-z])(?:[A-Z]|row|col|column|pile|"
                   r"quantity|amount|number|position|index)(?![A-Za-z\d]))")


def legal_moves(observation: str) -> list[str]:
    """The moves a TextArena observation lists as available (its last line naming them), or [].

    >>> legal_moves("[GAME] Board...\\nAvailable Moves: '[0]', '[4]', '[8]'")
    ['[0]', '[4]', '[8]']
    >>> legal_moves("[GAME] Your available actions are: '[check]', '[bet]'")
    ['[check]', '[bet]']
    """
    lines = [line for line in observation.splitlines() if "available" in line.lower()]
    return _MOVE.findall(lines[-1]) if lines else []


def candidate_moves(observation: str, rng: random.Random, *, samples: int = 1024) -> list[str]:
    """Moves to try for a game whose observation lists none, in random order: each bracketed text of the
    observation (the moves and examples the game writes, the moves played so far; not TextArena's tags; with the
    rest of its line too, as in '[Propose] CCAACCCC') and variants of each with its numbers, placeholders ('X',
    '<number>', 'row') and squares changed: every variant of a text with one number (0 to the largest number the
    observation shows, at least 10), else ``samples`` drawn at random, the first square anywhere on the board the
    observation's squares, its board's labels or its size ('an 8x8 board') span (at least a-e, 1-5), a later one
    within two files and ranks of it (a piece's step).
    :meth:`TwoPlayerEnv.random_move` keeps the first the game accepts.

    >>> sorted(candidate_moves("[GAME] Drop a disc: '[col 4]' (columns 0 to 6).", random.Random(0)))[:3]
    ['[col 0]', '[col 10]', '[col 1]']
    >>> len(candidate_moves("[GAME] Drop a disc: '[col 4]' (columns 0 to 6).", random.Random(0)))
    11
    """
    found = [(t.strip(), rest.strip()) for t, rest in _BRACKETED.findall(observation) if not _TAGS.match(t.strip())]
    texts = list(dict.fromkeys(t for t, _ in found))
    numbers = [int(n) for n in re.findall(r"\d+", observation) if len(n) <= 3]
    top = max([10, *[n for n in numbers if n <= 100]])
    squares = [m for t in texts for m in _SLOT.finditer(t) if m.group(1)]
    labels = _FILES.findall(observation)  # a board's file letters ('a b c d e f g h') and rank numbers ('8 |')
    sizes = [(int(r), int(c)) for r, c in _SIZE.findall(observation) if 0 < int(c) <= 26]  # 'an 8x8 board'
    files = max([ord("e"), *[ord(m.group(1)) for m in squares], *[ord(f[-1]) for f in labels],
                 *[ord("a") + c - 1 for _, c in sizes]])
    ranks = max([5, *[int(m.group(2)) for m in squares], *[int(r) for r in _RANKS.findall(observation)],
                 *[r for r, _ in sizes]])
    out = {f"[{t}]" for t in texts} | {f"[{t}] {rest}" for t, rest in found if rest and len(rest.split()) <= 3}
    for text in texts:
        slots = list(_SLOT.finditer(text))
        if any(m.group(1) or m.group(3) for m in slots):  # '[col 4]': the word is the move's, the number varies
            slots = [m for m in slots if not (m.group(4) and m.group(4)[0].islower())]
        if len(slots) == 1 and not slots[0].group(1):  # one number: every value
            m = slots[0]
            out |= {f"[{text[:m.start()]}{v}{text[m.end():]}]" for v in range(top + 1)}
            continue
        for _ in range(samples if slots else 0):
            parts, last, first = [], 0, None
            for m in slots:
                if not m.group(1):
                    value = str(rng.randint(0, top))
                elif first is None:
                    first = (rng.randint(ord("a"), files), rng.randint(1, ranks))
                    value = f"{chr(first[0])}{first[1]}"
                else:
                    f = min(max(first[0] + rng.randint(-2, 2), ord("a")), files)
                    value = f"{chr(f)}{min(max(first[1] + rng.randint(-2, 2), 1), ranks)}"
                parts += [text[last:m.start()], value]
                last = m.end()
            out.add(f"[{''.join(parts)}{text[last:]}]")
    moves = sorted(out)
    rng.shuffle(moves)
    return moves


def spiral_move(text: str) -> str:
    """A reply formatted as SPIRAL's ``extract_action`` does before checking it against the listed moves:
    stripped, put in brackets when it has none and at most 5 words, whitespace collapsed.

    >>> spiral_move(" [4]\\n"), spiral_move("bet"), spiral_move("[4]  and [5]"), spiral_move("I would play the centre")
    ('[4]', '[bet]', '[4] and [5]', '[I would play the centre]')
    """
    move = text.strip()
    if "[" not in move and "]" not in move and len(move.split()) <= 5:
        move = f"[{move}]"
    return re.sub(r"\s+", " ", move).strip()


def game_cause(exc: BaseException) -> str:
    """Why a TextArena game cannot be made or played, in one line.

    >>> game_cause(LookupError("\\n****\\n  Resource 'words' not found.\\n  Please use the NLTK Downloader"))
    "it needs the NLTK data 'words', which is not installed (python -m nltk.downloader words; it downloads from the internet)"
    >>> game_cause(AssertionError("The number of players has to be 2, received 1"))
    'it is a game for another number of players (TextArena: The number of players has to be 2, received 1)'
    """
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip().strip("*")), "") or type(exc).__name__
    if isinstance(exc, LookupError) and (m := _NLTK.search(text)):
        return (f"it needs the NLTK data '{m.group(1)}', which is not installed (python -m nltk.downloader "
                f"{m.group(1)}; it downloads from the internet)")
    if "player" in text.lower() and isinstance(exc, (AssertionError, ValueError)):
        return f"it is a game for another number of players (TextArena: {first})"
    if "API key" in text or "API_KEY" in text:
        return f"it calls a hosted model and needs its API key (TextArena: {first})"
    if isinstance(exc, FileNotFoundError):
        return f"the installed TextArena lacks a file it reads ({first})"
    if isinstance(exc, (SyntaxError, ImportError)):
        return f"the installed TextArena's code for it does not import ({type(exc).__name__}: {first})"
    return f"{type(exc).__name__}: {first}"


def make_game(env_id: str) -> Any:
    """A TextArena game by id (its default wrappers), or a ValueError naming the cause."""
    from teamrl.tasks.base import require

    ta = require("textarena", "textarena")
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # NLTK prints its failed downloads
            return ta.make(env_id=env_id)
    except Exception as exc:  # textarena raises its own error types (and asserts) for unknown or broken games
        raise ValueError(f"TextArena game {env_id!r} cannot be made: {game_cause(exc)}") from None


class SeededGame:
    """A TextArena game with its own random state (see the module docstring); shared by the game workflows."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.game: Any = make_game(env_id)
        self._random: Any = None

    @contextlib.contextmanager
    def own_random(self) -> Iterator[None]:
        """Run the game's calls with its own random state; the caller's state is restored after."""
        outer = random.getstate()
        if self._random is not None:
            random.setstate(self._random)
        try:
            yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def reset_game(self, num_players: int, seed: int) -> None:
        """Reset the game for ``num_players`` with ``seed`` (TextArena seeds ``random`` with it)."""
        try:
            with self.own_random():
                self.game.reset(num_players=num_players, seed=seed)
        except Exception as exc:
            raise ValueError(f"TextArena game {self.env_id!r} does not play with {num_players} player(s): "
                             f"{game_cause(exc)}") from None

    def step_game(self, action: str) -> tuple[bool, bool]:
        """Play ``action`` for the player to move; returns (done, invalid): TextArena rejected the move (its error
        count rose, or the game ended on an invalid move)."""
        state = self.game.state
        pid = state.current_player_id
        errors, flagged = getattr(state, "error_count", 0), bool(state.game_info[pid].get("invalid_move"))
        with self.own_random():
            done, _ = self.game.step(action)
        invalid = (getattr(state, "error_count", 0) > errors
                   or (bool(state.game_info[pid].get("invalid_move")) and not flagged))
        return bool(done), invalid


@dataclass(kw_only=True)
class TextArenaConfig(EnvConfig):
    env_id: str = "GuessTheNumber-v0"
    """A single-player TextArena game id (textarena.envs.registration.ENV_REGISTRY)."""
    max_turns: int = 10
    """Most turns per episode (the game may end sooner)."""


@register_env("textarena", config=TextArenaConfig)
class TextArenaEnv(SeededGame):
    """A single-player TextArena game; one game per episode."""

    action_format = "Write your move as the game asks (usually inside square brackets, e.g. [5])."

    def __init__(self, cfg: TextArenaConfig) -> None:
        super().__init__(cfg.env_id)
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.seed = -1
        self.won = False

    def reset(self, problem: Problem) -> str:
        self.seed = int(problem.meta["seed"])
        self.reset_game(1, self.seed)
        self.won = False
        return self.game.get_observation()[1]

    def instance(self) -> str:
        """What tells two instances apart: the seed (the board may be drawn after the first move)."""
        return f"seed {self.seed}"

    def parse_action(self, text: str) -> str | None:
        return text.strip() or None

    def step(self, action: Any | None) -> Turn:
        done, invalid = self.step_game(str(action or ""))
        flag = {"invalid": True} if invalid else {}
        if not done:
            msg = "TextArena rejected the move" if invalid else ""
            return Turn(self.game.get_observation()[1], 0.0, False, {"message": msg, **flag})
        rewards, game_info = self.game.close()
        reward = float((rewards or {}).get(0, 0.0))
        self.won = reward >= 1.0  # some games give partial credit for a loss (GuessTheNumber: closeness)
        reason = str((game_info or {}).get(0, {}).get("reason", ""))
        return Turn(reason, reward, True, {"message": reason, **flag})

    @property
    def success(self) -> bool:
        return self.won


@dataclass(kw_only=True)
class TwoPlayerConfig(EnvConfig):
    env_id: str = "TicTacToe-v0"
    """A two-player TextArena game id (TicTacToe-v0, KuhnPoker-v0, ...)."""
    max_turns: int = 9
    """Most moves of both players together; a game still running after them is a draw (SPIRAL: truncation)."""
    invalid_move_rewards: tuple[float, float] | None = None
    """SPIRAL's invalid-move rule: the first invalid move (not among the moves the observation lists, or one
    TextArena rejects) ends the game; the mover gets the first reward, the other seat the second (SPIRAL trains
    with [-1.5, 0.5]). None: TextArena's rule (one retry, then the mover loses, -1 / +1)."""

    def __post_init__(self) -> None:
        r = self.invalid_move_rewards
        if r is not None and (len(r) != 2 or not all(math.isfinite(x) for x in r)):
            raise ValueError(f"invalid_move_rewards {r} must be two finite numbers [mover, other seat], e.g. "
                             f"[-1.5, 0.5] (SPIRAL's), or null for TextArena's rule")


@register_env("textarena_two_player", config=TwoPlayerConfig)
class TwoPlayerEnv(SeededGame):
    """A two-player TextArena game; ``step`` plays for the player to move. ``seat`` (the seed's parity, so a set of
    problems covers both seats) is the seat a single agent plays against a fixed opponent; ``success``: it won."""

    action_format = "Write your move as the game asks, inside square brackets (e.g. [4])."

    def __init__(self, cfg: TwoPlayerConfig) -> None:
        super().__init__(cfg.env_id)
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.seed, self.seat = -1, 0
        self.rewards: dict[int, float] = {}
        self.moves = 0
        self.last_observation = ""

    def reset(self, problem: Problem) -> str:
        self.seed = int(problem.meta["seed"])
        self.seat = self.seed % 2
        self.reset_game(2, self.seed)
        if self.cfg.invalid_move_rewards is not None:
            self.game.state.error_allowance = 0  # SPIRAL: no retry
        self.rewards, self.moves = {}, 0
        self.last_observation = self.observation()
        return self.last_observation

    @property
    def player(self) -> int:
        """The seat to move (0 or 1)."""
        return int(self.game.state.current_player_id)

    def observation(self) -> str:
        """What the player to move sees (TextArena's text for that seat)."""
        return str(self.game.get_observation()[1])

    def random_move(self, rng: random.Random) -> str | None:
        """A random move the game accepts for the player to move: one the observation lists (uniformly), else the
        first that TextArena does not reject when played on a copy of the game (its own legality check) of: the
        bracketed moves of the last line naming moves ("Valid moves: [2, 3], ...", "Your possible actions: ...",
        in random order), then :func:`candidate_moves` (uniform over the accepted candidates, not over every legal
        move); None when it accepts none of the first 2000."""
        listed = legal_moves(self.last_observation)
        if listed:
            return rng.choice(listed)
        named = [line for line in self.last_observation.splitlines() if _NAMED.search(line)]  # unquoted lists
        offered = sorted({f"[{t.strip()}]" for t, _ in _BRACKETED.findall(named[-1])} if named else set())
        rng.shuffle(offered)
        for move in [*offered, *candidate_moves(self.last_observation, rng)][:2000]:  # 0.3-0.7 ms a try
            trial = copy.deepcopy(self)
            try:
                _, invalid = trial.step_game(move)
            except Exception:  # noqa: BLE001  (a game whose code fails on the move: not a move it accepts)
                continue
            if not invalid:
                return move
        return None

    def instance(self) -> str:
        """Instances are told apart by seed (cards are dealt, boards drawn, after the first observation)."""
        return f"seed {self.seed}"

    def parse_action(self, text: str) -> str | None:
        return text.strip() or None

    def step(self, action: Any | None) -> Turn:
        """Play ``action`` for the player to move; the turn's reward is that player's once the game ends."""
        mover, spiral = self.player, self.cfg.invalid_move_rewards
        move = str(action or "")
        listed = legal_moves(self.last_observation) if spiral is not None else []
        if listed and spiral_move(move) not in listed:
            done, invalid = True, True  # SPIRAL's extract_action: not a listed move (the game is not stepped)
        else:
            done, invalid = self.step_game(spiral_move(move) if listed else move)
        self.moves += 1
        flag = {"invalid": True} if invalid else {}
        if invalid and spiral is not None:
            done, self.rewards = True, {mover: float(spiral[0]), 1 - mover: float(spiral[1])}
        elif done:
            rewards, _ = self.game.close()
            self.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        elif self.moves >= self.max_turns:
            done, self.rewards = True, {0: 0.0, 1: 0.0}  # truncated: a draw
        if done:
            msg = f"game over: rewards {self.rewards}"
            return Turn(msg, self.rewards.get(mover, 0.0), True, {"message": msg, "player": mover, **flag})
        msg = "TextArena rejected the move" if invalid else ""
        self.last_observation = self.observation()
        return Turn(self.last_observation, 0.0, False, {"message": msg, "player": mover, **flag})

    @property
    def success(self) -> bool:
        return self.rewards.get(self.seat, 0.0) > 0
