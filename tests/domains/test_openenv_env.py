"""OpenEnv environments under teamrl's environment contract: in-process (examples/hubs/openenv_guess.py) and
through OpenEnv's own server on loopback, each driven by a tiny random model through env_single; the rubric's
reward checked on known moves."""

from __future__ import annotations

import copy
import socket
import threading
import time

import pytest

pytest.importorskip("openenv", reason="the OpenEnv adapter needs openenv (pip install 'teamrl[openenv]')")

from teamrl.domains.environments.env_team import EnvSingleConfig  # noqa: E402
from teamrl.tasks.base import build_task  # noqa: E402
from teamrl.tasks.env import actions_text  # noqa: E402
from tests.tasks.test_catalogues import tiny_rollout  # noqa: E402

ENV_ID = "examples.hubs.openenv_guess:GuessEnvironment"


def solve(env, first: str) -> list[str]:
    """Binary search on the environment's hints."""
    lo, hi, moves = 1, 8, []
    while True:
        guess = (lo + hi) // 2
        moves.append(f"I guess {guess}")
        turn = env.step(moves[-1])
        if turn.done:
            assert turn.reward == 1.0
            return moves
        assert turn.reward == pytest.approx(-0.1) and turn.observation in ("Higher.", "Lower."), turn.info
        lo, hi = (guess + 1, hi) if turn.observation == "Higher." else (lo, guess - 1)


def test_in_process_environment_steps_and_scores():
    task = build_task("openenv", {"env_id": ENV_ID, "n_train": 4, "n_test": 2, "max_turns": 4})
    p = task.problems("train")[0]
    assert p.question == "I picked a whole number from 1 to 8. Guess it."
    env = task.make_env()
    env.reset(p)
    moves = solve(env, p.question)
    assert env.success and task.score(p, actions_text(moves)) == 1.0
    assert task.score(p, actions_text(["no number"])) == 0.0
    turn = task.make_env().step(None)
    assert turn.info["invalid"] and turn.reward == -1.0


def test_in_process_rollout_with_a_tiny_model(tokenizer):
    task = build_task("openenv", {"env_id": ENV_ID, "n_train": 3, "n_test": 2, "max_turns": 3})
    (ep,) = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner").collect(
        task.problems("train")[:1], 1, progress=False)
    assert ep.error is None and 1 <= len(ep.steps) <= 3 and len(ep.step_rewards) == len(ep.steps)
    assert set(ep.step_rewards.values()) <= {1.0, -0.1, 0.0, -1.0}  # the rubric's values, or an empty reply


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(env_cls, action_cls, observation_cls):
    """OpenEnv's own server for ``env_cls`` on a free loopback port, in a thread: yields its URL."""
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    port = _free_port()
    app = create_fastapi_app(env_cls, action_cls, observation_cls, max_concurrent_envs=8)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def server_url():
    from examples.hubs.openenv_guess import GuessAction, GuessEnvironment, GuessObservation

    yield from _serve(GuessEnvironment, GuessAction, GuessObservation)


def test_a_running_server_is_driven_over_its_client(server_url, tokenizer):
    task = build_task("openenv", {"url": server_url, "action_field": "message", "n_train": 3, "n_test": 2,
                                  "max_turns": 4})
    p = task.problems("train")[0]
    assert p.question == "I picked a whole number from 1 to 8. Guess it."
    env = task.make_env()
    env.reset(p)
    moves = solve(env, p.question)
    env.close()
    assert task.score(p, actions_text(moves)) == 1.0  # replayed on a fresh session with the same seed
    (ep,) = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner").collect([p], 1, progress=False)
    assert ep.error is None and 1 <= len(ep.steps) <= 4


