"""PettingLLMs' Sokoban (``task.sokoban.variant: pettingllms``): rooms, seeds, rewards, step cap, parsers, prompts.

Facts from pettingllms-ai/PettingLLMs @ a054fb18, ``pettingllms/multi_agent_env/stateful/`` (``env_state.py``'s
``SokobanGridEnvState``, ``utils.py``, ``prompt.py``, ``agents/``; line numbers are those files'):

* **Rooms**: :func:`~teamrl.domains.environments.sokoban_rooms.generate_room` with ``env_state.py:1313-1324``'s
  settings; the room's side is ``task.sokoban.size`` (PettingLLMs' ``env.map_size``, default 16 at
  ``env_state.py:1307-1308``; its Sokoban script sets 6) and one box (``num_boxes=1`` there; ``boxes`` here).
* **Seeds** (``stateful_env.py:103-129``): training problem i is the room of seed ``seed`` + i (PettingLLMs: the
  index of the problem over the run, step × batch + i, so every step sees new rooms), test problem i the room of
  100000 + ``seed`` + i. The splits are not kept apart (at size 6, 61 of the 100 test rooms are training rooms of
  seeds 0-6399, and seeds 0-6399 give 4077 distinct rooms).
* **Rewards per move** (``env_state.py:1273-1281``, ``:1594-1662``): −0.01 for a valid move, −0.05 for an invalid
  one (into a wall, off the grid, a box against a wall or a box, a string other than U, D, L, R; the player stays);
  +1 when the move pushes a box onto a goal, −0.5 when it pushes one off; potential shaping 0.1 · (0.99 · φ(after)
  − φ(before)) with φ = −(sum over boxes of the distance to the nearest goal), so a move that pushes nothing earns
  0.001 · that distance; +10 when every box is on a goal, and −5 when the episode's moves (valid or not) reach
  ``max_steps`` (200), both ending the episode. An action is a list of moves applied in order until the episode
  ends (``:1584-1592``); a list holding anything but strings gets −1 and moves nothing (``:1577-1582``); a plan
  reply without a list moves nothing (its agent steps the empty list, ``agents/plan_agent.py:74-77``): reward 0.
* **Parsing**: the plan's reply is read as ``utils.py:22-65`` reads it (:func:`parse_plan_action`), the tool's
  program output as ``:100-174`` does (:func:`parse_program_output`).
* **Prompts**: the tool's (``agents/tool_agent.py:39-82`` with ``prompt.py:124-154``) and the plan's
  (``agents/plan_agent.py:52-66`` with ``prompt.py:102-122``), one user message each, no system prompt
  (``trainer/async_generate.py:810-815``).

Differences: a seed whose room cannot be generated is skipped (PettingLLMs' batch would stop with the error; no
seed of 0-6399 or 100000-100099 fails at size 6); ``success`` is a win only (PettingLLMs' plan agent also counts
the step cap, ``plan_agent.py:89-92``); the tool's code is read from a ```python block (PettingLLMs runs the
whole reply when it has none, ``utils.py:97``).
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from teamrl.domains.environments.sokoban_rooms import Room, RoomError, generate_room
from teamrl.tasks.base import Problem
from teamrl.tasks.env import Turn

if TYPE_CHECKING:
    from teamrl.domains.environments.env_steps import ToolReport

__all__ = ["SokobanPettingLLMs", "parse_plan_action", "parse_program_output"]

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
TEST_SEEDS = 100_000  # stateful_env.py:106-107: test seeds start here
_PLAN_LINE = re.compile(r"(?m)^\s*####\s+(.+)$", re.DOTALL)  # utils.py:30


@functools.lru_cache(maxsize=65536)
def _room(seed: int, size: int, boxes: int) -> Room:
    return generate_room(seed, size=size, boxes=boxes)


def parse_plan_action(text: str) -> list[Any] | None:
    """The plan reply's action: the text from the first line starting with ``####`` (and a space) to the end, when
    it is a Python or JSON list, or bracketed moves without quotes (utils.py:22-65); an empty list counts as none
    (the plan agent gets −2 for it, plan_agent.py:85-86).

    >>> parse_plan_action('I push right.\\n#### ["R", "R"]')
    ['R', 'R']
    >>> parse_plan_action("#### [U, L]"), parse_plan_action('#### ["R"] then more'), parse_plan_action("#### []")
    (['U', 'L'], None, None)
    """
    found = _PLAN_LINE.findall(text)
    if not found:
        return None
    s = found[-1].strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    for load in (ast.literal_eval, json.loads):
        try:
            value = load(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, list):
            return value or None
    moves = [m.strip().strip("\"'") for m in s[1:-1].split(",")]
    moves = [m for m in moves if m]
    return moves if moves and all(m in MOVES for m in moves) else None


def parse_program_output(text: str) -> list[Any] | None:
    """The action a tool program printed (utils.py:100-174): the last ``**Actions List**: [...]`` (up to the first
    ``]``), else the last ``Actions: [...]``, else the first line that is a list; any list (the empty list too).
    Literals only (PettingLLMs evaluates the text as Python).

    >>> parse_program_output('BFS done\\n**Actions List**: ["U", "R"]\\n')
    ['U', 'R']
    >>> parse_program_output("[]"), parse_program_output("error: timeout [1]")
    ([], None)
    """
    if text.startswith("error:"):
        return None
    for pattern in (r"\*\*Actions List\*\*:\s*(\[.*?\])", r"Actions:\s*(\[.*?\])"):
        found = re.findall(pattern, text, re.DOTALL)
        if found:
            value = _literal(found[-1])
            if isinstance(value, list):
                return value
    for line in text.strip().split("\n"):
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            value = _literal(line)
            if isinstance(value, list):
                return value
    return None


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


class SokobanPettingLLMs:
    """Push the box onto its goal, in PettingLLMs' rooms with its rewards (module docstring)."""

    action_format = 'End with a line #### and a JSON list of moves U, D, L, R, e.g. #### ["U", "L"].'
    distinct_instances = False  # PettingLLMs' splits share rooms
    R_STEP, R_INVALID, R_ON, R_OFF, R_WIN, R_FAIL = -0.01, -0.05, 1.0, -0.5, 10.0, -5.0  # env_state.py:1273-1278
    GAMMA, LAMBDA = 0.99, 0.1  # env_state.py:1279-1280

    def __init__(self, cfg: Any) -> None:
        self.cfg, self.max_turns = cfg, cfg.max_turns
        self.walls: frozenset[tuple[int, int]] = frozenset()
        self.goals: frozenset[tuple[int, int]] = frozenset()
        self.boxes: set[tuple[int, int]] = set()
        self.player, self.size = (0, 0), (0, 0)
        self.moves, self.done, self.phi = 0, False, 0.0

    def problem_seeds(self, split: str) -> Iterator[int]:
        """The room seeds of a split's problems in order (stateful_env.py:103-129), skipping seeds without a room."""
        start = self.cfg.seed + (TEST_SEEDS if split == "test" else 0)
        for seed in itertools.count(start):
            try:
                _room(seed, self.cfg.size, self.cfg.boxes)
            except RoomError:
                continue
            yield seed

    def reset(self, problem: Problem) -> str:
        room = _room(int(problem.meta["seed"]), self.cfg.size, self.cfg.boxes)
        self.walls, self.goals, self.boxes, self.player = room.walls, room.goals, set(room.boxes), room.player
        self.size, self.moves, self.done = (room.height, room.width), 0, False
        self.phi = self._potential()
        return self.render()

    def grid(self) -> str:
        """The room as PettingLLMs prints it (env_state.py:1392-1416): # wall, @ player (+ on a goal), $ box (* on a
        goal), . goal, space floor."""
        def cell(p: tuple[int, int]) -> str:
            if p in self.walls:
                return "#"
            if p == self.player:
                return "+" if p in self.goals else "@"
            if p in self.boxes:
                return "*" if p in self.goals else "$"
            return "." if p in self.goals else " "
        return "\n".join("".join(cell((r, c)) for c in range(self.size[1])) for r in range(self.size[0]))

    def render(self) -> str:
        """What the plan agent is told about the state (prompt.py:102-122)."""
        return _PLAN_STATE.format(on=self._on_goals(), total=len(self.boxes), grid=self.grid())

    def parse_action(self, text: str) -> list[Any] | None:
        return parse_plan_action(text)

    def parse_program_output(self, text: str) -> list[Any] | None:
        return parse_program_output(text)

    def _on_goals(self) -> int:
        return len(self.boxes & self.goals)

    def _potential(self) -> float:
        if not self.boxes or not self.goals:
            return 0.0
        return -float(sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in self.goals) for b in self.boxes))

    def _move(self, move: str) -> float:
        """One move's reward (env_state.py:1594-1662)."""
        dr, dc = MOVES.get(move, (0, 0))
        nxt = (self.player[0] + dr, self.player[1] + dc)
        beyond = (nxt[0] + dr, nxt[1] + dc)
        inside = lambda p: 0 <= p[0] < self.size[0] and 0 <= p[1] < self.size[1]  # noqa: E731
        valid = move in MOVES and inside(nxt) and nxt not in self.walls and not (
            nxt in self.boxes and (not inside(beyond) or beyond in self.walls or beyond in self.boxes))
        reward = self.R_STEP if valid else self.R_INVALID
        if valid and nxt in self.boxes:
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            change = (beyond in self.goals) - (nxt in self.goals)
            reward += self.R_ON if change > 0 else self.R_OFF if change < 0 else 0.0
        after = self._potential()
        reward += self.LAMBDA * (self.GAMMA * after - self.phi)
        self.player = nxt if valid else self.player
        self.phi, self.moves = after, self.moves + 1
        if self.success:
            reward, self.done = reward + self.R_WIN, True
        elif self.moves >= self.cfg.max_steps:
            reward, self.done = reward + self.R_FAIL, True
        return reward

    def step(self, action: Any | None) -> Turn:
        if self.done:
            return Turn(self.render(), 0.0, True, {"message": "the episode is over"})
        if action is None:  # the plan agent steps the empty list (plan_agent.py:74-77)
            return Turn(self.render(), 0.0, False, {"message": "no move list found", "invalid": True})
        if not isinstance(action, list) or not all(isinstance(m, str) for m in action):
            return Turn(self.render(), -1.0, False, {"message": "the action is not a list of moves", "invalid": True})
        reward, start = 0.0, self.moves
        for move in action:
            reward += self._move(move)
            if self.done:
                break
        msg = f"{self.moves - start} moves; {self._on_goals()} of {len(self.boxes)} boxes on goals"
        return Turn(self.render(), reward, self.done, {"message": msg})

    @property
    def success(self) -> bool:
        return bool(self.boxes) and self.boxes <= self.goals

    def tool_prompt(self, turn: int) -> str:
        """The tool agent's prompt (tool_agent.py:39-82, prompt.py:124-154)."""
        return _TOOL.format(on=self._on_goals(), total=len(self.boxes), grid=self.grid())

    def plan_prompt(self, turn: int, report: ToolReport | None) -> str:
        """The plan agent's prompt with the tool's program, output and action it reads (plan_agent.py:52-66); before
        any tool acted: empty, as the state starts (env_state.py:17-20)."""
        program, output, action = ("", "", []) if report is None else (report.program, report.output, report.action)
        program = program.strip()  # PettingLLMs keeps the code stripped (utils.py:78)
        return (_PLAN_HEAD + self.render() + f"Here is code agent's code: {program}.\n"
                f"Here is code agent's execution output: {output}. Here is code agent's action: {action}.\n")


