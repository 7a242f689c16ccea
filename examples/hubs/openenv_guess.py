"""An OpenEnv environment written in OpenEnv's own server API: guess a hidden number from 1 to ``high``.

``GuessEnvironment`` is an ``openenv.core.env_server.Environment`` with typed ``GuessAction`` / ``GuessObservation``
and a ``Rubric`` that sets each step's reward (1.0 for the right number, else -0.1; 0 for a reply without one). It
runs in-process under teamrl (``task.openenv.env_id: examples.hubs.openenv_guess:GuessEnvironment``), or behind
OpenEnv's own HTTP server: ``python examples/hubs/openenv_guess.py --port 8765`` serves it on 127.0.0.1, and
``task.openenv.url: http://127.0.0.1:8765`` drives that server.
"""

from __future__ import annotations

import random
import re
import sys
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric


class GuessAction(Action):
    message: str
    """The model's reply; the last number in it is the guess."""


class GuessObservation(Observation):
    feedback: str = ""


def guess_of(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class GuessRubric(Rubric):
    def __init__(self, target: list[int]) -> None:
        super().__init__()
        self.target = target  # [the hidden number], shared with the environment

    def forward(self, action: Any, observation: Any) -> float:
        guess = guess_of(action.message)
        if guess is None:
            return 0.0
        return 1.0 if guess == self.target[0] else -0.1


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 8) -> None:
        self.high, self.target = high, [1]
        super().__init__(rubric=GuessRubric(self.target))
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target[0] = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=f"I picked a whole number from 1 to {self.high}. Guess it.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        guess = guess_of(action.message)
        if guess is None:
            feedback, done = "No number found. Reply with one number.", False
        elif guess == self.target[0]:
            feedback, done = "Correct!", True
        else:
            feedback, done = ("Higher." if guess < self.target[0] else "Lower."), False
        obs = GuessObservation(feedback=feedback, done=done)
        obs.reward = self._apply_rubric(action, obs)
        return obs

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":  # OpenEnv's own server for this environment, on loopback
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8765
    app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