def test_a_server_that_does_not_answer_is_one_line():
    url = f"http://127.0.0.1:{_free_port()}"
    task = build_task("openenv", {"url": url, "action_field": "message", "n_train": 1, "n_test": 1})
    with pytest.raises(ValueError, match=rf"^the OpenEnv server at {url} does not answer") as err:
        task.problems("train")
    assert "\n" not in str(err.value)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="exactly one of env_id"):
        build_task("openenv", {"n_train": 1})
    with pytest.raises(ValueError, match="set task.openenv.action_field"):
        build_task("openenv", {"url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match=r"^task.openenv.env_id 'no_such_mod_xyz:Env' does not import"):
        build_task("openenv", {"env_id": "no_such_mod_xyz:Env"})


TOOLS_ID = "examples.hubs.openenv_tools:AddEnvironment"


def call(name: str, **arguments) -> str:
    import json

    return f'Let me use a tool. <tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_an_mcp_environments_tools_are_offered_and_each_tool_call_is_a_step():
    task = build_task("openenv", {"env_id": TOOLS_ID, "n_train": 4, "n_test": 2, "max_turns": 3})
    p = task.problems("train")[0]
    env = task.make_env()
    assert env.mcp and env.action_cls is None  # an MCPEnvironment: tool calls only
    first = env.reset(p)
    a, b = env.env.pair
    assert first.startswith(f"What is {a} + {b}? Submit the answer with the submit tool.\n\n# Tools")
    assert '"name": "add"' in first and '"name": "submit"' in first and "<tool_call>" in first
    turn = env.step(call("add", a=a, b=b))  # the question and the tools again, then the result
    assert turn == type(turn)(f"{first}\n\n<tool_response>\n{a + b}\n</tool_response>", 0.0, False, {"message": ""})
    two = call("add", a=a, b=b) + call("add", a=1, b="x")  # a refused second call: invalid, the first one's result shown
    turn = env.step(two)
    assert turn.info["invalid"] and turn.observation == f"{first}\n\n<tool_response>\n{a + b}\n</tool_response>"
    copied = copy.deepcopy(env)  # built anew and replayed: the copy's tools act on the copy
    assert copied.env is not env.env and copied.replies == env.replies and copied.env.pair == env.env.pair
    assert copied.step(call("submit", answer=a + b)).done and env.env.answer is None and not env.success
    for bad, why in ((call("multiply", a=1, b=2), "tool 'multiply': "), (call("add", a="x"), "tool 'add': "),
                     ("<tool_call>{\"name\": \"add\", ", "<tool_call> is never closed"),
                     ("The answer is 3.", "no <tool_call> in the reply")):
        turn = env.step(bad)
        assert turn.info["invalid"] and turn.reward == -1.0 and why in turn.info["message"], (bad, turn.info)
        assert turn.observation == first  # the agent reads the question and the tools again
    turn = env.step(call("submit", answer=a + b))
    assert turn.done and turn.reward == 1.0 and env.success
    replies = [call("add", a=a, b=b), call("submit", answer=a + b)]
    assert task.score(p, actions_text(replies)) == 1.0  # replayed on a fresh instance
    assert task.score(p, actions_text([call("submit", answer=a + b + 1)])) == 0.0
    with pytest.raises(ValueError, match="cannot be read from its type parameters"):  # no action class to fill
        build_task("openenv", {"env_id": TOOLS_ID, "n_train": 1, "n_test": 1, "tools": "off"})
    with pytest.raises(ValueError, match="tools 'yes' must be auto, on or off"):
        build_task("openenv", {"env_id": TOOLS_ID, "tools": "yes"})
    with pytest.raises(ValueError, match="tools: on, but examples.hubs.openenv_guess:GuessEnvironment is not an "
                                         "MCPEnvironment"):
        build_task("openenv", {"env_id": ENV_ID, "tools": "on"})
    with pytest.raises(ValueError, match="takes tool calls only; unset action_field"):
        build_task("openenv", {"url": "http://127.0.0.1:1", "tools": "on", "action_field": "message"})


def test_an_mcp_environment_trains_a_step_of_a_tiny_model(tokenizer):
    task = build_task("openenv", {"env_id": TOOLS_ID, "n_train": 3, "n_test": 2, "max_turns": 2})
    (ep,) = tiny_rollout(tokenizer, "env_single", EnvSingleConfig(), task, "planner").collect(
        task.problems("train")[:1], 1, progress=False)
    assert ep.error is None and 1 <= len(ep.steps) <= 2 and len(ep.step_rewards) == len(ep.steps)
    assert set(ep.step_rewards.values()) <= {1.0, 0.0, -1.0}  # a right or wrong answer, a tool's result, invalid


@pytest.fixture(scope="module")
def tools_url():
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    from examples.hubs.openenv_tools import AddEnvironment

    yield from _serve(AddEnvironment, CallToolAction, CallToolObservation)


def test_an_mcp_server_is_driven_through_its_tool_client(tools_url):
    task = build_task("openenv", {"url": tools_url, "tools": "on", "n_train": 2, "n_test": 1, "max_turns": 3})
    p = task.problems("train")[0]
    env = task.make_env()
    first = env.reset(p)
    assert first.startswith("What is ") and '"name": "submit"' in first
    a, b = (int(x) for x in first.split("?")[0].removeprefix("What is ").split(" + "))
    assert env.step(call("add", a=a, b=b)).observation == f"{first}\n\n<tool_response>\n{a + b}\n</tool_response>"
    turn = env.step(call("submit", answer=a + b))
    env.close()
    assert turn.done and turn.reward == 1.0
    assert env.step("just text").info["message"] == "no <tool_call> in the reply"