# The prompt texts, as PettingLLMs' agents compose them (what the model reads).
_PLAN_HEAD = (  # plan_agent.py:52-54
    "You are a planning and reasoning agent. You will receive: The original task description, The Code Agent’s code, "
    "The code execution output. Your job is to reason carefully, decide the final action, and format your response "
    "exactly as specified. Instructions: Read the task, inspect the code, and verify the execution output against the "
    "task requirements. If the code/output is correct and sufficient, adopt it; otherwise, improve or override it "
    "with your own reasoning. Keep your reasoning concise but explicit: justify why the final action is correct. "
    "Formatting is mandatory. Output the action list after a ####. "
    "Format: output a single JSON list of moves after #### (e.g., a list of 'U','D','L','R'). Do not output "
    "placeholders. Please think step by step. Do not directly give the final action list. \n")
_PLAN_STATE = (  # prompt.py:108-122
    "You are solving a Sokoban puzzle (push boxes onto goals).\n"
    "Legend: '#' wall, ' ' floor, '.' goal, '$' box, '@' player, '*' box on goal, '+' player on goal.\n"
    "Moves: U/D/L/R (cannot walk through walls; to move a box, walk into it with empty space behind).\n"
    "Success: all boxes are on goals. If already solved, return an empty list.\n\n"
    "Boxes on goals: {on}/{total}\n"
    "Current state:\n```\n{grid}\n```\n\n"
    "Hints: \n"
    "- Enumerate pushable moves: to push a box at (br,bc) by (dr,dc), ensure player can reach (br-dr,bc-dc) and the "
    "destination (br+dr,bc+dc) is empty and not a wall/box.\n"
    "- Deadlock avoidance: avoid pushing boxes into corners or along walls where no goal exists; avoid locking two "
    "boxes side-by-side against walls.\n"
    "- If cannot solve fully, return a short valid push sequence.\n\n")
