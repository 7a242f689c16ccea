"""An OpenEnv MCP environment written in OpenEnv's own API: add two numbers with a calculator's tools.

``AddEnvironment`` is an ``openenv.core.env_server.mcp_environment.MCPEnvironment`` whose FastMCP server has two
tools, ``add(a, b)`` and ``submit(answer)``. Each episode poses ``a + b`` for two numbers drawn from the seed; the
episode ends at the first ``submit``, with reward 1.0 when the answer is right and 0.0 when it is not. Calling
``add`` is allowed (it returns the sum) and earns nothing by itself: the reward is the answer's.

Under teamrl (``task.openenv.env_id: examples.hubs.openenv_tools:AddEnvironment``) the tools are listed to the agent
after the question, and each ``<tool_call>`` of a reply is a ``CallToolAction`` (docs/hubs.md). Behind OpenEnv's own
server: ``python examples/hubs/openenv_tools.py --port 8766`` serves it on 127.0.0.1, and ``task.openenv.url:
http://127.0.0.1:8766`` with ``task.openenv.tools: on`` drives that server.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State


class Question(Observation):
    question: str = ""


class AddEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, high: int = 20) -> None:
        self.high, self.pair, self.answer = high, (0, 0), None
        mcp = FastMCP("add")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two whole numbers."""
            return a + b

        @mcp.tool
        def submit(answer: int) -> str:
            """Give the final answer; ends the episode."""
            self.answer = answer
            return "Submitted."

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        rng = random.Random(seed)
        self.pair, self.answer = (rng.randint(0, self.high), rng.randint(0, self.high)), None
        self._state = State(episode_id=episode_id, step_count=0)
        a, b = self.pair
        return Question(question=f"What is {a} + {b}? Submit the answer with the submit tool.")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """OpenEnv's server steps through this one (MCPEnvironment routes tool calls in both)."""
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, obs: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit" and self.answer is not None:
            obs.done, obs.reward = True, float(self.answer == sum(self.pair))
        return obs

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": "call a tool: add or submit"})

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":  # OpenEnv's own server for this environment, on loopback
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.mcp_types import CallToolObservation

    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 8766
    app = create_fastapi_app(AddEnvironment, CallToolAction, CallToolObservation)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