_TOOL = (  # tool_agent.py:39-56, prompt.py:130-154
    "You are an AI assistant specialized in solving planning problems through code generation. Since your code will "
    "be executed directly, you need to print the final result. Instructions:\n"
    "1. Write the whole Python code enclosed in only one ```python ``` \n"
    "2. Your code should output an action sequence using print() \n"
    "Programming task: Implement a Sokoban solver.\n"
    "Implement solve_sokoban(observation: str) -> List[str] that returns a move sequence using only "
    "'U','D','L','R'.\n\n"
    "Input:\n"
    "- observation: the level grid as a multiline string.\n"
    "  Legend: '#' wall, ' ' floor, '.' goal, '$' box, '@' player, '*' box on goal, '+' player on goal.\n"
    "- Progress: {on}/{total} boxes on goals.\n"
    "- Current state:\n```\n{grid}\n```\n\n"
    "Your code must:\n"
    "1) print the final result.\n"
    "2) Define solve_sokoban(observation: str) -> List[str].\n"
    "3) Compute the actions from the given observation.\n"
    "4) Print the final result using EXACTLY one of these formats:\n"
    "   - **Actions List**: [\"U\",\"R\",\"D\",\"L\"]\n"
    "Rules:\n"
    "- The player moves U/D/L/R and cannot pass through walls; to push a box, you must move into it and the "
    "destination cell behind must be empty or a goal.\n"
    "- Success: all boxes are on goals.\n\n"
    "- Deadlock avoidance: avoid non-goal corners and bad wall locks.\n"
    "- If you cannot fully solve it, still print a short valid sequence that makes progress.\n\n"
    "template:\n```python\n```\n"
    "3. Your code must compute moves from the given state; \n"
    "4. Output format must be EXACTLY: **Actions List**: [\"U\",\"D\",\"L\",\"R\"] (or empty []).\n"
    "5. Remember, please do not return the result directly, you need to print the final result. \n"
    "6. Please use algorithm like BFS or A* to solve the problem. Very important, print the final result. \n"
    "7. ⚠️ Important: Your solution MUST write output using print() to print the final result.\n\n")
